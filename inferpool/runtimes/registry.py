"""The table of built-in runtimes, and the choice of a model's runtime class: from
settings, MLServer names or the artefact.

``RUNTIMES`` is the one place that lists the built-in runtimes: each entry says what the
engine must know of a runtime without importing it or its library (which may be missing):
its class, the pip extra that installs the library, the artefacts it recognises, what the
template process imports before forking (``engine/worker/template.py``) and whether the
template may load its models before forking (``engine/worker/preload.py``). A new
runtime is one module with its ``Runtime`` subclass plus one entry here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from inferpool.errors import RuntimeNotFound
from inferpool.runtimes.artefacts import is_lightgbm_text
from inferpool.runtimes.base import Runtime
from inferpool.settings import ModelSettings


@dataclass(frozen=True, slots=True)
class RuntimeEntry:
    """A built-in runtime, as the engine knows it before importing anything of it."""

    #: the runtime's name in settings (``"runtime": "sklearn"``)
    name: str
    #: ``module.Class`` of its ``Runtime`` subclass, imported when a model needs it
    implementation: str
    #: the pip extra that installs its library: ``pip install inferpool[extra]``
    extra: str
    #: MLServer's implementation string for it, so an MLServer repository serves unchanged
    #: ("" for a runtime of inferpool's own)
    mlserver: str = ""
    #: artefact file names that choose this runtime for a model without settings
    artefacts: tuple[str, ...] = ()
    #: modules the template imports when it first loads one of its models, so that the
    #: workers forked afterwards share them (a missing one is skipped): the runtime's module
    #: and the library modules its models use; a server without such a model imports none
    preload: tuple[str, ...] = ()
    #: its load starts no OpenMP or BLAS thread pool, so the template may load its models
    #: before forking (a parent that has run OpenMP code must not fork; DESIGN §3)
    fork_safe: bool = False
    #: how to get the library when ``pip install inferpool[extra]`` cannot (a library
    #: whose requirements the server's own environment cannot hold); "" for the extra
    install: str = ""
    #: its responses may set ``parameters.headers``, which then leave the body as HTTP
    #: response headers or gRPC trailing metadata, as MLServer sends them (MLServer's
    #: alibi runtimes name themselves in ``x-seldon-alibi-*``); its requests get the
    #: call's headers as ``parameters.headers``. A user's runtime always does; a built-in
    #: one without this pays nothing for it (``protocol/request_headers.py``)
    headers: bool = False

    def how_to_install(self) -> str:
        """What a model whose library is missing is told to do."""
        return self.install or f"pip install inferpool[{self.extra}]"

    def named_by(self, implementation: str | None) -> bool:
        """Whether an MLServer ``implementation`` string names this runtime: its module
        name, or its distribution's as MLServer's own mllib example writes it
        (``"mlserver-mllib.MLlibModel"``, which MLServer itself cannot import)."""
        if not implementation or not self.mlserver:
            return False
        return implementation.replace("-", "_") == self.mlserver


# In order of preference between artefacts: MLmodel comes first, since an MLflow folder
# also holds its flavour's file (an sklearn flavour's model.pkl).
RUNTIMES: dict[str, RuntimeEntry] = {
    entry.name: entry
    for entry in (
        # MLflow pyfunc may run anything when it loads: the template loads the flavours
        # known to be safe (``is_fork_safe``), importing MLflow only then.
        RuntimeEntry(
            "mlflow",
            "inferpool.runtimes.mlflow.MLflowRuntime",
            extra="mlflow",
            mlserver="mlserver_mlflow.MLflowRuntime",
            artefacts=("MLmodel",),
        ),
        # scikit-learn unpickles: no thread pool is started.
        RuntimeEntry(
            "sklearn",
            "inferpool.runtimes.sklearn.SKLearnRuntime",
            extra="sklearn",
            mlserver="mlserver_sklearn.SKLearnModel",
            artefacts=("model.joblib", "model.pkl", "model.pickle"),
            preload=(
                "inferpool.runtimes.sklearn",
                "sklearn.ensemble",
                "sklearn.linear_model",
                "sklearn.pipeline",
                "sklearn.preprocessing",
            ),
            fork_safe=True,
        ),
        # LightGBM and XGBoost parse their trees with OpenMP limited to the loading thread
        # (``runtimes.artefacts.single_threaded``).
        RuntimeEntry(
            "lightgbm",
            "inferpool.runtimes.lightgbm.LightGBMRuntime",
            extra="lightgbm",
            mlserver="mlserver_lightgbm.LightGBMModel",
            artefacts=("model.txt",),
            preload=("inferpool.runtimes.lightgbm",),
            fork_safe=True,
        ),
        RuntimeEntry(
            "xgboost",
            "inferpool.runtimes.xgboost.XGBoostRuntime",
            extra="xgboost",
            mlserver="mlserver_xgboost.XGBoostModel",
            # A .bst may also be a LightGBM text model: its first bytes decide (_by_content).
            artefacts=("model.json", "model.ubj", "model.bst", "model.xgb"),
            preload=("inferpool.runtimes.xgboost",),
            fork_safe=True,
        ),
        # CatBoost reads its model file on the loading thread and starts its thread pool
        # only when it predicts (measured: tests/runtimes/test_catboost_runtime.py). No
        # module preload: importing catboost takes 1.2 s, which every start-up would pay
        # wherever it is installed; a CatBoost model, fork-safe, is loaded in the template
        # (importing it there) before the workers fork all the same.
        RuntimeEntry(
            "catboost",
            "inferpool.runtimes.catboost.CatBoostRuntime",
            extra="catboost",
            mlserver="mlserver_catboost.CatboostModel",
            artefacts=("model.cbm", "model.bin"),
            fork_safe=True,
        ),
        # An ONNX Runtime session starts thread pools: each worker creates its own after the
        # fork (never the template). MLServer has no ONNX runtime to name.
        RuntimeEntry(
            "onnx",
            "inferpool.runtimes.onnx.ONNXRuntime",
            extra="onnx",
            artefacts=("model.onnx",),
        ),
        # HuggingFace transformers pipelines: torch starts thread pools that do not survive
        # a fork, so each worker imports torch and loads the model after the fork (never the
        # template). A saved model's folder is named in settings (its config.json is too
        # common a name to choose a runtime by).
        RuntimeEntry(
            "huggingface",
            "inferpool.runtimes.huggingface.HuggingFaceRuntime",
            extra="huggingface",
            mlserver="mlserver_huggingface.HuggingFaceRuntime",
        ),
        # Models from other languages (docs/languages.md). A native library's init may
        # start threads: each worker dlopens it after the fork (its code pages, file-backed,
        # are shared through the page cache all the same). Needs no Python library.
        RuntimeEntry(
            "native",
            "inferpool.runtimes.native.NativeRuntime",
            extra="",
            artefacts=("model.so",),
            preload=("inferpool.runtimes.native",),
        ),
        # Embedded R does not survive a fork and rpy2 starts R when rpy2.robjects is
        # imported: neither is imported nor loaded before the workers fork.
        RuntimeEntry(
            "r",
            "inferpool.runtimes.r.RRuntime",
            extra="r",
            artefacts=("model.rds",),
        ),
        # Java and PMML run in a JVM, which does not survive a fork (its threads stay
        # behind): never preloaded nor loaded by the template; each worker starts its one
        # JVM when its first such model loads (runtimes/jvm.py), the server itself with
        # --workers 0. A Java model is named in settings ("implementation": "java").
        RuntimeEntry(
            "java",
            "inferpool.runtimes.java.JavaRuntime",
            extra="java",
        ),
        RuntimeEntry(
            "pmml",
            "inferpool.runtimes.pmml.PMMLRuntime",
            extra="pmml",
            artefacts=("model.pmml",),
        ),
        # Spark MLlib: PySpark's JVM is a child process reached over a socket, which a
        # fork would share: each worker starts its own local session when its first such
        # model loads (runtimes/spark_session.py), the server itself with --workers 0.
        # A saved Spark model's folder holds metadata/ with Spark's _SUCCESS marker.
        RuntimeEntry(
            "mllib",
            "inferpool.runtimes.mllib.MLlibRuntime",
            extra="mllib",
            mlserver="mlserver_mllib.MLlibModel",
            artefacts=("metadata/_SUCCESS",),
        ),
        # alibi-detect 0.13 requires numpy<2: its detectors run in a per-model environment
        # (docs/runtimes/alibi-detect.md). A detector folder holds config.toml, a name too
        # common to choose a runtime by: its settings name the implementation.
        RuntimeEntry(
            "alibi-detect",
            "inferpool.runtimes.alibi_detect.AlibiDetectRuntime",
            extra="alibi-detect",
            mlserver="mlserver_alibi_detect.AlibiDetectRuntime",
            install=(
                "run the model in an environment holding alibi-detect: "
                "docs/runtimes/alibi-detect.md"
            ),
            headers=True,
        ),
        # alibi 0.9 requires numpy<2 too: its explainers run in a per-model environment
        # (docs/runtimes/alibi-explain.md); a saved explainer's meta.dill and explainer.dill
        # are names too common to choose a runtime by: its settings name the implementation.
        RuntimeEntry(
            "alibi-explain",
            "inferpool.runtimes.alibi_explain.AlibiExplainRuntime",
            extra="alibi-explain",
            mlserver="mlserver_alibi_explain.AlibiExplainRuntime",
            install=(
                "run the model in an environment holding alibi: docs/runtimes/alibi-explain.md"
            ),
            headers=True,
        ),
        # Loads the model it explains (any runtime): in each worker, as that may need.
        RuntimeEntry(
            "explainer",
            "inferpool.runtimes.explainer.ExplainerRuntime",
            extra="",
        ),
    )
}


def preload_modules(settings: ModelSettings) -> tuple[str, ...]:
    """The modules the template imports before it loads a model of these settings (its
    runtime's entry's ``preload``; none for a custom runtime)."""
    entry = RUNTIMES.get(runtime_name_for(settings))
    return () if entry is None else entry.preload


def is_fork_safe(settings: ModelSettings) -> bool:
    """The model loads without starting a thread and holds plain data, so the template may
    load it before forking: a built-in runtime marked so in its entry, an MLflow model of a
    flavour in ``MLFLOW_FORK_SAFE_LOADERS``, a custom runtime whose class says
    ``fork_safe = True``. Asking runs none of the model's code (``_declares_fork_safe``)."""
    name = runtime_name_for(settings)
    if name == "mlflow":
        return _mlflow_loader(settings) in MLFLOW_FORK_SAFE_LOADERS
    entry = RUNTIMES.get(name)
    if entry is not None:
        return entry.fork_safe
    source = _class_source(name, settings.folder)
    return source is not None and _declares_fork_safe(source, name.rpartition(".")[2])


