"""The linear kernel: scikit-learn's linear models, alone or at the end of a Pipeline of
scalers or of a one-hot encoder, predicted in plain numpy.

For a small request scikit-learn spends most of its time checking its input and its
parameters; the prediction itself is a matrix product, a link function and an argmax.
``CompiledLinear`` takes the fitted parameters and repeats scikit-learn's own operations,
in its order and its dtypes, so that its outputs are scikit-learn's to the bit on the
probe rows the runtime verifies at load (``kernel_checks``, through
``trees.compile_model``, which leaves the model to scikit-learn on any difference).
Whatever it does not reproduce raises ``Unsupported`` with the reason.

The runtime (``runtimes/sklearn.py``) has already checked the payload's shape and values
where scikit-learn would have. Rows the kernel does not take (not numeric, NaN or
infinity, a category the encoder refuses) are left to scikit-learn, which predicts them
or says what is wrong with them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from inferpool.runtimes.linear_steps import MinMax, OneHot, Standardise, chain, is_sklearn, scaler
from inferpool.runtimes.tabular import NUMERIC_KINDS, is_dataframe
from inferpool.runtimes.trees.choose import Outputs
from inferpool.runtimes.trees.forest import Unsupported
from inferpool.runtimes.trees.verify import verify

CLASSIFIERS = ("LogisticRegression", "SGDClassifier", "LinearSVC", "RidgeClassifier")
REGRESSORS = ("LinearRegression", "Ridge", "Lasso", "ElasticNet", "SGDRegressor", "LinearSVR")
PROBE_ROWS = 256

Method = Callable[[np.ndarray], np.ndarray]


def is_linear(model: Any) -> bool:
    """Whether ``model`` is one of the linear models the kernel takes, or a Pipeline that
    ends with one (its earlier steps then decide: ``CompiledLinear`` says why not)."""
    steps = chain(model)
    return bool(steps) and is_sklearn(steps[-1], CLASSIFIERS + REGRESSORS)


class CompiledLinear:
    """The estimator methods of a fitted linear model (or pipeline) in numpy.

    ``rows`` turns a payload into the decision scores every method derives from; each
    method of ``methods()`` takes those scores, so a request for several outputs computes
    the product once.
    """

    def __init__(self, model: Any) -> None:
        steps = chain(model)
        if not steps or not is_sklearn(steps[-1], CLASSIFIERS + REGRESSORS):
            raise Unsupported(f"{type(model).__name__} is not a linear model the kernel takes")
        estimator = steps[-1]
        self.name = " + ".join(type(step).__name__ for step in steps)
        n_features = getattr(model, "n_features_in_", None)
        if n_features is None:
            raise Unsupported(f"{type(model).__name__} has no n_features_in_")
        self.n_features = int(n_features)
        self.one_hot: OneHot | None = None
        self.scalers: list[Standardise | MinMax] = []
        for position, step in enumerate(steps[:-1]):
            if is_sklearn(step, ("OneHotEncoder",)):
                if len(steps) != 2:
                    raise Unsupported("a OneHotEncoder beside other transformers")
                self.one_hot = OneHot.of(step)
            else:
                self.scalers.append(scaler(step, position))
        #: float32 rows are computed here (``kernel_checks`` clears it when scikit-learn's
        #: float32 arithmetic differs)
        self.float32 = True
        self._read_coefficients(estimator)
        from scipy.special import expit  # scikit-learn's own sigmoid

        self._expit = expit
        self.classes: np.ndarray | None = None
        self._probabilities: Method | None = None
        if is_sklearn(estimator, CLASSIFIERS):
            self._read_classifier(estimator)
        # SGDRegressor returns ``scores.ravel()``, whatever the shape of its coefficients.
        self._ravel = is_sklearn(estimator, ("SGDRegressor",))

    def _read_coefficients(self, estimator: Any) -> None:
        coef, intercept = estimator.coef_, estimator.intercept_
        if not isinstance(coef, np.ndarray):
            raise Unsupported("sparse coefficients")
        # A model fitted on float32 rows keeps float32 coefficients: its products follow
        # numpy's promotion (float32 rows in float32, float64 rows in float64), as
        # scikit-learn's do, since the kernel multiplies the rows as they come.
        floats = (np.float32, np.float64)
        if coef.dtype not in floats or np.asarray(intercept).dtype not in floats:
            raise Unsupported(f"{coef.dtype} coefficients")
        width = self.one_hot.width if self.one_hot is not None else self.n_features
        if coef.ndim not in (1, 2) or coef.shape[-1] != width:
            raise Unsupported(f"coefficients of shape {coef.shape} for {width} features")
        # The model's own arrays, in their own layout: scikit-learn multiplies by
        # ``coef_.T``, and BLAS adds in an order that depends on the layout.
        self.coef_t: np.ndarray = coef.T
        self.intercept = intercept

    def _read_classifier(self, estimator: Any) -> None:
        binarizer = getattr(estimator, "_label_binarizer", None)  # RidgeClassifier's
        if binarizer is not None and str(binarizer.y_type_).startswith("multilabel"):
            raise Unsupported("a multilabel RidgeClassifier")
        classes = estimator.classes_
        if not isinstance(classes, np.ndarray) or len(classes) < 2:
            raise Unsupported("a classifier without two or more classes")
        self.classes = classes
        if is_sklearn(estimator, ("LogisticRegression",)):
            self._probabilities = _logistic_link(self, estimator)
        elif is_sklearn(estimator, ("SGDClassifier",)):
            if estimator.loss == "log_loss":
                self._probabilities = self._one_vs_rest
            elif estimator.loss == "modified_huber":
                self._probabilities = _modified_huber

    def describe(self) -> str:
        """What the kernel computes, for the load log."""
        parts = [self.name, f"{self.n_features} features"]
        if self.classes is not None:
            parts.append(f"{len(self.classes)} classes")
        elif self.coef_t.ndim == 2:
            parts.append(f"{self.coef_t.shape[1]} targets")
        if not self.float32:
            parts.append("float32 rows by scikit-learn")
        return ", ".join(parts)

    def methods(self) -> dict[str, Method]:
        """The estimator methods the kernel computes, by name, each from ``rows``'s scores."""
        if self.classes is None:
            return {"predict": _identity}
        methods: dict[str, Method] = {"predict": self.predict, "decision_function": _identity}
        if self._probabilities is not None:
            methods["predict_proba"] = self._probabilities
        return methods

    def rows(self, payload: Any) -> np.ndarray | None:
        """The payload's decision scores, or None to leave the payload to scikit-learn."""
        matrix = self._matrix(payload)
        if matrix is None:
            return None
        if self.one_hot is not None:
            codes = self.one_hot.encode(matrix)
            if codes is None:
                return None
            if not self.one_hot.sparse:
                return self.scores(self.one_hot.dense(*codes))
            return self.finish(self.one_hot.product(*codes, self.coef_t) + self.intercept)
        for step in self.scalers:
            matrix = step(matrix)
        return self.scores(matrix)

    def scores(self, matrix: np.ndarray) -> np.ndarray:
        """``LinearModel._decision_function`` / ``LinearClassifierMixin.decision_function``."""
        return self.finish(matrix @ self.coef_t + self.intercept)

    def finish(self, scores: np.ndarray) -> np.ndarray:
        """Scores shaped as the estimator returns them: one column of a classifier as 1-D."""
        if self.classes is not None and scores.ndim == 2 and scores.shape[1] == 1:
            return scores.reshape(-1)
        return scores.ravel() if self._ravel else scores

    def _matrix(self, payload: Any) -> np.ndarray | None:
        if is_dataframe(payload):
            dtypes = list(payload.dtypes)
            if not all(isinstance(d, np.dtype) and d.kind in NUMERIC_KINDS for d in dtypes):
                return None
            payload = payload.to_numpy()
        if not isinstance(payload, np.ndarray) or payload.dtype.kind not in NUMERIC_KINDS:
            return None
        if payload.ndim != 2 or payload.shape[1] != self.n_features:
            return None
        dtype = payload.dtype
        if dtype.kind == "f":
            if dtype != np.float64 and not (dtype == np.float32 and self.float32):
                return None  # float16, or float32 that scikit-learn computes otherwise
            if not np.isfinite(payload).all():
                return None
        if self.scalers:
            # The scalers work in place, as scikit-learn's do on their copy; they scale
            # float32 rows in float32, as scikit-learn does, and anything else in float64.
            work = np.float32 if dtype == np.float32 else np.float64
            return payload.astype(work)
        # Rows of floats are multiplied as they are (numpy casts float32 rows up for float64
        # coefficients, as in scikit-learn's own product); integers become float64 rows,
        # as scikit-learn's input check makes them.
        return payload if dtype.kind == "f" else payload.astype(np.float64)

    def predict(self, scores: np.ndarray) -> np.ndarray:
        """``LinearClassifierMixin.predict``: the second class where the score is above 0,
        else the class of the highest score (the first one on a tie)."""
        assert self.classes is not None
        indices = (scores > 0).astype(np.intp) if scores.ndim == 1 else np.argmax(scores, axis=1)
        labels: np.ndarray = self.classes.take(indices, axis=0)
        return labels

    def _one_vs_rest(self, scores: np.ndarray) -> np.ndarray:
        """``LinearClassifierMixin._predict_proba_lr``: each class's sigmoid, normalised."""
        prob: np.ndarray = self._expit(scores)
        if prob.ndim == 1:
            return np.stack([1 - prob, prob], axis=1)
        # Every sigmoid underflowed: uniform, as recent scikit-learn answers; older ones
        # divide 0 by 0 (NaN), and the kernel answers as the installed one does.
        return _normalised(prob, uniform_if_zero=library_fills_underflow())


