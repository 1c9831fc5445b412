"""Java and PMML models served by a live server, in-process (``--workers 0``) and by two
workers, each starting its own JVM after the fork (the template starts none): answers over
REST and gRPC equal Java's own call and JPMML-Evaluator's own on the same rows; a model
in a jar of its own loads in a JVM already started; Java's IllegalArgumentException is a
400, any other exception a 500, and the workers keep serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.java.models import IRIS_COLUMNS, java_answers, java_repository, pmml_repository
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for
from tests.support.pool import live_workers, template_pid
from tests.support.runtimes import output_array, rows_request

pytest.importorskip("jpype")  # the java environment's (tox -e java)

ROWS = np.array([[0.5, 1.0, -2.0], [3.0, 0.25, 8.0], [-1.5, 2.0, 0.0]])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jvm-models")
    java_repository(root)
    pmml_repository(root)
    return root


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, root: Path) -> Iterator[Server]:
    with Server(root, "--workers", str(request.param)) as running:
        running.wait_ready(timeout=240)
        running.workers = request.param  # type: ignore[attr-defined]
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as connected:
        yield connected


def post(server: Server, model: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)


def test_rest_answers_equal_javas_own(server: Server, root: Path) -> None:
    reply = post(server, "linear", rows_request(ROWS, name="x"))
    assert reply.status_code == 200, reply.text
    expected = java_answers(root / "linear" / "demo.jar", "demo.Linear", ROWS)
    np.testing.assert_array_equal(output_array(reply.json(), "y"), expected)


def test_grpc_answers_equal_javas_own(stub: GRPCInferenceServiceStub, root: Path) -> None:
    response = stub.ModelInfer(infer_request("linear", x=ROWS), timeout=60)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("y", "FP64", [3, 1])
    expected = java_answers(root / "linear" / "demo.jar", "demo.Linear", ROWS)
    np.testing.assert_array_equal(np.array(output.contents.fp64_contents), expected.ravel())


def test_metadata_is_the_classes(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/linear", timeout=10).json()
    assert document["platform"] == "java"
    assert document["inputs"] == [{"name": "x", "datatype": "FP64", "shape": [-1, 3]}]
    assert document["outputs"] == [{"name": "y", "datatype": "FP64", "shape": [-1, 1]}]


def test_a_second_jar_loads_in_a_running_jvm_and_fp32_stays_fp32(server: Server) -> None:
    # linear (the folder's jar) and square (another jar, named by uri) share each
    # worker's JVM: whichever loaded second did so after the JVM had started.
    rows = np.array([[1.5, -2.0], [3.0, 0.5]], dtype=np.float32)
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": rows.ravel().tolist()}
        ]
    }
    reply = post(server, "square", body)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["datatype"] == "FP32"
    np.testing.assert_array_equal(output_array(reply.json(), "output-0"), rows * rows)


def test_strings_cross_as_a_string_array(server: Server, stub: GRPCInferenceServiceStub) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["ab", "Cd"]}]}
    reply = post(server, "upper", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == ["AB", "CD"]
    request = pb.ModelInferRequest(model_name="upper")
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"x"
    )
    response = stub.ModelInfer(request, timeout=60)
    assert list(response.outputs[0].contents.bytes_contents) == [b"X"]


def test_illegal_argument_is_a_400_other_exceptions_a_500(
    server: Server, stub: GRPCInferenceServiceStub
) -> None:
    workers = live_workers(server) if server.workers else set()  # type: ignore[attr-defined]
    reply = post(server, "linear", rows_request(np.zeros((1, 2)), name="x"))
    assert reply.status_code == 400
    assert "expected 3 features, got 2" in reply.json()["error"]
    reply = post(server, "linear", rows_request(np.array([[-999.0, 1.0, 2.0]]), name="x"))
    assert reply.status_code == 500
    assert reply.json()["error"] == (
        "model 'linear' raised java.lang.IllegalStateException: the model broke on row 0"
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(infer_request("linear", x=np.zeros((1, 4))), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected 3 features, got 4" in refused.value.details()
    reply = post(server, "linear", rows_request(ROWS, name="x"))
    assert reply.status_code == 200
    if server.workers:  # type: ignore[attr-defined]
        assert live_workers(server) == workers  # no worker was lost


def jvm_mapped(pid: int) -> bool:
    return "libjvm.so" in Path(f"/proc/{pid}/maps").read_text()


def test_each_worker_runs_a_jvm_the_template_none(server: Server) -> None:
    if not server.workers:  # type: ignore[attr-defined]
        assert jvm_mapped(server.process.pid)  # --workers 0: the JVM is in the server
        return
    for _ in range(4):  # requests reach both workers
        assert post(server, "linear", rows_request(ROWS, name="x")).status_code == 200
    workers = live_workers(server)
    assert len(workers) == 2
    assert all(jvm_mapped(pid) for pid in workers)
    assert not jvm_mapped(template_pid(server.process.pid))
    assert not jvm_mapped(server.process.pid)


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