# MLflow flavours whose pyfunc loader starts no thread (measured: ``import mlflow`` starts
# none either; its telemetry threads start only when a model is logged) and unpickles or
# parses plain data (LightGBM and XGBoost under ``artefacts.single_threaded``). A
# ``python_function`` model of its own (``mlflow.pyfunc.model``) runs the user's
# ``load_context``, which may start anything: loaded by each worker.
MLFLOW_FORK_SAFE_LOADERS = frozenset({"mlflow.sklearn", "mlflow.lightgbm", "mlflow.xgboost"})


def _mlflow_loader(settings: ModelSettings) -> str:
    """The ``loader_module`` of the model's pyfunc flavour in its ``MLmodel`` file, read
    without importing MLflow ("" when there is none to read)."""
    uri = settings.parameters.uri
    folder = settings.resolve(uri) if uri else settings.folder
    if folder is None:
        return ""
    path = folder if folder.name == "MLmodel" else folder / "MLmodel"
    try:
        import yaml  # MLflow's own dependency: present wherever an MLflow model can load

        document = yaml.safe_load(path.read_text())
        loader = document["flavors"]["python_function"]["loader_module"]
    except (ImportError, OSError, yaml.YAMLError, KeyError, TypeError):
        return ""
    return loader if isinstance(loader, str) else ""


