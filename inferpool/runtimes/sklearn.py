"""The scikit-learn runtime: any estimator or pipeline saved with joblib or pickle.

An estimator fitted on a DataFrame (``feature_names_in_``) gets its rows as a DataFrame
with those columns, from one input per feature or one 2-D input. A pickled LightGBM or
XGBoost model is handed to that library's runtime, which offers more outputs. Random
forests and gradient boosting are predicted by the tree kernel (``trees/``), linear
models, alone or after scalers or a one-hot encoder, by the linear kernel (``linear.py``):
each verified against scikit-learn at load, which predicts whatever the kernel does not
reproduce. ``explain`` (``sklearn_explain.py``) answers the contributions of those tree
models and decision trees, and of the linear models the linear kernel takes.

``parameters.extra.predict_fn`` names the method that answers a request which names no
output (MLServer's setting); an unknown value fails the model at load. Settings naming
``mlserver_sklearn.SKLearnModel`` get MLServer's runtime (``MLServerSKLearnRuntime``):
its artefact names, its outputs (``predict``, ``predict_proba``, ``transform``) and its
encoding (one value per row as ``[N, 1]``), with any pickled estimator served as one.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import find_artefact, library_of, unpickle
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.boosted import BoostedTreesRuntime
from inferpool.runtimes.explain import Attributions
from inferpool.runtimes.linear import CompiledLinear, is_linear, kernel_checks
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.mlserver_outputs import (
    as_output,
    find_mlserver_artefact,
    frame_outputs,
    mlserver_flavour,
)
from inferpool.runtimes.tabular import (
    check_finite,
    check_matrix,
    check_rows,
    columns_in_order,
    is_dataframe,
)
from inferpool.runtimes.trees import compile_model
from inferpool.runtimes.trees.choose import Outputs
from inferpool.runtimes.trees.sklearn_models import (
    CompiledSKLearn,
    compile_sklearn,
    is_tree_model,
)
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.runtimes.sklearn_explain import SKLearnExplainer

LIBRARY = "scikit-learn"  # as load errors name it
ARTEFACT_NAMES = ("model.joblib", "model.pkl", "model.pickle")
# Estimator methods served as outputs, in the order they are offered.
METHODS = ("predict", "predict_proba", "decision_function", "transform")
# The outputs MLServer's runtime accepts by name.
MLSERVER_METHODS = ("predict", "predict_proba", "transform")
PREDICT_FN = "predict_fn"


# Packages a pickled model may need, and the inferpool extra that installs each.
EXTRAS = {"sklearn": "sklearn", "lightgbm": "lightgbm", "xgboost": "xgboost"}


class SKLearnRuntime(Runtime):
    platform = "sklearn"
    # scikit-learn's input checks raise these for input it refuses (a client's fault).
    input_errors = (ValueError, TypeError)
    rows_independent = True  # a fitted estimator predicts each row alone
    #: the model's explainer, built by its first explanation (``explain``)
    explainer: SKLearnExplainer | None = None

    def load(self) -> None:
        if mlserver_flavour(self.settings, "sklearn"):
            self.successor: Runtime = MLServerSKLearnRuntime(self.settings)
            self.successor.load()
            return
        path = find_artefact(self, ARTEFACT_NAMES)
        self.model = _unpickle(path)
        library = library_of(self.model)
        if library is not None:
            self._hand_over(library)
            return
        _check_estimator(self.model, path)
        self._serve([m for m in METHODS if hasattr(self.model, m)])

    def _serve(self, methods: list[str]) -> None:
        """Serve ``self.model`` with ``methods`` as its outputs."""
        self.methods = methods
        offered = [m for m in METHODS if hasattr(self.model, m)]
        default = "predict" if "predict" in methods else methods[0]
        self.default_output = _predict_fn(self.settings, self.model, offered, default)
        self.n_features = getattr(self.model, "n_features_in_", None)
        self.allow_nan = _allows_nan(self.model)
        names = getattr(self.model, "feature_names_in_", None)
        self.feature_names = [str(n) for n in names] if names is not None else None
        if self.feature_names is not None:
            self.accepts = "dataframe"
        #: the tree or the linear kernel's compiled model, or None: scikit-learn predicts
        self.compiled: CompiledSKLearn | CompiledLinear | None = None
        #: the methods the kernel computes, by name, each from ``compiled.rows(payload)``
        #: (none unless compiled)
        self.kernel_methods: dict[str, Any] = {}
        if is_tree_model(self.model):
            # Random forests, extra-trees and gradient boosting: inferpool's tree kernel
            # where it reproduces scikit-learn (trees/sklearn_models.py).
            # Unpacked apart: as an unpacking target, mypy would read ``compiled`` as optional.
            chosen = compile_model(self.settings, "scikit-learn", self._compile, self._checks)
            compiled, self.predicted_by = chosen
            if compiled is not None:
                self.compiled = compiled
                self.kernel_methods = compiled.methods()
        elif is_linear(self.model):
            # Linear models, alone or after scalers or a one-hot encoder: inferpool's
            # linear kernel, where it reproduces scikit-learn (linear.py). A small request
            # costs it a few microseconds, scikit-learn's own checks tens to hundreds.
            chosen_linear = compile_model(
                self.settings,
                "scikit-learn",
                self._compile_linear,
                self._linear_checks,
                kernel="linear kernel",
            )
            linear, self.predicted_by = chosen_linear
            if linear is not None:
                self.compiled = linear
                self.kernel_methods = linear.methods()

    def _compile_linear(self) -> CompiledLinear:
        return CompiledLinear(self.model)

    def _linear_checks(self, compiled: CompiledLinear) -> tuple[Outputs, list[Any]]:
        names = self.feature_names
        frame = (lambda rows: self._frame(rows, names)) if names is not None else None
        return kernel_checks(compiled, self.model, frame)

    def _compile(self) -> CompiledSKLearn:
        return compile_sklearn(self.model)

    def _checks(self, compiled: CompiledSKLearn) -> tuple[Outputs, list[np.ndarray]]:
        def through_rows(method: Any) -> Any:
            return lambda payload: method(compiled.rows(payload))

        outputs = {
            name: (through_rows(method), getattr(self.model, name))
            for name, method in compiled.methods().items()
        }
        probes = compiled.probes()
        if self.feature_names is not None:
            probes = [self._frame(rows, self.feature_names) for rows in probes]
        return outputs, probes

    def _hand_over(self, library: str) -> None:
        """Hand the unpickled model to the LightGBM or XGBoost runtime, which serves it.

        That runtime then is the model's runtime (outputs ``raw_score``/``margin`` and
        ``contrib``, thread limits, metadata), with no second copy of the model.
        """
        successor: BoostedTreesRuntime
        if library == "lightgbm":
            from inferpool.runtimes.lightgbm import LightGBMRuntime

            successor = LightGBMRuntime(self.settings)
        else:
            from inferpool.runtimes.xgboost import XGBoostRuntime

            successor = XGBoostRuntime(self.settings)
        successor.adopt(self.model)
        offered = [spec.name for spec in successor.outputs()]
        successor.default_output = _predict_fn(self.settings, self.model, offered, "predict")
        del self.model
        self.successor = successor

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        if self.feature_names is not None:
            return [TensorSpec(name, "FP64", [-1, 1]) for name in self.feature_names]
        return [TensorSpec("input-0", "FP64", [-1, self.n_features or -1])]

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        return [self._output_spec(method) for method in self.methods]

    def _output_spec(self, method: str) -> TensorSpec:
        classes = getattr(self.model, "classes_", None)
        n_classes = len(classes) if isinstance(classes, np.ndarray) else -1
        if method == "predict":
            datatype = datatype_of(classes) if isinstance(classes, np.ndarray) else "FP64"
            return TensorSpec("predict", datatype, [-1])
        if method == "predict_proba":
            return TensorSpec("predict_proba", "FP64", [-1, n_classes])
        if method == "decision_function":
            shape = [-1] if n_classes == 2 else [-1, n_classes]
            return TensorSpec("decision_function", "FP64", shape)
        return TensorSpec(method, "FP64", [-1, -1])

    def default_outputs(self) -> list[str]:
        return [self.default_output]

    def validate(self, payload: Any) -> None:
        if is_dataframe(payload):
            if self.feature_names is not None:
                columns_in_order(self.name, payload, self.feature_names)
            check_rows(self.name, len(payload))
        elif self.n_features is not None:
            array = check_matrix(self.name, payload, self.n_features, numeric=False)
            if self.allow_nan is not None:
                check_finite(self.name, array, self.allow_nan)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        if self.feature_names is not None:
            payload = self._frame(payload, self.feature_names)
        rows = self.compiled.rows(payload) if self.compiled is not None else None
        if rows is None:
            return {name: getattr(self.model, name)(payload) for name in outputs}
        methods = self.kernel_methods
        return {
            name: methods[name](rows) if name in methods else getattr(self.model, name)(payload)
            for name in outputs
        }

    def explain(self, payload: Any) -> Attributions:
        if self.feature_names is not None:
            payload = self._frame(payload, self.feature_names)
        # Built on the first explanation: a model never explained pays nothing for it.
        if self.explainer is None:
            from inferpool.runtimes.sklearn_explain import SKLearnExplainer

            names = self.feature_names or _input_names(self.inputs(), self.n_features)
            self.explainer = SKLearnExplainer(self.model, self.compiled, names)
        return self.explainer.explain(payload)

    def _frame(self, payload: Any, feature_names: list[str]) -> Any:
        """The payload as a DataFrame with the fitted columns, in the fitted order."""
        if is_dataframe(payload):
            return columns_in_order(self.name, payload, feature_names)
        import pandas as pd  # a model fitted on a DataFrame has pandas at hand

        return pd.DataFrame(payload, columns=feature_names)


class MLServerSKLearnRuntime(SKLearnRuntime):
    """MLServer's scikit-learn runtime: any pickled estimator (LightGBM's and XGBoost's
    scikit-learn estimators too), its ``predict``, ``predict_proba`` and ``transform``."""

    def load(self) -> None:
        path = find_mlserver_artefact(self.settings, "sklearn")
        self.model = _unpickle(path)
        _check_estimator(self.model, path)
        methods = [m for m in MLSERVER_METHODS if hasattr(self.model, m)]
        self._serve(methods)

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        # One value per row is sent as [N, 1] (``as_output``).
        return [
            TensorSpec(spec.name, spec.datatype, [-1, 1]) if len(spec.shape) == 1 else spec
            for spec in super().outputs()
        ]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        result: dict[str, Any] = {}
        for name, value in super().predict(payload, outputs).items():
            if not is_dataframe(value):
                result[name] = as_output(value)
            elif len(outputs) > 1:
                raise BadRequest(
                    f"{name} returned columnar data of type {type(value)} and "
                    f"{list(outputs)} were requested. Cannot encode multiple columnar "
                    "data responses into one response."
                )
            else:  # a transform's DataFrame (set_output): one output per column
                return frame_outputs(value)
        return result


def _input_names(inputs: list[TensorSpec], n_features: int | None) -> list[str] | None:
    """The feature names the model's declared inputs give: one name per feature (an input
    per column), or a 2-D input's ``parameters.feature_names``; else None."""
    if n_features is None:
        return None
    if len(inputs) == n_features and n_features > 1:
        return [spec.name for spec in inputs]
    if len(inputs) == 1:
        names = inputs[0].parameters.get("feature_names")
        if isinstance(names, list) and len(names) == n_features:
            return [str(name) for name in names]
    return None


