"""Spark MLlib models trained here, served by a live server in-process (``--workers 0``)
and by two workers (each its own local Spark session): a PipelineModel in a plain folder
and one in MLServer's layout, and an RDD-based ``pyspark.mllib`` model in MLServer's
layout (``parameters.format``); answers over REST (columns by name, a ``pd`` request, one
tensor) and gRPC equal the models' own ``transform``/``predict`` in this process;
metadata from the saved stages; broken folders FAILED with one sentence."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from inferpool.runtimes.registry import RUNTIMES, is_fork_safe, runtime_name_for
from inferpool.settings import ModelSettings, read_model_settings
from tests.spark.models import COLUMNS, REGRESSION_COLUMNS, ROWS, build_repository, spark_session
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for

pytest.importorskip("pyspark")  # the spark environment's (tox -e spark)
# Training, then a server's Spark start-ups and loads, fall in the first test's setup.
pytestmark = pytest.mark.timeout(1500)

# A Spark start and a pipeline's first load take a minute each on a busy two-core host.
READY_TIMEOUT = 600
TIMEOUT = 180
STATES = {
    "iris": "READY",
    "petal": "READY",
    "iris-rdd": "READY",
    "spark-mllib": "READY",
    "broken": "FAILED",
    "garbled": "FAILED",
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("spark-models")
    spark = spark_session()
    answers = build_repository(root, spark)
    garbled = root / "garbled" / "metadata"
    garbled.mkdir(parents=True)
    (garbled / "_SUCCESS").write_text("")
    (garbled / "part-00000").write_text("not json\n")
    return root, answers


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, repository) -> Iterator[Server]:
    root, _ = repository
    # A worker busy starting Spark answers no heartbeat: two JVMs starting at once on a
    # busy two-core host took over the default 120 s (docs/runtimes/mllib.md).
    options = ("--no-exit-on-error", "--worker-heartbeat-timeout", "900")
    with Server(root, "--workers", str(request.param), *options) as running:
        running.wait_live(timeout=READY_TIMEOUT)
        _wait_for_states(running)
        yield running


def _wait_for_states(server: Server) -> None:
    import time

    deadline = time.monotonic() + READY_TIMEOUT
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
        states = {entry["name"]: entry["state"] for entry in index}
        if states == STATES:
            return
        time.sleep(0.5)
    raise TimeoutError(f"models are {states}, not {STATES}:\n{server.output()}")


def _post(server: Server, model: str, body: dict) -> dict:
    reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    return {o["name"]: o for o in reply.json()["outputs"]}


def _columns(names: list[str], rows: np.ndarray) -> list[dict]:
    return [
        {"name": name, "datatype": "FP64", "shape": [len(rows)], "data": rows[:, i].tolist()}
        for i, name in enumerate(names)
    ]


def test_the_pipelines_answers_equal_its_own_transform(server: Server, repository) -> None:
    _, answers = repository
    expected = answers["iris"]
    # the columns by name (any order)
    outputs = _post(server, "iris", {"inputs": _columns(COLUMNS, ROWS)[::-1]})
    assert outputs["prediction"]["data"] == expected["prediction"]
    assert outputs["probability"]["shape"] == [len(ROWS), 3]
    probability = np.reshape(outputs["probability"]["data"], (len(ROWS), 3))
    np.testing.assert_allclose(probability, expected["probability"], rtol=1e-12)
    # a pandas-codec request: its columns are the DataFrame's
    body = {"parameters": {"content_type": "pd"}, "inputs": _columns(COLUMNS, ROWS)}
    body["outputs"] = [{"name": "prediction"}]
    outputs = _post(server, "iris", body)
    assert list(outputs) == ["prediction"]
    assert outputs["prediction"]["data"] == expected["prediction"]
    # one [rows, columns] tensor: the columns in the saved order
    tensor = {"name": "x", "datatype": "FP64", "shape": [5, 4], "data": ROWS.ravel().tolist()}
    one = {"inputs": [tensor]}
    assert _post(server, "iris", one)["prediction"]["data"] == expected["prediction"]


def test_a_pipeline_in_mlservers_layout_answers_its_own_transform(server, repository) -> None:
    _, answers = repository
    outputs = _post(server, "petal", {"inputs": _columns(REGRESSION_COLUMNS, ROWS[:, :3])})
    assert list(outputs) == ["prediction"]
    np.testing.assert_allclose(outputs["prediction"]["data"], answers["petal"]["prediction"])


def test_the_mlserver_layout_answers_as_the_mllib_models_predict(server, repository) -> None:
    _, answers = repository
    # MLServer's request: one row, one tensor; its answer: predict, FP32, [1]
    row = {"name": "x", "datatype": "FP64", "shape": [4], "data": ROWS[0].tolist()}
    outputs = _post(server, "iris-rdd", {"inputs": [row]})
    assert outputs["predict"]["datatype"] == "FP32" and outputs["predict"]["shape"] == [1]
    assert outputs["predict"]["data"] == answers["iris-rdd"]["predict"][:1]
    rows = {"name": "x", "datatype": "FP64", "shape": [5, 4], "data": ROWS.ravel().tolist()}
    assert (
        _post(server, "iris-rdd", {"inputs": [rows]})["predict"]["data"]
        == (answers["iris-rdd"]["predict"])
    )


def test_mlservers_own_mllib_example_serves_unchanged(server, repository) -> None:
    """docs/examples/mllib of MLServer 1.7.1: its model-settings.json as it is written
    (``mlserver-mllib.MLlibModel``, ``uri: ./``, version v0.1.0), at the model's name
    and at its version, REST and gRPC."""
    _, answers = repository
    expected = answers["spark-mllib"]
    rows = np.array(expected["rows"])
    tensor = {"name": "x", "datatype": "FP64", "shape": list(rows.shape)}
    body = {"inputs": [{**tensor, "data": rows.ravel().tolist()}]}
    for path in ("spark-mllib", "spark-mllib/versions/v0.1.0"):
        outputs = _post(server, path, body)
        assert outputs["predict"]["data"] == expected["predict"], path
    with stub_for(server) as stub:
        stub: GRPCInferenceServiceStub
        request = infer_request("spark-mllib", x=rows)
        response = stub.ModelInfer(request, timeout=TIMEOUT)
    [output] = response.outputs
    assert list(output.contents.fp32_contents) == expected["predict"]


def test_grpc_answers_equal_the_pipelines_transform(server: Server, repository) -> None:
    _, answers = repository
    with stub_for(server) as stub:
        stub: GRPCInferenceServiceStub
        columns = {name: ROWS[:, i] for i, name in enumerate(COLUMNS)}
        response = stub.ModelInfer(infer_request("iris", **columns), timeout=TIMEOUT)
    outputs = {o.name: o for o in response.outputs}
    assert list(outputs["prediction"].contents.fp64_contents) == answers["iris"]["prediction"]
    probability = np.reshape(outputs["probability"].contents.fp64_contents, (len(ROWS), 3))
    np.testing.assert_allclose(probability, answers["iris"]["probability"], rtol=1e-12)


def test_metadata_is_the_saved_stages(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/iris", timeout=30).json()
    assert document["platform"] == "mllib"
    assert [(i["name"], i["datatype"], i["shape"]) for i in document["inputs"]] == [
        (name, "FP64", [-1]) for name in COLUMNS
    ]
    assert [(o["name"], o["datatype"], o["shape"]) for o in document["outputs"]] == [
        ("prediction", "FP64", [-1]),
        ("probability", "FP64", [-1, 3]),
    ]
    petal = httpx.get(f"{server.url}/v2/models/petal", timeout=30).json()
    assert [i["name"] for i in petal["inputs"]] == REGRESSION_COLUMNS
    assert [o["name"] for o in petal["outputs"]] == ["prediction"]


def test_bad_requests_and_folders_say_why(server: Server) -> None:
    missing = {"inputs": _columns(COLUMNS[:3], ROWS)}
    reply = httpx.post(f"{server.url}/v2/models/iris/infer", json=missing, timeout=TIMEOUT)
    assert reply.status_code == 400
    assert "is missing input 'petal_width'" in reply.json()["error"]
    narrow = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1, 2, 3]}]}
    reply = httpx.post(f"{server.url}/v2/models/iris/infer", json=narrow, timeout=TIMEOUT)
    assert reply.status_code == 400
    assert "takes 4 columns" in reply.json()["error"]
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    reasons = {entry["name"]: entry["reason"] for entry in index}
    assert reasons["garbled"].endswith("is not Spark model metadata (not JSON)")
    # Spark's own refusal, on one line: no Java stack trace
    assert "is not a PipelineModel Spark can load (" in reasons["broken"]
    assert "\n" not in reasons["broken"] and "\tat " not in reasons["broken"]


def test_each_worker_runs_its_own_spark_and_the_template_none(server: Server) -> None:
    import psutil

    request_param = server.process.args[server.process.args.index("--workers") + 1]
    workers = int(request_param)
    main = psutil.Process(server.process.pid)
    jvms = [p for p in main.children(recursive=True) if p.name() == "java"]
    parents = {jvm.parent().pid for jvm in jvms}
    if workers == 0:
        assert parents == {main.pid}  # in-process: the server's own session
        return
    # one JVM per worker, each its worker's child; neither the server nor the template
    assert len(jvms) == workers and len(parents) == workers
    template = {child.pid for child in main.children()}
    assert not parents & (template | {main.pid})
    # the log says how long each worker's Spark took to start
    started = re.findall(r"spark_session \[worker=\d+\]: Spark \S+ started in", server.output())
    assert len(started) >= workers


def test_a_saved_pipeline_folder_is_the_mllib_runtime_and_never_forked(repository) -> None:
    root, _ = repository
    assert runtime_name_for(read_model_settings(root / "iris", "iris")) == "mllib"
    assert runtime_name_for(read_model_settings(root / "iris-rdd", "iris-rdd")) == "mllib"
    assert RUNTIMES["mllib"].preload == () and not RUNTIMES["mllib"].fork_safe
    assert not is_fork_safe(ModelSettings(name="m", runtime="mllib"))
    settings = json.loads((root / "iris-rdd" / "model-settings.json").read_text())
    assert settings["parameters"]["format"] == "LogisticRegression"
