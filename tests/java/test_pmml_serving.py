"""PMML documents exported from scikit-learn pipelines by sklearn2pmml, served by a live
server in-process (``--workers 0``) and by two workers (each its own JVM): answers over
REST (inputs by name) and gRPC (one tensor) equal JPMML-Evaluator's own call on the same
rows, metadata from the data dictionary, bad input a 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.java.models import IRIS_COLUMNS, pmml_repository, post
from tests.support import Server
from tests.support.grpc import infer_request
from tests.support.runtimes import rows_request

pytest.importorskip("jpype")  # the languages environment's (tox -e languages)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pmml-models")
    pmml_repository(root)
    return root


ROWS_OF = {
    "iris-logreg": np.array([[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3]]),
    "iris-tree": np.array([[5.0, 3.6, 1.4, 0.2], [5.9, 3.0, 5.1, 1.8], [6.0, 2.2, 4.0, 1.0]]),
    "linreg": np.array([[0.1, -0.3, 1.2], [2.0, 0.0, -1.0]]),
}


COLUMNS_OF = {"iris-logreg": IRIS_COLUMNS, "iris-tree": IRIS_COLUMNS, "linreg": ["a", "b", "c"]}
# JPMML-Evaluator's own call (``Evaluator.evaluateAll`` on a DataFrame), in a process of
# its own: this one holds no JVM. Reads [[path, rows, columns], ...], prints each answer.
EVALUATE = """
import json, sys
import pandas as pd
from jpmml_evaluator import make_evaluator
answers = []
for path, rows, columns in json.load(sys.stdin):
    results = make_evaluator(path, backend="jpype").verify().evaluateAll(
        pd.DataFrame(rows, columns=columns)
    )
    answers.append({c: results[c].tolist() for c in results.columns})
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def evaluators_own(root: Path) -> dict[str, dict]:
    """Each PMML model's answers for its ROWS_OF, by JPMML-Evaluator itself."""
    import json
    import subprocess
    import sys

    names = list(ROWS_OF)
    jobs = [[str(root / n / "model.pmml"), ROWS_OF[n].tolist(), COLUMNS_OF[n]] for n in names]
    done = subprocess.run(
        [sys.executable, "-c", EVALUATE],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(zip(names, json.loads(done.stdout.splitlines()[-1]), strict=True))


@pytest.mark.parametrize("name", ["iris-logreg", "iris-tree", "linreg"])
def test_pmml_answers_equal_the_evaluators_own(
    server: Server, evaluators_own: dict, name: str
) -> None:
    rows, columns = ROWS_OF[name], COLUMNS_OF[name]
    # by name over REST, one column per field
    body = {
        "inputs": [
            {"name": c, "datatype": "FP64", "shape": [len(rows)], "data": rows[:, i].tolist()}
            for i, c in enumerate(columns)
        ]
    }
    reply = post(server, name, body)
    assert reply.status_code == 200, reply.text
    answers = {o["name"]: o["data"] for o in reply.json()["outputs"]}
    assert answers == evaluators_own[name]


def test_pmml_over_grpc_as_one_tensor(stub: GRPCInferenceServiceStub, evaluators_own) -> None:
    rows = ROWS_OF["iris-logreg"]
    expected = evaluators_own["iris-logreg"]
    response = stub.ModelInfer(infer_request("iris-logreg", x=rows), timeout=60)
    outputs = {o.name: o for o in response.outputs}
    labels = [v.decode() for v in outputs["species"].contents.bytes_contents]
    assert labels == expected["species"]
    for label in ("setosa", "versicolor", "virginica"):
        name = f"probability({label})"
        assert list(outputs[name].contents.fp64_contents) == expected[name]


def test_pmml_metadata_is_the_data_dictionarys(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/iris-logreg", timeout=10).json()
    assert document["platform"] == "pmml"
    assert [(i["name"], i["datatype"], i["shape"]) for i in document["inputs"]] == [
        (c, "FP64", [-1]) for c in IRIS_COLUMNS
    ]
    assert [(o["name"], o["datatype"]) for o in document["outputs"]] == [
        ("species", "BYTES"),
        ("probability(setosa)", "FP64"),
        ("probability(versicolor)", "FP64"),
        ("probability(virginica)", "FP64"),
    ]


def test_pmml_bad_input_is_a_400(server: Server) -> None:
    reply = post(server, "linreg", rows_request(np.zeros((1, 2))))
    assert reply.status_code == 400
    assert "takes 3 columns ('a', 'b', 'c'), got 2" in reply.json()["error"]
    body = {
        "inputs": [
            {"name": "a", "datatype": "FP64", "shape": [1], "data": [1.0]},
            {"name": "b", "datatype": "FP64", "shape": [1], "data": [1.0]},
        ]
    }
    reply = post(server, "linreg", body)
    assert reply.status_code == 400
    assert "is missing input 'c'" in reply.json()["error"]
