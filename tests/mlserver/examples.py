"""MLServer 1.7.1's documentation examples (its ``docs/examples/<name>``), laid out as one
multi-model repository: each example's ``model-settings.json`` as the example gives it
(the facts: names, implementations, URIs, versions, declared inputs), its artefact trained
here as its README describes (on data generated here or shipped with scikit-learn), and
the request its README sends. The custom runtimes are written here from the READMEs'
descriptions, with MLServer's own imports.

``tests/mlserver/test_examples_installed.py`` serves the repository with inferpool and
with ``mlserver start`` side by side and compares the answers. Examples not here: see
that module's docstring.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# content-type (docs/examples/content-type): a runtime that decodes each input by its
# content type (the request's, else the model's metadata) and answers it back encoded
# by the codec of what it decoded to: arrays with NumpyCodec, strings with StringCodec.
ECHO = """
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            decoded = self.decode(request_input)
            if isinstance(decoded, np.ndarray):
                outputs.append(NumpyCodec.encode_output(request_input.name, decoded))
            else:
                outputs.append(StringCodec.encode_output(request_input.name, list(decoded)))
        return InferenceResponse(model_name=self.name, outputs=outputs)
"""

# custom-json (docs/examples/custom-json): one string input holding a JSON document; the
# answer is one JSON string naming what was asked.
JSON_MODEL = """
import json

from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class JsonHelloWorldModel(MLModel):
    async def load(self) -> bool:
        self.greeting = "Hello from the server"
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        (text,) = StringCodec.decode_input(payload.inputs[0])
        asked = json.loads(text)
        answer = json.dumps({"request": asked, "server_response": self.greeting})
        output = StringCodec.encode_output("echo_response", [answer])
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[output])
"""

CONTENT_TYPE_SETTINGS = {
    "name": "content-type-example",
    "implementation": "runtime.EchoRuntime",
    "inputs": [
        {
            "name": "metadata-np",
            "datatype": "INT32",
            "shape": [2, 2],
            "parameters": {"content_type": "np"},
        },
        {
            "name": "metadata-str",
            "datatype": "BYTES",
            "shape": [11],
            "parameters": {"content_type": "str"},
        },
    ],
}


def _settings(folder: Path, settings: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=4))


def _sklearn(folder: Path) -> list[float]:
    """The sklearn example: an SVC on the first half of scikit-learn's digits; the first
    test image (the request's)."""
    import joblib
    from sklearn import datasets, svm

    digits = datasets.load_digits()
    data = digits.images.reshape((len(digits.images), -1))
    half = len(data) // 2
    classifier = svm.SVC(gamma=0.001).fit(data[:half], digits.target[:half])
    _settings(
        folder,
        {
            "name": "mnist-svm",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.1.0"},
        },
    )
    joblib.dump(classifier, folder / "mnist-svm.joblib")
    return data[half].tolist()


def _mushrooms(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Agaricus-like data made here: 126 one-hot features, the label a rule of a few."""
    rng = np.random.default_rng(seed)
    x = (rng.random((400, 126)) < 0.15).astype(np.float32)
    y = ((x[:, 3] + x[:, 20] + x[:, 77]) >= 1).astype(int)
    return x, y


def _xgboost(folder: Path) -> list[float]:
    """The xgboost example: an XGBClassifier saved as JSON."""
    import xgboost

    x, y = _mushrooms()
    model = xgboost.XGBClassifier(n_estimators=8, max_depth=3).fit(x[:300], y[:300])
    _settings(
        folder,
        {
            "name": "mushroom-xgboost",
            "implementation": "mlserver_xgboost.XGBoostModel",
            "parameters": {"uri": "./mushroom-xgboost.json", "version": "v0.1.0"},
        },
    )
    model.save_model(folder / "mushroom-xgboost.json")
    return x[300].tolist()


def _lightgbm(folder: Path) -> list[float]:
    """The lightgbm example: a multiclass booster on iris, ``save_model`` to .bst."""
    import lightgbm
    from sklearn.datasets import load_iris

    iris = load_iris()
    x, y = iris["data"], iris["target"]
    order = np.random.default_rng(3).permutation(len(x))
    train, test = order[:135], order[135:]
    params = {"objective": "multiclass", "metric": "softmax", "num_class": 3, "verbose": -1}
    booster = lightgbm.train(params=params, train_set=lightgbm.Dataset(x[train], label=y[train]))
    _settings(
        folder,
        {
            "name": "iris-lgb",
            "implementation": "mlserver_lightgbm.LightGBMModel",
            "parameters": {"uri": "./iris-lightgbm.bst", "version": "v0.1.0"},
        },
    )
    booster.save_model(str(folder / "iris-lightgbm.bst"))
    return x[test[0]].tolist()


def _runtime(folder: Path, module: str, source: str, settings: dict) -> None:
    _settings(folder, settings)
    (folder / f"{module}.py").write_text(source)


def _tensor(name: str, datatype: str, shape: list, data: list, content_type: str = "") -> dict:
    tensor = {"name": name, "datatype": datatype, "shape": shape, "data": data}
    if content_type:
        tensor["parameters"] = {"content_type": content_type}
    return tensor


def _fp32(name: str, row: list[float]) -> dict:
    return {"name": name, "shape": [1, len(row)], "datatype": "FP32", "data": row}


def write_examples(root: Path) -> list[tuple[str, str, dict]]:
    """The examples' repository in ``root``; each example's (name, infer path, request)."""
    digit = _sklearn(root / "sklearn")
    mushroom = _xgboost(root / "xgboost")
    flower = _lightgbm(root / "lightgbm")
    _runtime(root / "content-type", "runtime", ECHO, CONTENT_TYPE_SETTINGS)
    json_settings = {"name": "json-hello-world", "implementation": "jsonmodels.JsonHelloWorldModel"}
    _runtime(root / "custom-json", "jsonmodels", JSON_MODEL, json_settings)
    asked = json.dumps({"name": "Foo Bar", "message": "Hello from Client (REST)!"})
    text = "hello world 😁"
    return [
        (
            "sklearn",
            "/v2/models/mnist-svm/versions/v0.1.0/infer",
            {"id": "request-0", "inputs": [_fp32("predict", digit)]},
        ),
        (
            "xgboost",
            "/v2/models/mushroom-xgboost/versions/v0.1.0/infer",
            {"inputs": [_fp32("predict", mushroom)]},
        ),
        (
            "lightgbm",
            "/v2/models/iris-lgb/versions/v0.1.0/infer",
            {"inputs": [_fp32("predict-prob", flower)]},
        ),
        (
            "content-type",
            "/v2/models/content-type-example/infer",
            {
                "inputs": [
                    _tensor("parameters-np", "INT32", [2, 2], [1, 2, 3, 4], "np"),
                    _tensor("parameters-str", "BYTES", [1], [text], "str"),
                ]
            },
        ),
        (
            "content-type-metadata",
            "/v2/models/content-type-example/infer",
            {
                "inputs": [
                    _tensor("metadata-np", "INT32", [2, 2], [1, 2, 3, 4]),
                    _tensor("metadata-str", "BYTES", [11], [text]),
                ]
            },
        ),
        (
            "custom-json",
            "/v2/models/json-hello-world/infer",
            {
                "inputs": [
                    {
                        "name": "echo_request",
                        "shape": [len(asked)],
                        "datatype": "BYTES",
                        "data": [asked],
                    }
                ]
            },
        ),
    ]