@functools.cache
def library_fills_underflow() -> bool:
    """Whether the installed scikit-learn's one-vs-rest probabilities are uniform where
    every class's sigmoid underflows to 0 (newer versions) rather than NaN (older ones):
    asked of scikit-learn itself, once."""
    try:
        from sklearn.linear_model._base import LinearClassifierMixin

        class Underflowing(LinearClassifierMixin):  # type: ignore[misc]  # untyped
            def decision_function(self, X: Any) -> np.ndarray:
                return np.full((1, 2), -1e4)

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            probabilities = Underflowing()._predict_proba_lr(None)
    except Exception:  # a private helper: if it moved, assume the newer behaviour
        return True
    return not bool(np.isnan(probabilities).any())


def _identity(scores: np.ndarray) -> np.ndarray:
    return scores


def _softmax(scores: np.ndarray) -> np.ndarray:
    """``sklearn.utils.extmath.softmax``, of ``[-d, d]`` for a binary model's 1-D ``d``
    (scikit-learn < 1.8 with ``multi_class="multinomial"``)."""
    work: np.ndarray = np.c_[-scores, scores] if scores.ndim == 1 else scores.copy()
    work -= np.max(work, axis=1).reshape((-1, 1))
    np.exp(work, out=work)
    work /= np.sum(work, axis=1).reshape((-1, 1))
    return work


