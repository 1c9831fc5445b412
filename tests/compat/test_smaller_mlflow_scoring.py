"""MLflow's scoring server at the root of a single-model server (issue 13, point 5):
``POST /invocations`` in every JSON form and as CSV, ``/ping``, ``/health``, ``/version``,
driven by MLflow's own client, against an sklearn model and an MLflow pyfunc; the answers
are compared with what MLflow's scoring code gives for the same model and body."""

from __future__ import annotations

import io
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.e2e.test_runtime_mlflow import PRICE_MODEL
from tests.support import Server, iris_data, write_sklearn_model

PRICES = pd.DataFrame(
    {"price": [2.5, 4.0, 10.0], "quantity": [2, 3, 1], "city": ["paris", "oslo", "rome"]}
)
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]
MAX_BODY = 1_000_000
COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@pytest.fixture(scope="module")
def classifier():
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    return LogisticRegression(max_iter=1000).fit(X, y)


@pytest.fixture(scope="module")
def sklearn_server(tmp_path_factory, classifier) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("scoring-sklearn")
    write_sklearn_model(root / "iris", classifier)
    with Server(root, "--workers", "1", "--max-body-bytes", str(MAX_BODY)) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="module")
def price_folder(tmp_path_factory) -> Path:
    import mlflow.pyfunc
    from mlflow.models import infer_signature

    root = tmp_path_factory.mktemp("scoring-mlflow")
    expected = pd.DataFrame({"total": PRICES.price * PRICES.quantity, "label": PRICES.city})
    signature = infer_signature(PRICES, expected, params={"discount": 0.0})
    source = root / "price_code.py"
    source.write_text(textwrap.dedent(PRICE_MODEL))
    folder = root / "repo" / "prices"
    mlflow.pyfunc.save_model(
        str(folder), python_model=str(source), signature=signature, pip_requirements=[]
    )
    return folder


@pytest.fixture(scope="module")
def mlflow_server(price_folder: Path) -> Iterator[Server]:
    with Server(price_folder.parent, "--workers", "1") as server:
        server.wait_ready(timeout=120)
        yield server


