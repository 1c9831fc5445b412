"""MLServer's answers for MLServer's implementation strings (issue 13, "Same answers").

One repository holds every runtime × artefact format × (binary, multi-class) with the
settings an MLServer user has (``"implementation": "mlserver_lightgbm.LightGBMModel"``
...), served by one server. Each request (default output, each output by name) is
checked over REST, and a representative subset over gRPC, against the values each
library's documented API computes here (``Booster.predict``, ``clf.predict_proba``...),
in MLServer's encoding: output names, datatypes, ``[N, 1]`` for one value per row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import Server
from tests.support.runtimes import classification_data

LIGHTGBM = "mlserver_lightgbm.LightGBMModel"
XGBOOST = "mlserver_xgboost.XGBoostModel"
SKLEARN = "mlserver_sklearn.SKLearnModel"
MLFLOW = "mlserver_mlflow.MLflowRuntime"
KINDS = {"binary": 2, "multiclass": 3}
ROWS = 6
LABELS = np.array(["ham", "spam", "eggs"])
GRPC_FIELDS = {
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "BYTES": "bytes_contents",
}


@dataclass
class Expected:
    """One output of a response: its name, datatype and values (in the response's shape)."""

    name: str
    datatype: str
    values: np.ndarray


# model name → requested output (None: the default) → what the response holds
Answers = dict[str, dict[str | None, Expected]]


def column(values: Any) -> np.ndarray:
    """One value per row, as MLServer sends it: shape [N, 1]."""
    array = np.asarray(values)
    return array.reshape(-1, 1) if array.ndim == 1 else array


def write_settings(folder: Path, implementation: str | None, **parameters: Any) -> None:
    settings: dict[str, Any] = {"name": folder.name}
    if implementation:
        settings["implementation"] = implementation
    if parameters:
        settings["parameters"] = parameters
    (folder / "model-settings.json").write_text(json.dumps(settings))


def data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    X, y = classification_data(KINDS[kind], rows=120)
    return X, y


def lightgbm_models(root: Path, answers: Answers) -> None:
    import lightgbm

    for kind in KINDS:
        X, y = data(kind)
        params = {"objective": kind, "num_leaves": 5, "verbose": -1, "num_threads": 1}
        if kind == "multiclass":
            params["num_class"] = KINDS[kind]
        booster = lightgbm.train(params, lightgbm.Dataset(X, y), num_boost_round=4)
        expected = Expected("predict", "FP64", column(booster.predict(X[:ROWS])))
        for artefact in ("model.txt", "model.bst"):
            folder = root / f"lgb-{artefact[6:]}-{kind}"
            folder.mkdir()
            booster.save_model(str(folder / artefact))
            # MLServer finds model.bst in a folder; a model.txt is named by its uri.
            uri = {"uri": artefact} if artefact == "model.txt" else {}
            write_settings(folder, LIGHTGBM, **uri)
            # MLServer answers predict whatever the request names.
            answers[folder.name] = {None: expected, "predict": expected, "raw_score": expected}


def xgboost_models(root: Path, answers: Answers) -> None:
    import xgboost

    for kind in KINDS:
        X, y = data(kind)
        clf = xgboost.XGBClassifier(n_estimators=4, max_depth=2, n_jobs=1, random_state=0)
        clf.fit(X, y)
        booster = clf.get_booster()
        labels = Expected("predict", "INT64", column(clf.predict(X[:ROWS])))
        probabilities = Expected("predict_proba", "FP32", clf.predict_proba(X[:ROWS]))
        # A Booster's file has no scikit-learn type: MLServer reads it as a regressor,
        # whose predict is the Booster's output.
        values = Expected("predict", "FP32", column(booster.inplace_predict(X[:ROWS])))
        for suffix in ("json", "ubj", "bst"):
            saved_as = "ubj" if suffix == "bst" else suffix  # XGBoost writes .bst as UBJSON
            for source, model, answer in (
                ("clf", clf, {None: labels, "predict": labels, "predict_proba": probabilities}),
                ("booster", booster, {None: values, "predict": values}),
            ):
                folder = root / f"xgb-{suffix}-{source}-{kind}"
                folder.mkdir()
                model.save_model(str(folder / f"saved.{saved_as}"))
                (folder / f"saved.{saved_as}").rename(folder / f"model.{suffix}")
                write_settings(folder, XGBOOST)
                answers[folder.name] = answer


def sklearn_models(root: Path, answers: Answers) -> None:
    import joblib
    from sklearn.decomposition import PCA
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    for kind in KINDS:
        X, y = data(kind)
        if kind == "binary":  # integer labels, scikit-learn computes
            clf: Any = LogisticRegression(max_iter=500).fit(X, y)
            datatype = "INT64"
        else:  # text labels, inferpool's tree kernel computes
            clf = RandomForestClassifier(n_estimators=5, random_state=0, n_jobs=1)
            clf.fit(X, LABELS[y])
            datatype = "BYTES"
        labels = Expected("predict", datatype, column(clf.predict(X[:ROWS])))
        probabilities = Expected("predict_proba", "FP64", clf.predict_proba(X[:ROWS]))
        answer = {None: labels, "predict": labels, "predict_proba": probabilities}
        for artefact in ("model.joblib", "model.pkl", "model.pickle"):
            folder = root / f"sk-{artefact[6:]}-{kind}"
            folder.mkdir()
            joblib.dump(clf, folder / artefact)
            write_settings(folder, SKLEARN)
            answers[folder.name] = answer
        folder = root / f"sk-predict-fn-{kind}"
        folder.mkdir()
        joblib.dump(clf, folder / "model.joblib")
        write_settings(folder, SKLEARN, extra={"predict_fn": "predict_proba"})
        answers[folder.name] = {None: probabilities, "predict": labels}
    X, _ = data("multiclass")
    pca = PCA(n_components=2, random_state=0).fit(X)
    folder = root / "sk-transform"
    folder.mkdir()
    joblib.dump(pca, folder / "model.joblib")
    write_settings(folder, SKLEARN, extra={"predict_fn": "transform"})
    answers[folder.name] = {None: Expected("transform", "FP64", pca.transform(X[:ROWS]))}


def mlflow_models(root: Path, answers: Answers) -> None:
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    for kind in KINDS:
        X, y = data(kind)
        clf = LogisticRegression(max_iter=500).fit(X, y)
        labels = clf.predict(X[:ROWS])
        for implementation, prefix in ((MLFLOW, "mlflow"), (None, "mlflow-own")):
            folder = root / f"{prefix}-{kind}"
            mlflow.sklearn.save_model(
                clf,
                str(folder),
                signature=infer_signature(X, clf.predict(X)),
                pip_requirements=[],
                serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
            )
            write_settings(folder, implementation)
        # MLServer: the pyfunc's array as output-1, whatever the request names.
        output = Expected("output-1", "INT64", column(labels))
        answers[f"mlflow-{kind}"] = {None: output, "output-1": output, "predict_proba": output}
        # inferpool's own MLflow runtime: predict_proba when asked for by name.
        probabilities = Expected("predict_proba", "FP64", clf.predict_proba(X[:ROWS]))
        own = Expected("output-0", "INT64", labels)
        answers[f"mlflow-own-{kind}"] = {None: own, "predict_proba": probabilities}


BUILDERS: dict[str, Callable[[Path, Answers], None]] = {
    "lightgbm": lightgbm_models,
    "xgboost": xgboost_models,
    "sklearn": sklearn_models,
    "mlflow": mlflow_models,
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Answers]:
    root = tmp_path_factory.mktemp("answers-repo")
    table: Answers = {}
    for build in BUILDERS.values():
        build(root, table)
    return root, table


@pytest.fixture(scope="module")
def answers(repository: tuple[Path, Answers]) -> Answers:
    return repository[1]


@pytest.fixture(scope="module")
def server(repository: tuple[Path, Answers]) -> Iterator[Server]:
    with Server(repository[0], "--workers", "1") as server:
        server.wait_ready(120)
        yield server


def cases() -> list[Any]:
    """(model, requested output) for every model of the matrix; the names are fixed here
    so that the cases exist before the models are trained."""
    names: list[tuple[str, str | None]] = []
    for kind in KINDS:
        for suffix in ("txt", "bst"):
            names += [(f"lgb-{suffix}-{kind}", o) for o in (None, "predict", "raw_score")]
        for suffix in ("json", "ubj", "bst"):
            outputs = (None, "predict", "predict_proba")
            names += [(f"xgb-{suffix}-clf-{kind}", o) for o in outputs]
            names += [(f"xgb-{suffix}-booster-{kind}", o) for o in (None, "predict")]
        for suffix in ("joblib", "pkl", "pickle"):
            names += [(f"sk-{suffix}-{kind}", o) for o in (None, "predict", "predict_proba")]
        names += [(f"sk-predict-fn-{kind}", o) for o in (None, "predict")]
        names += [(f"mlflow-{kind}", o) for o in (None, "output-1", "predict_proba")]
        names += [(f"mlflow-own-{kind}", o) for o in (None, "predict_proba")]
    names.append(("sk-transform", None))
    return [
        pytest.param(model, output, id=f"{model}-{output or 'default'}") for model, output in names
    ]


def rest_infer(server: Server, model: str, output: str | None) -> httpx.Response:
    X, _ = data(
        "multiclass" if model.endswith("multiclass") or model == "sk-transform" else "binary"
    )
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "input-0",
                "datatype": "FP64",
                "shape": [ROWS, X.shape[1]],
                "data": X[:ROWS].ravel().tolist(),
            }
        ]
    }
    if output is not None:
        body["outputs"] = [{"name": output}]
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def check(
    expected: Expected, name: str, datatype: str, shape: list[int], values: np.ndarray
) -> None:
    assert (name, datatype, shape) == (
        expected.name,
        expected.datatype,
        list(expected.values.shape),
    )
    if datatype == "BYTES":
        assert values.tolist() == expected.values.tolist()
    elif datatype.startswith("FP"):
        np.testing.assert_allclose(values, expected.values, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(values, expected.values)


@pytest.mark.parametrize(("model", "output"), cases())
def test_rest_answers_as_mlserver(
    server: Server, answers: Answers, model: str, output: str | None
) -> None:
    response = rest_infer(server, model, output)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert len(outputs) == 1, outputs
    (tensor,) = outputs
    expected = answers[model][output]
    values = np.asarray(tensor["data"], dtype=object if tensor["datatype"] == "BYTES" else None)
    check(
        expected,
        tensor["name"],
        tensor["datatype"],
        tensor["shape"],
        values.reshape(tensor["shape"]),
    )
    if not model.startswith("mlflow-own"):
        assert tensor.get("parameters", {}).get("content_type") == "np"
    if model.startswith("mlflow-") and not model.startswith("mlflow-own"):
        # MLServer's MLflow runtime labels the response with its codec.
        assert response.json()["parameters"]["content_type"] == "np"


@pytest.mark.parametrize(
    ("model", "output"),
    [
        ("xgb-json-clf-binary", "margin"),
        ("xgb-ubj-booster-multiclass", "predict_proba"),  # MLServer: XGBRegressor has none
        ("sk-joblib-binary", "decision_function"),  # MLServer accepts 3 outputs by name
    ],
)
def test_outputs_mlserver_does_not_offer_are_refused(
    server: Server, model: str, output: str
) -> None:
    response = rest_infer(server, model, output)
    assert response.status_code == 400, response.text
    assert output in response.json()["error"]


def test_metadata_names_the_outputs_mlserver_answers(server: Server) -> None:
    metadata = httpx.get(f"{server.url}/v2/models/xgb-json-clf-multiclass", timeout=10).json()
    assert metadata["outputs"] == [
        {"name": "predict", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "predict_proba", "datatype": "FP32", "shape": [-1, 3]},
    ]
    metadata = httpx.get(f"{server.url}/v2/models/lgb-bst-binary", timeout=10).json()
    assert metadata["outputs"] == [{"name": "predict", "datatype": "FP64", "shape": [-1, 1]}]


@pytest.mark.parametrize(
    ("model", "output"),
    [
        ("lgb-bst-binary", None),
        ("xgb-json-clf-multiclass", "predict_proba"),
        ("xgb-bst-booster-binary", None),
        ("sk-pkl-multiclass", "predict"),
        ("mlflow-multiclass", None),
    ],
)
def test_grpc_answers_as_mlserver(
    server: Server, answers: Answers, model: str, output: str | None
) -> None:
    import grpc

    from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
    from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    X, _ = data("multiclass" if model.endswith("multiclass") else "binary")
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="input-0", datatype="FP64", shape=[ROWS, X.shape[1]])
    tensor.contents.fp64_contents.extend(X[:ROWS].ravel().tolist())
    if output is not None:
        request.outputs.add(name=output)
    with grpc.insecure_channel(server.grpc_address) as channel:
        response = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    (out,) = response.outputs
    contents = list(getattr(out.contents, GRPC_FIELDS[out.datatype]))
    if out.datatype == "BYTES":
        contents = [value.decode() for value in contents]
    values = np.asarray(contents, dtype=object if out.datatype == "BYTES" else None)
    check(
        answers[model][output],
        out.name,
        out.datatype,
        list(out.shape),
        values.reshape(list(out.shape)),
    )
