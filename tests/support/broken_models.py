"""A corpus of broken model files, generated here from small models trained on the fly:
truncations at several offsets, bit flips, empty files, another format under the right
name, pickles of classes that do not exist, a newer pickle protocol, across the
scikit-learn, LightGBM, XGBoost, MLflow and MLServer-compatible runtimes.

Each ``Broken`` knows the sentence its model must fail with: ``{file} is not a valid
{library} model (...)`` (or ``a model this server can load with {library}``), and for
most a detail that only the right diagnosis gives (``expect``).
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support import iris_data
from tests.support.runtimes import lightgbm_estimator, xgboost_estimator

# What a truncated or corrupt file is said to be, whether the library raised or crashed.
DAMAGED = r"(truncated or corrupt|the process (aborted|crashed \(\w+\)|hung for))"


@dataclass(frozen=True)
class Broken:
    """One broken model: its folder's name, the file, the library, the detail to expect."""

    name: str
    file: str
    library: str
    expect: str  # a regular expression the reason must also match
    write: Callable[[Path], None]  # writes the model's folder

    def pattern(self) -> str:
        opening = rf"^{re.escape(self.file)} is not (a valid|a model this server can load with)"
        return rf"{opening} {re.escape(self.library)}\b.*{self.expect}"


class Sources:
    """The good files the corpus breaks, made once."""

    def __init__(self) -> None:
        import joblib
        from sklearn.linear_model import LogisticRegression

        X, y = iris_data()
        self.sklearn = pickle_bytes(joblib, LogisticRegression(max_iter=500).fit(X, y))
        lgb, _ = lightgbm_estimator("classifier")
        self.lightgbm_text = lgb.booster_.model_to_string().encode()
        self.lightgbm_pickle = pickle_bytes(joblib, lgb)
        xgb, _ = xgboost_estimator("regressor")
        self.xgboost_json = bytes(xgb.get_booster().save_raw("json"))
        self.xgboost_ubj = bytes(xgb.get_booster().save_raw("ubj"))


def pickle_bytes(joblib, model) -> bytes:
    import io

    buffer = io.BytesIO()
    joblib.dump(model, buffer)
    return buffer.getvalue()


def flip(data: bytes, at: int) -> bytes:
    """``data`` with every bit of the byte at ``at`` inverted."""
    changed = bytearray(data)
    changed[at] ^= 0xFF
    return bytes(changed)


def file_model(file: str, content: bytes, settings: dict | None = None) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file).write_bytes(content)
        if settings is not None:
            document = {"name": folder.name, **settings}
            (folder / "model-settings.json").write_text(json.dumps(document))

    return write


# A pickle of a class no module defines, and of a module that does not exist.
UNKNOWN_CLASS = b"\x80\x02cbuiltins\nNoSuchClass\n)\x81."
UNKNOWN_MODULE = b"\x80\x02cno_such_module_here.models\nThing\n)\x81."
NEWER_PROTOCOL = b"\x80\x09K\x01."
NOT_A_MODEL = pickle.dumps({"weights": [1, 2, 3]}, protocol=4)


def mlflow_model(folder: Path, model_pkl: bytes | None, mlmodel: str | None = None) -> None:
    """An MLflow sklearn-flavour folder, its model.pkl replaced by ``model_pkl`` and its
    MLmodel by ``mlmodel`` when given."""
    import mlflow.sklearn
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    mlflow.sklearn.save_model(
        LogisticRegression(max_iter=500).fit(X, y), str(folder), pip_requirements=[],
        serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
    )  # fmt: skip
    if model_pkl is not None:
        (folder / "model.pkl").write_bytes(model_pkl)
    if mlmodel is not None:
        (folder / "MLmodel").write_text(mlmodel)