def mlflow_answer(folder: Path, body: str, content_type: str) -> tuple[int, object]:
    """What MLflow's own scoring code answers for this model and body."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(str(folder))
    schema = model.metadata.get_input_schema()
    result = scoring_server.invocations(body, content_type, model, schema)
    return result.status, json.loads(result.response)


def scoring_client(server: Server):
    from mlflow.pyfunc.scoring_server.client import ScoringServerClient

    return ScoringServerClient("127.0.0.1", server.http_port)


def invoke(server: Server, body: bytes | str, content_type: str = "application/json"):
    return httpx.post(
        server.url + "/invocations",
        content=body,
        headers={"Content-Type": content_type},
        timeout=60,
    )


# -- an sklearn model ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "document",
    [
        {"dataframe_split": {"columns": COLUMNS, "data": ROWS}},
        {"dataframe_split": {"columns": COLUMNS, "data": ROWS, "index": [7, 8, 9]}},
        {"dataframe_records": [dict(zip(COLUMNS, row, strict=True)) for row in ROWS]},
        {"instances": ROWS},
        {"instances": [dict(zip(COLUMNS, row, strict=True)) for row in ROWS]},
        {"inputs": ROWS},
        {"inputs": {"x": ROWS}},
        {"inputs": ROWS, "params": {"ignored": 1}},
    ],
)
def test_every_json_form_predicts_with_an_sklearn_model(sklearn_server, classifier, document):
    response = invoke(sklearn_server, json.dumps(document))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"predictions": classifier.predict(np.array(ROWS)).tolist()}


@pytest.mark.parametrize("content_type", ["text/csv", "text/csv; charset=utf-8"])
def test_csv_predicts_with_an_sklearn_model(sklearn_server, classifier, content_type):
    table = pd.DataFrame(ROWS, columns=COLUMNS).to_csv(index=False)
    response = invoke(sklearn_server, table, content_type)
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": classifier.predict(np.array(ROWS)).tolist()}


def test_mlflows_client_drives_an_sklearn_model(sklearn_server, classifier):
    import mlflow

    client = scoring_client(sklearn_server)
    client.wait_server_ready(timeout=10)
    assert client.get_version() == mlflow.__version__
    frame = pd.DataFrame(ROWS, columns=COLUMNS)
    for data in (frame, np.array(ROWS)):
        answer = client.invoke(data)
        assert answer.get_predictions(predictions_format="ndarray").tolist() == (
            classifier.predict(np.array(ROWS)).tolist()
        )


def test_ping_health_and_version_answer_as_mlflow(sklearn_server):
    import mlflow

    for path in ("/ping", "/health"):
        response = httpx.get(sklearn_server.url + path)
        assert response.status_code == 200
        assert response.text == "\n"
        assert response.headers["content-type"] == "application/json"
    response = httpx.get(sklearn_server.url + "/version")
    assert (response.status_code, response.text) == (200, mlflow.__version__)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{nope", "the body is not valid JSON"),
        (b"[1, 2]", "expected a JSON object with one of"),
        (b'{"rows": [[1]]}', "expected exactly one of"),
        (b'{"inputs": [[1]], "instances": [[1]]}', "expected exactly one of"),
        (b'{"inputs": [[1, 2], [3]]}', "cannot read inputs"),
        (b'{"dataframe_split": {"columns": ["a"]}}', "cannot read dataframe_split"),
        (b'{"dataframe_split": {"data": [[1]], "evil": 1}}', "cannot read dataframe_split"),
        (b'{"dataframe_records": 5}', "cannot read dataframe_records"),
        (b'{"inputs": [[1]], "params": [1]}', "'params' must be a JSON object"),
        (b'{"inputs": ' + b"[" * 200 + b"]" * 200 + b"}", "nested deeper than"),
        (b'{"inputs": [[1.0, 2.0]]}', "expects 4 features"),
        (b'{"inputs": [["a", "b", "c", "d"]]}', "iris"),
    ],
)
def test_bad_json_is_a_400_in_mlflows_error_form(sklearn_server, body, message):
    response = invoke(sklearn_server, body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["error_code"] == "BAD_REQUEST"
    assert message in error["message"]


def test_bad_csv_is_a_400(sklearn_server):
    for body in (b"\xff\xfe\x00", b'a,b\n"1,2\n', b""):
        response = invoke(sklearn_server, body, "text/csv")
        assert response.status_code == 400, response.text
        assert response.json()["error_code"] == "BAD_REQUEST"


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        ("text/plain", "This predictor only supports the following content types"),
        ("", "This predictor only supports the following content types"),
        ("application/json; charset=latin-1", "The scoring server only supports UTF-8"),
        ("application/json; format=pandas-split", "Unrecognized content type parameters: format"),
    ],
)
def test_an_unsupported_content_type_is_415_in_plain_text(sklearn_server, content_type, message):
    response = httpx.post(
        sklearn_server.url + "/invocations",
        content=b'{"inputs": [[1, 2, 3, 4]]}',
        headers={"Content-Type": content_type},
    )
    assert response.status_code == 415
    assert response.headers["content-type"].startswith("text/plain")
    assert message in response.text


def test_a_body_over_the_limit_is_413(sklearn_server):
    def chunks() -> Iterator[bytes]:  # no Content-Length: the route itself cuts it
        yield b'{"inputs": ['
        for _ in range(MAX_BODY // 50_000):
            yield b"1.0, " * 10_000
        yield b"1.0]}"

    response = httpx.post(
        sklearn_server.url + "/invocations",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error_code"] == "BAD_REQUEST"


# -- an MLflow pyfunc ---------------------------------------------------------------------
def test_mlflows_client_with_params_answers_as_mlflow(mlflow_server, price_folder):
    client = scoring_client(mlflow_server)
    client.wait_server_ready(timeout=10)
    answer = client.invoke(PRICES, params={"discount": 0.5})
    body = json.dumps(
        {"dataframe_split": PRICES.to_dict(orient="split"), "params": {"discount": 0.5}}
    )
    status, expected = mlflow_answer(price_folder, body, "application/json")
    assert status == 200
    assert answer == expected
    assert [row["total"] for row in answer["predictions"]] == [2.5, 6.0, 5.0]


@pytest.mark.parametrize(
    "document",
    [
        {"dataframe_split": PRICES.to_dict(orient="split")},
        {"dataframe_records": PRICES.to_dict(orient="records")},
        {"inputs": PRICES.to_dict(orient="list")},
    ],
)
def test_each_json_form_to_a_pyfunc_answers_as_mlflow(mlflow_server, price_folder, document):
    body = json.dumps(document)
    response = invoke(mlflow_server, body)
    assert (response.status_code, response.json()) == mlflow_answer(
        price_folder, body, "application/json"
    )


def test_csv_to_a_pyfunc_answers_as_mlflow(mlflow_server, price_folder):
    table = PRICES.to_csv(index=False)
    response = invoke(mlflow_server, table, "text/csv")
    assert (response.status_code, response.json()) == mlflow_answer(price_folder, table, "text/csv")
    frame = pd.read_json(io.StringIO(json.dumps(response.json()["predictions"])))
    assert frame["label"].tolist() == ["PARIS", "OSLO", "ROME"]


def test_a_pyfunc_refusing_its_input_is_a_400(mlflow_server):
    response = invoke(mlflow_server, json.dumps({"dataframe_records": [{"price": 1.0}]}))
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "BAD_REQUEST"


# -- a server of several models -----------------------------------------------------------
@pytest.mark.parametrize("path", ["/ping", "/health", "/version", "/invocations"])
def test_a_server_of_several_models_answers_404_with_the_reason(iris_server, path):
    if path == "/invocations":
        response = invoke(iris_server, json.dumps({"inputs": ROWS}))
    else:
        response = httpx.get(iris_server.url + path)
    assert response.status_code == 404
    error = response.json()
    assert error["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    assert error["message"] == (
        "MLflow's scoring endpoints answer for the server's only model or its only MLflow "
        "model; this one serves 2 models (iris-logreg, iris-rf), none of them MLflow's: use "
        "/v2/models/{name}/invocations"
    )


def test_the_v2_custom_route_gives_any_model_the_scoring_protocol(iris_server, classifier):
    response = httpx.post(
        iris_server.url + "/v2/models/iris-logreg/invocations", json={"inputs": ROWS}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": classifier.predict(np.array(ROWS)).tolist()}


def test_the_scoring_formats_are_mlflows():
    from mlflow.pyfunc import scoring_server

    from inferpool.protocol.mlflow_endpoints import FORMATS

    assert set(FORMATS) == set(scoring_server.SUPPORTED_FORMATS)