def _unpickle(path: Path) -> Any:
    """The pickled model; a missing library says which inferpool extra installs it, any
    other error is said in one sentence (``load_errors``)."""
    with reading(path, LIBRARY):
        try:
            return unpickle(path)
        except ModuleNotFoundError as exc:
            package = (exc.name or "").partition(".")[0]
            if not package or _installed(package):
                raise  # a module of an installed package: another version wrote the file
            extra = EXTRAS.get(package)
            fix = f"install inferpool[{extra}]" if extra else f"install {package}"
            raise ModelLoadError(
                f"{path.name} is not a model this server can load with {LIBRARY} (it needs "
                f"{package}: {fix})"
            ) from None


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _check_estimator(model: Any, path: Path) -> None:
    """A pickle of something that is no estimator (a dict, an array) under the right name."""
    if not hasattr(model, "predict") and not hasattr(model, "transform"):
        raise ModelLoadError(
            f"{path.name} is not a valid {LIBRARY} model (it holds a {type(model).__name__}, "
            "which has neither predict nor transform)"
        )


def _predict_fn(settings: ModelSettings, model: Any, offered: list[str], default: str) -> str:
    """The output a request without outputs gets: ``parameters.extra.predict_fn``, which
    must name a method inferpool serves and ``offered`` holds, else ``default``."""
    value = settings.parameters.extra.get(PREDICT_FN)
    if value is None:
        return default
    if value not in METHODS:
        raise ModelLoadError(
            f"parameters.extra.predict_fn {value!r} is not supported: use one of "
            f"{', '.join(METHODS)}"
        )
    if value not in offered:
        raise ModelLoadError(
            f"parameters.extra.predict_fn {value!r}: {type(model).__name__} has no {value}"
        )
    return str(value)


def _allows_nan(model: Any) -> bool | None:
    """Whether the estimator takes NaN (scikit-learn's ``allow_nan`` tag); None: unknown."""
    try:
        from sklearn.utils import get_tags  # scikit-learn >= 1.6
    except ImportError:
        tags = getattr(model, "_get_tags", None)
        try:
            return bool(tags()["allow_nan"]) if tags is not None else None
        except Exception:  # a third-party estimator with broken tags: let it check
            return None
    try:
        return bool(get_tags(model).input_tags.allow_nan)
    except Exception:  # a third-party estimator with broken tags: let it check
        return None