def corpus(sources: Sources) -> list[Broken]:
    """At least 25 broken models across the runtimes."""
    sk, lgb_text, lgb_pickle = sources.sklearn, sources.lightgbm_text, sources.lightgbm_pickle
    xjson, xubj = sources.xgboost_json, sources.xgboost_ubj
    lgb_settings = {"runtime": "lightgbm"}
    mls_sklearn = {
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib"},
    }
    mls_lightgbm = {
        "implementation": "mlserver_lightgbm.LightGBMModel",
        "parameters": {"uri": "./model.bst"},
    }
    mls_xgboost = {
        "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"uri": "./model.json"},
    }
    entries = [
        # scikit-learn pickles (joblib)
        Broken("sk-empty", "model.joblib", "scikit-learn", r"the file is empty",
               file_model("model.joblib", b"")),
        Broken("sk-cut-10", "model.joblib", "scikit-learn", DAMAGED,
               file_model("model.joblib", sk[:10])),
        Broken("sk-cut-100", "model.joblib", "scikit-learn", DAMAGED,
               file_model("model.joblib", sk[:100])),
        Broken("sk-cut-half", "model.joblib", "scikit-learn", DAMAGED,
               file_model("model.joblib", sk[: len(sk) // 2])),
        Broken("sk-cut-end", "model.joblib", "scikit-learn", DAMAGED,
               file_model("model.joblib", sk[:-10])),
        Broken("sk-flip-opcode", "model.joblib", "scikit-learn", "",
               file_model("model.joblib", flip(sk, len(sk) // 3))),
        Broken("sk-json", "model.joblib", "scikit-learn", r"it holds JSON, not a pickle",
               file_model("model.joblib", b'{"coef": [1, 2]}')),
        Broken("sk-lgb-text", "model.joblib", "scikit-learn",
               r"it holds a LightGBM text model, not a pickle",
               file_model("model.joblib", lgb_text)),
        Broken("sk-unknown-class", "model.joblib", "scikit-learn",
               r"a pickle of a class that does not exist here",
               file_model("model.joblib", UNKNOWN_CLASS)),
        Broken("sk-unknown-module", "model.joblib", "scikit-learn",
               r"it needs no_such_module_here: install no_such_module_here",
               file_model("model.joblib", UNKNOWN_MODULE)),
        Broken("sk-newer-protocol", "model.pkl", "scikit-learn",
               r"unsupported pickle protocol: 9.*newer Python",
               file_model("model.pkl", NEWER_PROTOCOL)),
        Broken("sk-not-a-model", "model.joblib", "scikit-learn",
               r"it holds a dict, which has neither predict nor transform",
               file_model("model.joblib", NOT_A_MODEL)),
        # LightGBM text models and pickles
        Broken("lgb-empty", "model.txt", "LightGBM", r"the file is empty",
               file_model("model.txt", b"")),
        Broken("lgb-cut-3000", "model.txt", "LightGBM", DAMAGED,
               file_model("model.txt", lgb_text[:3000])),
        Broken("lgb-cut-header", "model.txt", "LightGBM", DAMAGED,
               file_model("model.txt", lgb_text[:300])),
        Broken("lgb-cut-trees", "model.txt", "LightGBM", DAMAGED,
               file_model("model.txt", lgb_text[: len(lgb_text) * 2 // 3])),
        Broken("lgb-json", "model.txt", "LightGBM",
               r"(it holds JSON, not a LightGBM text model|" + DAMAGED + ")",
               file_model("model.txt", xjson)),
        Broken("lgb-pickle-cut", "model.joblib", "LightGBM", DAMAGED,
               file_model("model.joblib", lgb_pickle[: len(lgb_pickle) // 2], lgb_settings)),
        Broken("lgb-pickle-of-sklearn", "model.joblib", "LightGBM",
               r"it holds a LogisticRegression, not a LightGBM model",
               file_model("model.joblib", sk, lgb_settings)),
        # XGBoost JSON and UBJSON
        Broken("xgb-empty", "model.json", "XGBoost", r"the file is empty",
               file_model("model.json", b"")),
        Broken("xgb-json-cut-100", "model.json", "XGBoost", DAMAGED,
               file_model("model.json", xjson[:100])),
        Broken("xgb-json-cut-end", "model.json", "XGBoost", DAMAGED,
               file_model("model.json", xjson[:-2])),
        Broken("xgb-json-flip", "model.json", "XGBoost", "",
               file_model("model.json", flip(xjson, len(xjson) // 3))),
        Broken("xgb-ubj-cut-2000", "model.ubj", "XGBoost", DAMAGED,
               file_model("model.ubj", xubj[:2000])),
        Broken("xgb-ubj-flip", "model.ubj", "XGBoost", "",
               file_model("model.ubj", flip(xubj, len(xubj) // 3))),
        Broken("xgb-lgb-text", "model.json", "XGBoost",
               r"it holds a LightGBM text model, not JSON",
               file_model("model.json", lgb_text)),
        Broken("xgb-pickle", "model.ubj", "XGBoost", r"it holds a pickle, not UBJSON",
               file_model("model.ubj", sk)),
        # MLServer-compatible runtimes
        Broken("mls-sklearn-cut", "model.joblib", "scikit-learn", DAMAGED,
               file_model("model.joblib", sk[:200], mls_sklearn)),
        Broken("mls-lightgbm-cut", "model.bst", "LightGBM", DAMAGED,
               file_model("model.bst", lgb_text[:3000], mls_lightgbm)),
        Broken("mls-xgboost-cut", "model.json", "XGBoost", DAMAGED,
               file_model("model.json", xjson[:500], mls_xgboost)),
        # MLflow
        Broken("mlflow-pkl-cut", "MLmodel", "MLflow", DAMAGED,
               lambda folder: mlflow_model(folder, sk[:100])),
        Broken("mlflow-empty-mlmodel", "MLmodel", "MLflow", r"the file is empty",
               lambda folder: mlflow_model(folder, None, "")),
    ]  # fmt: skip
    return entries