def _modified_huber(scores: np.ndarray) -> np.ndarray:
    """``SGDClassifier.predict_proba`` for ``loss="modified_huber"``."""
    prob: np.ndarray = (np.clip(scores, -1, 1) + 1.0) / 2.0
    if scores.ndim == 1:
        both = np.ones((scores.shape[0], 2))
        both[:, 1] = prob
        both[:, 0] -= prob
        return both
    return _normalised(prob, uniform_if_zero=True)


def _normalised(prob: np.ndarray, uniform_if_zero: bool) -> np.ndarray:
    """Each row of ``prob`` divided by its sum, in place, as scikit-learn normalises
    one-vs-rest scores; a row summing to 0 becomes uniform if ``uniform_if_zero``, else
    0 / 0 (NaN)."""
    prob_sum = prob.sum(axis=1)
    all_zero = prob_sum == 0
    if uniform_if_zero and np.any(all_zero):
        prob[all_zero, :] = 1
        prob_sum[all_zero] = prob.shape[1]
    with np.errstate(invalid="ignore"):
        prob /= prob_sum.reshape((prob.shape[0], -1))
    return prob


def _logistic_link(compiled: CompiledLinear, model: Any) -> Method:
    """LogisticRegression's ``predict_proba`` in the installed scikit-learn.

    From 1.8 on, two classes take the sigmoid and more the softmax. Before, the
    ``multi_class`` parameter also chose: "ovr" (or "auto" with liblinear) normalises
    one-vs-rest sigmoids, "multinomial" takes the softmax, of [-d, d] for two classes.
    A model pickled by an older version follows the installed version's rule.
    """
    n_classes = len(model.classes_)
    if "multi_class" not in type(model)._get_param_names():
        return compiled._one_vs_rest if n_classes <= 2 else _softmax
    multi_class = getattr(model, "multi_class", "auto")
    if multi_class in ("ovr", "warn") or (
        multi_class in ("auto", "deprecated")
        and (n_classes <= 2 or getattr(model, "solver", "") == "liblinear")
    ):
        return compiled._one_vs_rest
    return _softmax