def _class_source(implementation: str, folder: Path | None) -> Path | None:
    """The source file of a custom runtime's module, found as ``_custom_class`` imports
    it (the model's folder first, then installed modules) but without running it."""
    module_name = implementation.rpartition(".")[0]
    if not module_name:
        return None
    top, *rest = module_name.split(".")
    location = _module_file(folder, top) if folder is not None else None
    path: Path | None
    if location is not None:
        path = location[0]
        search = [str(path.parent)] if location[1] else []
    else:
        spec = importlib.machinery.PathFinder.find_spec(top)
        if spec is None:
            return None
        path = Path(spec.origin) if spec.origin else None
        search = list(spec.submodule_search_locations or [])
    for part in rest:
        spec = importlib.machinery.PathFinder.find_spec(part, search) if search else None
        if spec is None:
            return None
        path = Path(spec.origin) if spec.origin else None
        search = list(spec.submodule_search_locations or [])
    return path if path is not None and path.suffix == ".py" else None


def _declares_fork_safe(source: Path, class_name: str) -> bool:
    """Whether the class ``class_name`` of ``source`` sets ``fork_safe = True`` in its own
    body. Read from the file, not imported: the template runs a model's code only when
    the model says it may (a module that starts a thread when imported stays out)."""
    try:
        tree = ast.parse(source.read_bytes(), str(source))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for statement in node.body:
                if isinstance(statement, ast.Assign):
                    targets, value = statement.targets, statement.value
                elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                    targets, value = [statement.target], statement.value
                else:
                    continue
                if any(isinstance(t, ast.Name) and t.id == "fork_safe" for t in targets):
                    return isinstance(value, ast.Constant) and value.value is True
    return False


def runtime_name_for(settings: ModelSettings) -> str:
    """The runtime's name, or the ``module.Class`` of a custom implementation."""
    if settings.runtime:
        return settings.runtime
    implementation = settings.implementation
    if implementation:
        for entry in RUNTIMES.values():
            if entry.named_by(implementation):
                return entry.name
        return implementation
    return infer_runtime(settings)


def _artefacts() -> list[tuple[str, str]]:
    """(artefact file name, runtime name), in order of preference."""
    return [(filename, entry.name) for entry in RUNTIMES.values() for filename in entry.artefacts]


