"""The steps a Pipeline may put before a linear model for the linear kernel
(``runtimes/linear.py``): StandardScaler, MinMaxScaler and OneHotEncoder, computed as
scikit-learn's ``transform`` computes them, in its order and dtypes. Anything else in a
pipeline raises ``Unsupported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inferpool.runtimes.trees.forest import Unsupported

# OneHotEncoder compares values with categories; the kernel compares them as float64,
# exact for integers up to 2**53.
EXACT_INTEGERS = 2.0**53


@dataclass(frozen=True)
class Standardise:
    """``StandardScaler.transform`` of dense rows: the mean subtracted, then the scale
    divided, each cast to the rows' dtype first (scikit-learn >= 1.8; older versions
    differ on float32 rows only, which the float32 probes then leave to scikit-learn)."""

    mean: np.ndarray | None
    scale: np.ndarray | None
    # Where the training rows lie, per feature: the kernel's probe rows are drawn there.
    center: np.ndarray
    spread: np.ndarray

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        if self.mean is not None:
            matrix -= self.mean.astype(matrix.dtype, copy=False)
        if self.scale is not None:
            matrix /= self.scale.astype(matrix.dtype, copy=False)
        return matrix


@dataclass(frozen=True)
class MinMax:
    """``MinMaxScaler.transform``: times the scale, plus the minimum, clipped if asked."""

    scale: np.ndarray
    minimum: np.ndarray
    clip: tuple[float, float] | None
    # Where the training rows lie, per feature: the kernel's probe rows are drawn there.
    center: np.ndarray
    spread: np.ndarray

    def __call__(self, matrix: np.ndarray) -> np.ndarray:
        matrix *= self.scale
        matrix += self.minimum
        if self.clip is not None:
            low, high = (matrix.dtype.type(bound) for bound in self.clip)
            np.clip(matrix, low, high, out=matrix)
        return matrix


def scaler(step: Any, position: int) -> Standardise | MinMax:
    """A scaler step (``position`` in the chain, for the message) or ``Unsupported``."""
    if is_sklearn(step, ("StandardScaler",)):
        mean = step.mean_ if step.with_mean else None
        scale = step.scale_ if step.with_std else None
        center = np.asarray(step.mean_ if step.mean_ is not None else 0.0, dtype=np.float64)
        spread = np.asarray(scale if scale is not None else 1.0, dtype=np.float64)
        return Standardise(mean, scale, center, spread)
    if is_sklearn(step, ("MinMaxScaler",)):
        low, high = (float(bound) for bound in step.feature_range)
        return MinMax(
            step.scale_,
            step.min_,
            (low, high) if step.clip else None,
            np.asarray(step.data_min_ + step.data_range_ / 2, dtype=np.float64),
            np.asarray(np.where(step.data_range_ > 0, step.data_range_ / 2, 1.0)),
        )
    raise Unsupported(f"{type(step).__name__} in the pipeline (step {position + 1})")


@dataclass(frozen=True)
class OneHot:
    """``OneHotEncoder.transform``: numeric categories, nothing dropped, no infrequent
    categories."""

    categories: list[np.ndarray]
    offsets: np.ndarray
    width: int
    ignore: bool  # handle_unknown="ignore": an unknown value encodes as zeros
    sparse: bool
    dtype: np.dtype

    @classmethod
    def of(cls, encoder: Any) -> OneHot:
        """The encoder's categories, or ``Unsupported`` saying what is not reproduced."""
        if encoder.handle_unknown not in ("error", "ignore"):
            raise Unsupported(f"OneHotEncoder(handle_unknown={encoder.handle_unknown!r})")
        if getattr(encoder, "drop_idx_", None) is not None:
            raise Unsupported("OneHotEncoder with dropped categories")
        if getattr(encoder, "_infrequent_enabled", False):
            raise Unsupported("OneHotEncoder with infrequent categories")
        categories = []
        for values in encoder.categories_:
            if values.dtype.kind not in "iuf":
                raise Unsupported(f"OneHotEncoder with {values.dtype} categories")
            as_float = values.astype(np.float64)
            if not np.all(np.abs(as_float) < EXACT_INTEGERS):  # NaN or beyond 2**53
                raise Unsupported("OneHotEncoder with NaN or very large categories")
            categories.append(as_float)
        sizes = [len(values) for values in categories]
        offsets = np.cumsum([0, *sizes[:-1]]).astype(np.intp)
        sparse = bool(getattr(encoder, "sparse_output", True))
        return cls(
            categories,
            offsets,
            int(sum(sizes)),
            encoder.handle_unknown == "ignore",
            sparse,
            np.dtype(encoder.dtype),
        )

    def encode(self, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Each value's column in the encoded matrix and whether it is a known category;
        None for an unknown category the encoder refuses (scikit-learn raises then)."""
        columns = np.empty(matrix.shape, dtype=np.intp)
        known = np.empty(matrix.shape, dtype=bool)
        for j, values in enumerate(self.categories):
            at = np.minimum(np.searchsorted(values, matrix[:, j]), len(values) - 1)
            known[:, j] = values[at] == matrix[:, j]
            columns[:, j] = at + self.offsets[j]
        if not self.ignore and not known.all():
            return None
        return columns, known

    def dense(self, columns: np.ndarray, known: np.ndarray) -> np.ndarray:
        """The encoded rows as ``sparse_output=False`` gives them."""
        encoded = np.zeros((columns.shape[0], self.width), dtype=self.dtype)
        rows, features = np.nonzero(known)
        encoded[rows, columns[rows, features]] = 1
        return encoded

    def product(self, columns: np.ndarray, known: np.ndarray, coef_t: np.ndarray) -> np.ndarray:
        """The encoded rows (sparse) times ``coef_t``, added as scipy's CSR product adds:
        each row's ones column by column, in the encoded order (feature by feature), to
        zeros. Adding +0.0 for an unknown value changes nothing, as a sum started at +0.0
        is never -0.0."""
        total = np.zeros((columns.shape[0], *coef_t.shape[1:]))
        for j in range(columns.shape[1]):
            picked = coef_t[columns[:, j]]
            if self.ignore:
                mask = known[:, j] if coef_t.ndim == 1 else known[:, j, np.newaxis]
                picked = np.where(mask, picked, 0.0)
            total += picked
        return total

    def probe_rows(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Rows of known categories; with ``ignore``, some values of none."""
        rows = np.column_stack([rng.choice(values, size=n) for values in self.categories])
        if self.ignore:
            unknown = [[values.min() - 1, values.max() + 1] for values in self.categories]
            mask = rng.random(rows.shape) < 0.1
            for j, candidates in enumerate(unknown):
                rows[mask[:, j], j] = rng.choice(candidates, size=int(mask[:, j].sum()))
        return rows


def chain(model: Any) -> list[Any]:
    """The estimators ``model`` applies in order: nested pipelines flattened, steps
    "passthrough" (or None) left out."""
    if not is_sklearn(model, ("Pipeline",)):
        return [model]
    steps: list[Any] = []
    for _, step in model.steps:
        if step is None or isinstance(step, str):
            continue
        steps.extend(chain(step))
    return steps


def is_sklearn(model: Any, names: tuple[str, ...]) -> bool:
    """Whether ``model`` is one of scikit-learn's ``names``: the class itself, not a
    subclass, which may predict otherwise."""
    kind = type(model)
    return kind.__module__.split(".")[0] == "sklearn" and kind.__name__ in names