def probe_rows(compiled: CompiledLinear, seed: int = 0) -> np.ndarray:
    """Float64 rows that exercise the kernel: around the first scaler's training range,
    far beyond it (saturated probabilities, clipped min-max features), tiny, and zeros."""
    rng = np.random.default_rng(seed)
    if compiled.one_hot is not None:
        return compiled.one_hot.probe_rows(rng, PROBE_ROWS)
    first = compiled.scalers[0] if compiled.scalers else None
    center = first.center if first is not None else np.zeros(compiled.n_features)
    spread = first.spread if first is not None else np.ones(compiled.n_features)
    rows = center + spread * rng.normal(scale=1.5, size=(PROBE_ROWS, compiled.n_features))
    block = PROBE_ROWS // 8
    rows[:block] = center + spread * rng.normal(scale=1e4, size=(block, compiled.n_features))
    rows[block : 2 * block] = rng.normal(scale=1e-30, size=(block, compiled.n_features))
    rows[rng.random(rows.shape) < 0.05] = 0.0
    rows[-1] = 0.0
    return rows


def kernel_checks(
    compiled: CompiledLinear, model: Any, frame: Callable[[np.ndarray], Any] | None = None
) -> tuple[Outputs, list[Any]]:
    """The outputs and probe payloads ``trees.compile_model`` verifies (``frame`` turns
    rows into the payload a model fitted on a DataFrame receives).

    Float32 rows are verified here, apart: a difference there leaves float32 payloads
    (gRPC FP32 tensors) to scikit-learn rather than the whole model, since scikit-learn
    scales them in float32 and has changed how it casts its parameters for that.
    """
    as_payload = frame if frame is not None else _identity
    outputs: Outputs = {
        name: (_through(compiled, method), getattr(model, name))
        for name, method in compiled.methods().items()
    }
    rows = probe_rows(compiled)
    probes = [as_payload(rows)]
    if np.array_equal(rows, np.rint(rows)):  # integer categories
        probes.append(as_payload(rows.astype(np.int64)))
    elif compiled.one_hot is None:
        probes.append(as_payload(np.rint(np.clip(rows, -1e15, 1e15)).astype(np.int64)))
    for payload in probes:
        if compiled.rows(payload) is None:
            raise Unsupported("the kernel declines its own probe rows")
    _check_dtypes(outputs, probes[0])
    single = as_payload(rows.astype(np.float32))
    try:
        if compiled.rows(single) is None:
            raise Unsupported("float32 rows declined")
        verify(outputs, [single])
    except Unsupported:
        compiled.float32 = False
    return outputs, probes


def _through(compiled: CompiledLinear, method: Method) -> Callable[[Any], np.ndarray]:
    def predict(payload: Any) -> np.ndarray:
        scores = compiled.rows(payload)
        if scores is None:
            raise Unsupported("the kernel declines a probe payload")
        return method(scores)

    return predict


def _check_dtypes(outputs: Outputs, payload: Any) -> None:
    """``verify`` compares values; the kernel's outputs must have scikit-learn's dtypes too
    (a label's dtype is its datatype on the wire)."""
    for name, (ours, theirs) in outputs.items():
        mine, library = np.asarray(ours(payload)).dtype, np.asarray(theirs(payload)).dtype
        if mine != library:
            raise Unsupported(f"{name}: dtype {mine}, scikit-learn's {library}")
