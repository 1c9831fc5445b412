"""What the gradient-boosted-trees runtimes (LightGBM, XGBoost) share: metadata, input
checks and the outputs a request can select.

A subclass loads its library's model, sets the fields below from it, implements the
three library calls (``_library_values``, ``_library_margin``, ``_contrib``, which also
answers ``explain``) and offers the model to inferpool's tree kernel
(``use_tree_kernel``), which then computes values and margins whenever it reproduces the
library.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import PICKLE_SUFFIXES, find_artefact, unpickle
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.explain import Attributions
from inferpool.runtimes.load_errors import check_type, reading
from inferpool.runtimes.mlserver_outputs import mlserver_flavour
from inferpool.runtimes.tabular import (
    features_matrix,
    labels_from_probabilities,
    two_class_probabilities,
)
from inferpool.runtimes.trees import compile_model, probe_rows
from inferpool.runtimes.trees.verify import RTOL


class BoostedTreesRuntime(Runtime):
    """A boosted-trees model: a classifier (with class labels) or a regressor."""

    #: the name of the untransformed-score output: LightGBM's ``raw_score``, XGBoost's ``margin``
    margin_output: ClassVar[str] = "margin"
    #: the V2 datatype of the features the library computes in, and of its scores
    float_datatype: ClassVar[str] = "FP64"

    # Set by the subclass when it loads a model.
    n_features: int
    feature_names: list[str]
    #: class labels of a classifier; None for a regressor
    classes: np.ndarray | None = None
    #: whether the library gives class probabilities (a classifier may give labels only)
    has_probabilities: bool = False
    #: whether the model is a bare Booster, whose own ``predict`` gives the scores (class
    #: probabilities), not the labels a scikit-learn wrapper's gives (KServe V1 answers it)
    bare_booster: bool = False
    #: columns of ``predict`` for a regressor with several targets (1: one value per row)
    n_targets: int = 1
    #: the tree kernel's compiled model (``values`` and ``margin``), or None: the library
    compiled: Any = None
    #: the output of a request that names none (``predict_fn`` of a pickled estimator)
    default_output: str = "predict"
    # The libraries' input checks raise these for input they refuse (a client's fault).
    input_errors = (ValueError, TypeError)
    rows_independent = True  # trees score each row alone: requests may be joined

    def load_shared_forms(
        self,
        flavour: str,
        successor: Callable[[Any], Runtime],
        artefact_names: Sequence[str],
        library: str,
        model_types: tuple[type, ...],
    ) -> Path | None:
        """Load the forms both libraries share: a folder of MLServer's runtime (served by
        ``successor``, MLServer's answers) or a pickled Booster or estimator (adopted).
        Otherwise the path of the library's own model file, for the subclass to read."""
        if mlserver_flavour(self.settings, flavour):
            self.successor = successor(self.settings)
            self.successor.load()
            return None
        path = find_artefact(self, artefact_names)
        if path.suffix not in PICKLE_SUFFIXES:
            return path
        with reading(path, library):
            model = unpickle(path)
            check_type(model, model_types, library)
        self.adopt(model)
        return None

    @abstractmethod
    def adopt(self, model: Any) -> None:
        """Serve an in-memory model of the library: a Booster or a scikit-learn-API
        estimator (raise TypeError for anything else)."""

    @abstractmethod
    def _library_values(self, matrix: np.ndarray) -> np.ndarray:
        """The library's plain prediction: class probabilities (P(class 1) of a binary
        model) if ``has_probabilities``, class indices of another classifier, values of a
        regressor."""

    @abstractmethod
    def _library_margin(self, matrix: np.ndarray) -> np.ndarray:
        """The library's untransformed scores (before the link function)."""

    @abstractmethod
    def _contrib(self, matrix: np.ndarray) -> np.ndarray:
        """Per-feature contributions plus the expected value (the last column), per row."""

    @abstractmethod
    def _contrib_shape(self) -> list[int]:
        """The shape of ``contrib`` in the library's own layout, -1 for the rows."""

    def use_tree_kernel(self, library: str, build: Callable[[], Any], rtol: float = RTOL) -> None:
        """Predict values and margins with ``build()``'s compiled model when it gives what
        the library gives on probe rows (``trees.compile_model``)."""
        self.compiled, self.predicted_by = compile_model(
            self.settings, library, build, self._kernel_checks, rtol
        )

    def _kernel_checks(self, compiled: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
        outputs = {
            "predict": (compiled.values, self._library_values),
            self.margin_output: (compiled.margin, self._library_margin),
        }
        probes = [probe_rows(compiled.forest), probe_rows(compiled.forest, np.float32)]
        return outputs, probes

    def _values(self, matrix: np.ndarray) -> np.ndarray:
        if self.compiled is not None:
            values: np.ndarray = self.compiled.values(matrix)
            return values
        return self._library_values(matrix)

    def _margin(self, matrix: np.ndarray) -> np.ndarray:
        if self.compiled is not None:
            margin: np.ndarray = self.compiled.margin(matrix)
            return margin
        return self._library_margin(matrix)

    @property
    def n_scores(self) -> int:
        """Scores per row: classes of a multi-class model, else 1 (binary, one target)."""
        if self.classes is not None and len(self.classes) > 2:
            return len(self.classes)
        return self.n_targets

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        parameters = {"feature_names": list(self.feature_names)}
        return [TensorSpec("input-0", self.float_datatype, [-1, self.n_features], parameters)]

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        score_shape = [-1] if self.n_scores == 1 else [-1, self.n_scores]
        specs = []
        if self.classes is not None:
            specs.append(TensorSpec("predict", datatype_of(self.classes), [-1]))
        else:
            specs.append(TensorSpec("predict", self.float_datatype, score_shape))
        if self.has_probabilities and self.classes is not None:
            specs.append(TensorSpec("predict_proba", self.float_datatype, [-1, len(self.classes)]))
        specs.append(TensorSpec(self.margin_output, self.float_datatype, score_shape))
        specs.append(TensorSpec("contrib", self.float_datatype, self._contrib_shape()))
        return specs

    def default_outputs(self) -> list[str]:
        return [self.default_output]

    def validate(self, payload: Any) -> None:
        # For an array this only reads its shape; a DataFrame is checked column by column.
        features_matrix(self.name, payload, self.feature_names)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        matrix = features_matrix(self.name, payload, self.feature_names)
        result: dict[str, Any] = {}
        probabilities = None
        # The class labels of a model with probabilities (which has labels), else None.
        classes = self.classes if self.has_probabilities else None
        for name in outputs:
            if name in ("predict", "predict_proba") and classes is not None:
                if probabilities is None:
                    probabilities = self._class_probabilities(matrix)
                result[name] = (
                    probabilities
                    if name == "predict_proba"
                    else labels_from_probabilities(probabilities, classes)
                )
            elif name == "predict":
                result[name] = self._predict_values(matrix)
            elif name == self.margin_output:
                result[name] = self._margin(matrix)
            elif name == "contrib":
                result[name] = self._contrib(matrix)
            else:
                # Only reachable through outputs declared in model-settings.json.
                computed = ", ".join(spec.name for spec in BoostedTreesRuntime.outputs(self))
                raise ValueError(f"{self.platform} computes {computed}, not {name!r}")
        return result

    def explain(self, payload: Any) -> Attributions:
        """The library's own contributions (LightGBM's ``pred_contrib``, XGBoost's
        ``pred_contribs``: TreeSHAP) of the raw score, per score column."""
        matrix = features_matrix(self.name, payload, self.feature_names)
        contributions = np.asarray(self._contrib(matrix), dtype=np.float64)
        values = contributions.reshape(matrix.shape[0], self.n_scores, self.n_features + 1)
        return Attributions.of(values, "raw_score", self.feature_names, self.classes)

    def _class_probabilities(self, matrix: np.ndarray) -> np.ndarray:
        probabilities = self._values(matrix)
        if probabilities.ndim == 1:
            return two_class_probabilities(probabilities)
        return probabilities

    def _predict_values(self, matrix: np.ndarray) -> np.ndarray:
        values = self._values(matrix)
        if self.classes is None:
            return values
        # A classifier without probabilities predicts class indices.
        return self.classes[values.astype(np.intp)]
