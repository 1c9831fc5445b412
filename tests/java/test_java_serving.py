"""Java models served by a live server, in-process (``--workers 0``) and by two workers,
each starting its own JVM after the fork (the template starts none), which also hosts the
worker's PMML model: answers over REST and gRPC equal Java's own call on the same rows; a
model in a jar of its own loads in a JVM already started; Java's IllegalArgumentException
is a 400, any other exception a 500, and the workers keep serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.java.models import java_answers, java_repository, pmml_repository, post
from tests.support import Server
from tests.support.grpc import infer_request
from tests.support.pool import live_workers, template_pid
from tests.support.runtimes import output_array, rows_request

pytest.importorskip("jpype")  # the languages environment's (tox -e languages)

ROWS = np.array([[0.5, 1.0, -2.0], [3.0, 0.25, 8.0], [-1.5, 2.0, 0.0]])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("java-models")
    java_repository(root)
    pmml_repository(root, ["linreg"])  # a PMML model in the same JVM as the Java ones
    return root


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


def test_java_and_pmml_models_share_a_workers_jvm(server: Server) -> None:
    for _ in range(4):  # both workers, each holding linear, square, upper and linreg
        assert post(server, "linear", rows_request(ROWS, name="x")).status_code == 200
        reply = post(server, "linreg", rows_request(ROWS))
        assert reply.status_code == 200, reply.text


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