def infer_runtime(settings: ModelSettings) -> str:
    """Recognise the runtime from the artefact named by ``uri`` or found in the folder."""
    if settings.parameters.uri:
        uri = settings.resolve(settings.parameters.uri)
        if uri.is_dir():
            return _runtime_in_folder(uri)
        for filename, runtime in _artefacts():
            suffix = Path(filename).suffix
            if uri.name == filename or (suffix and uri.suffix == suffix):
                return _by_content(uri, runtime)
    if settings.folder is not None:
        return _runtime_in_folder(settings.folder)
    raise RuntimeNotFound(f"model '{settings.name}' has no folder and no runtime")


def has_artefact(folder: Path) -> bool:
    """Whether ``folder`` directly holds a file that names a runtime (``model.joblib``,
    ``MLmodel``, ...): a folder without settings is a model only then, once the
    repository is an MLServer one (``engine.repository``)."""
    return any((folder / filename).exists() for filename, _ in _artefacts())


def _runtime_in_folder(folder: Path) -> str:
    artefacts = _artefacts()
    for filename, runtime in artefacts:
        if (folder / filename).exists():
            return _by_content(folder / filename, runtime)
    expected = ", ".join(name for name, _ in artefacts)
    raise RuntimeNotFound(f"no model artefact in {folder} (expected one of: {expected})")


def _by_content(path: Path, runtime: str) -> str:
    """The runtime for an artefact whose name two libraries use: a ``.bst`` is written by
    XGBoost (binary or UBJSON) or by LightGBM (text), so its first bytes decide."""
    if path.suffix == ".bst" and is_lightgbm_text(path):
        return "lightgbm"
    return runtime


def runtime_class(settings: ModelSettings) -> type[Runtime]:
    """Import the runtime class for a model, or raise RuntimeNotFound with what to do."""
    name = runtime_name_for(settings)
    entry = RUNTIMES.get(name)
    if entry is None:
        return _custom_class(name, settings)
    module_name, _, class_name = entry.implementation.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("inferpool"):
            raise RuntimeNotFound(f"runtime '{name}' is not available in this build") from None
        raise RuntimeNotFound(
            f"the '{name}' runtime needs {exc.name}: {entry.how_to_install()}"
        ) from None
    cls: type[Runtime] = getattr(module, class_name)
    return cls


def _custom_class(implementation: str, settings: ModelSettings) -> type[Runtime]:
    module_name, _, class_name = implementation.rpartition(".")
    if not module_name:
        known = ", ".join(RUNTIMES)
        raise RuntimeNotFound(
            f"unknown runtime '{implementation}': use one of {known} or module.Class"
        )
    try:
        module = _import_model_module(module_name, settings.folder)
    except ImportError as exc:
        raise RuntimeNotFound(f"cannot import '{module_name}': {exc}") from None
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and issubclass(cls, Runtime):
        return cls
    if isinstance(cls, type):
        # An MLServer custom runtime (mlserver.MLModel or inferpool.mlserver.MLModel).
        from inferpool.mlserver.adapter.runtime import adapter_for, flavour_of

        flavour = flavour_of(cls)
        if flavour is not None:
            return adapter_for(cls, flavour)
    raise RuntimeNotFound(
        f"'{implementation}' is not a subclass of inferpool.Runtime or of MLServer's MLModel"
    )


def _import_model_module(module_name: str, folder: Path | None) -> ModuleType:
    """The module of a custom runtime: from its file in the model's folder, else installed.

    A module found in the folder is executed from its file under a name unique to that
    folder, so two models that each ship a ``model.py`` do not share one module, and a
    reload runs the file again. The folder goes at the END of ``sys.path`` (for the
    module's own sibling imports): a file in it named like a standard-library or
    installed module (``json.py``, ``random.py``) must never replace that module for the
    other models of the process.
    """
    top, _, rest = module_name.partition(".")
    location = _module_file(folder, top) if folder is not None else None
    if folder is None or location is None:
        return importlib.import_module(module_name)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]
    unique = f"_inferpool_model_{digest}_{top}"
    for loaded in [name for name in sys.modules if name.split(".")[0] == unique]:
        del sys.modules[loaded]  # a reload runs the model's current files
    path, package = location
    spec = importlib.util.spec_from_file_location(
        unique, path, submodule_search_locations=[str(path.parent)] if package else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return importlib.import_module(f"{unique}.{rest}") if rest else module


def _module_file(folder: Path, name: str) -> tuple[Path, bool] | None:
    """``name.py`` or the package ``name/`` in ``folder``: (its file, is a package)."""
    if not name.isidentifier():
        return None
    package = folder / name / "__init__.py"
    if package.is_file():
        return package, True
    module = folder / f"{name}.py"
    if module.is_file():
        return module, False
    return None
