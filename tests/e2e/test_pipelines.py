"""Inference pipelines end to end (engine/pipelines), over REST and gRPC, with --workers 0
and 2: a chain of three steps (a custom runtime twice, then a scikit-learn regressor), a
router by a classifier's output and one by a request parameter, aggregators (mean of two
regressors, vote of three classifiers), a failing step named in the error with the
child's status, the children's and the pipeline's statistics, a span per step, load
errors (unknown child, cycles, outputs that do not exist, a malformed step) through the
repository API, and a pipeline whose child is unloaded or failed turning UNAVAILABLE,
answering as the child would (404 / 503) naming the step, while the server stays ready,
and READY again once the child is loaded.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from inferpool.demo import build_demo_repository
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, iris_data
from tests.support.grpc import WORKER_COUNTS, infer_request
from tests.support.otlp import Received, exporter_env, http_receiver
from tests.support.pipelines import build_pipeline_repository, expected_vote, write_pipeline

pytestmark = pytest.mark.timeout(180)

X, Y = iris_data()
# Two setosa rows (class 0) and two versicolor rows (class 1), which clf-b tells apart.
SETOSA, VERSICOLOR = X[:2], X[50:52]
MIXED = X[[0, 1, 60, 120, 140]]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Received]]:
    with http_receiver() as found:
        yield found


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def setup(
    request: pytest.FixtureRequest,
    receiver: tuple[str, Received],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, dict[str, Any], Path, GRPCInferenceServiceStub]]:
    root = tmp_path_factory.mktemp("pipelines")
    models = build_pipeline_repository(root)
    build_demo_repository(root)  # the guide's example: its models and its pipeline
    (root / "iris-soft-vote").mkdir()
    (root / "iris-soft-vote" / "model-settings.json").write_text(readme_pipeline())
    flags = ["--workers", str(request.param), "--model-control-mode", "explicit", "--tracing"]
    env = exporter_env("http/protobuf", receiver[0])
    with Server(root, *flags, env=env) as server:
        server.wait_ready(timeout=120)
        with grpc.insecure_channel(server.grpc_address) as channel:
            yield server, models, root, GRPCInferenceServiceStub(channel)


def readme_section() -> str:
    """The example of the pipelines guide (docs/pipelines.md, "Example")."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    return text.split("\n## Example\n", 1)[1].split("\n## ", 1)[0]


def readme_pipeline() -> str:
    """The settings the guide's example writes."""
    return re.search(r"<<'JSON'\n(.*?)\nJSON\n", readme_section(), flags=re.S)[1]


def rest_infer(server: Server, model: str, rows: np.ndarray, **extra: Any) -> httpx.Response:
    tensor = {"name": "x", "datatype": "FP64", "shape": list(rows.shape)}
    body = {"inputs": [{**tensor, "data": rows.ravel().tolist()}], **extra}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def rest_output(server: Server, model: str, rows: np.ndarray, **extra: Any) -> np.ndarray:
    reply = rest_infer(server, model, rows, **extra)
    assert reply.status_code == 200, reply.text
    document = reply.json()
    assert document["model_name"] == model
    assert document["id"]  # one is made when the request has none
    (output,) = document["outputs"]
    return np.array(output["data"]).reshape(output["shape"])


def grpc_output(
    stub: GRPCInferenceServiceStub, model: str, rows: np.ndarray, raw: bool = False, **params: str
) -> np.ndarray:
    request = infer_request(model, x=rows)
    if raw:  # the same rows as raw contents: the reply answers raw too
        del request.inputs[0].contents.fp64_contents[:]
        request.raw_input_contents.append(rows.astype("<f8").tobytes())
    for key, value in params.items():
        request.parameters[key].string_param = value
    response = stub.ModelInfer(request, timeout=30)
    assert response.model_name == model
    (output,) = response.outputs
    if raw:
        dtype = {"FP64": "<f8", "INT64": "<i8"}[output.datatype]
        data = np.frombuffer(response.raw_output_contents[0], dtype=dtype)
    elif output.datatype == "INT64":
        data = np.array(output.contents.int64_contents)
    else:
        data = np.array(output.contents.fp64_contents)
    return data.reshape(list(output.shape))


def both(setup, model: str, rows: np.ndarray, **params: str) -> list[np.ndarray]:
    """The pipeline's one output over REST, gRPC typed and gRPC raw."""
    server, _, _, stub = setup
    extra = {"parameters": params} if params else {}
    return [
        rest_output(server, model, rows, **extra),
        grpc_output(stub, model, rows, **params),
        grpc_output(stub, model, rows, raw=True, **params),
    ]


def stats(server: Server, model: str) -> dict[str, Any]:
    reply = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=10)
    assert reply.status_code == 200, reply.text
    (entry,) = reply.json()["model_stats"]
    return entry


def test_a_chain_feeds_each_step_from_the_one_before(setup) -> None:
    _, models, _, _ = setup
    expected = models["reg-a"].predict(X[:7] * 4.0)  # scaled by 2, twice, then regressed
    for answer in both(setup, "chain", X[:7]):
        np.testing.assert_allclose(answer, expected, rtol=1e-9)


def test_a_pipeline_has_metadata_of_its_own(setup) -> None:
    server, _, _, stub = setup
    document = httpx.get(f"{server.url}/v2/models/chain", timeout=10).json()
    assert document["platform"] == "inferpool_pipeline"
    assert document["state"] == "READY"
    # Derived: the first step's declared input, the last step's default output.
    assert document["inputs"] == [{"name": "x", "datatype": "FP64", "shape": [-1, 4]}]
    assert [output["name"] for output in document["outputs"]] == ["predict"]
    assert document["parameters"]["steps"] == ["first", "second", "reg-a"]
    metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="chain"), timeout=10)
    assert metadata.platform == "inferpool_pipeline"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("x", "FP64", [-1, 4])
    ]
    assert stub.ModelReady(pb.ModelReadyRequest(name="chain"), timeout=10).ready


def test_a_router_follows_a_classifiers_output(setup) -> None:
    _, models, _, _ = setup
    for rows, chosen in ((SETOSA, "reg-a"), (VERSICOLOR, "reg-b")):
        expected = models[chosen].predict(rows)
        for answer in both(setup, "route-by-class", rows):
            np.testing.assert_allclose(answer, expected, rtol=1e-9)


def test_rows_that_choose_different_branches_are_refused(setup) -> None:
    server, _, _, stub = setup
    reply = rest_infer(server, "route-by-class", np.vstack([SETOSA, VERSICOLOR]))
    assert reply.status_code == 400
    message = reply.json()["error"]
    assert message.startswith("pipeline 'route-by-class', step 2 ('regress'): ")
    assert "chooses several branches (0, 1)" in message
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(infer_request("route-by-class", x=np.vstack([SETOSA, VERSICOLOR])))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == message


def test_a_router_follows_a_request_parameter(setup) -> None:
    server, models, _, _ = setup
    for tier, chosen in (("gold", "reg-a"), ("silver", "reg-b")):
        expected = models[chosen].predict(X[:5])
        for answer in both(setup, "route-by-tier", X[:5], tier=tier):
            np.testing.assert_allclose(answer, expected, rtol=1e-9)
    reply = rest_infer(server, "route-by-tier", X[:5], parameters={"tier": "bronze"})
    assert reply.status_code == 400
    assert reply.json()["error"] == (
        "pipeline 'route-by-tier', step 1 ('pick'): no branch for 'bronze' "
        "(branches: 'gold', 'silver')"
    )


def test_an_aggregator_averages_regressors(setup) -> None:
    _, models, _, _ = setup
    expected = (models["reg-a"].predict(MIXED) + models["reg-b"].predict(MIXED)) / 2
    for answer in both(setup, "mean", MIXED):
        np.testing.assert_allclose(answer, expected, rtol=1e-9)


def test_an_aggregator_takes_the_classifiers_vote(setup) -> None:
    _, models, _, _ = setup
    rows = X[::10]  # every class: two-to-one majorities and three-way ties
    expected = expected_vote(models, rows)
    assert len(set(expected.tolist())) > 1
    for answer in both(setup, "vote", rows):
        np.testing.assert_array_equal(answer, expected)


def test_a_failing_step_is_named_with_the_childs_status(setup) -> None:
    server, _, _, stub = setup
    rows = X[:2].copy()
    rows[1, 0] = -1.0
    reply = rest_infer(server, "chain", rows)
    assert reply.status_code == 400
    message = "pipeline 'chain', step 1 ('first'): negative values cannot be scaled"
    assert reply.json() == {"error": message}
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(infer_request("chain", x=rows), timeout=30)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == message
    # A missing input of the pipeline's own is the caller's error too, naming the step.
    body = {"inputs": [{"name": "y", "datatype": "FP64", "shape": [1, 4], "data": [1] * 4}]}
    reply = httpx.post(f"{server.url}/v2/models/route-by-class/infer", json=body, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"] == (
        "pipeline 'route-by-class', step 1 ('clf-b'): pipeline 'route-by-class' needs the "
        "input 'x' (the request has 'y')"
    )


def test_children_count_their_calls_and_the_pipeline_its_own(setup) -> None:
    server, _, _, stub = setup
    before = {name: stats(server, name) for name in ("chain", "scale", "reg-a")}
    assert rest_infer(server, "chain", X[:3]).status_code == 200
    after = {name: stats(server, name) for name in ("chain", "scale", "reg-a")}

    def successes(name: str) -> int:
        return (
            after[name]["inference_stats"]["success"]["count"]
            - before[name]["inference_stats"]["success"]["count"]
        )

    assert successes("chain") == 1
    assert successes("scale") == 2  # the chain's first and second steps
    assert successes("reg-a") == 1
    assert after["chain"]["inference_count"] - before["chain"]["inference_count"] == 3
    # The same counts over gRPC, after a gRPC request.
    grpc_output(stub, "chain", X[:2])
    for name, calls in (("chain", 1), ("scale", 2), ("reg-a", 1)):
        answer = stub.ModelStatistics(pb.ModelStatisticsRequest(name=name), timeout=10)
        (entry,) = answer.model_stats
        assert entry.inference_stats.success.count == (
            after[name]["inference_stats"]["success"]["count"] + calls
        )


def test_each_step_has_a_span(setup, receiver: tuple[str, Received]) -> None:
    server, _, _, stub = setup
    _, received = receiver
    for protocol in ("rest", "grpc"):
        trace_id, parent_id = random.getrandbits(128) | 1, random.getrandbits(64) | 1
        traceparent = f"00-{trace_id:032x}-{parent_id:016x}-01"
        if protocol == "rest":
            tensor = {"name": "x", "datatype": "FP64", "shape": [2, 4]}
            body = {"inputs": [{**tensor, "data": X[:2].ravel().tolist()}]}
            reply = httpx.post(
                f"{server.url}/v2/models/chain/infer",
                json=body,
                headers={"traceparent": traceparent},
                timeout=30,
            )
            assert reply.status_code == 200
        else:
            stub.ModelInfer(
                infer_request("chain", x=X[:2]),
                metadata=[("traceparent", traceparent)],
                timeout=30,
            )
        # The request, three steps, and four stages under each step.
        spans = received.trace(trace_id, 1 + 3 + 3 * 4, timeout=20)
        (request,) = [span for span in spans if span.parent_id == parent_id]
        steps = sorted(
            (span for span in spans if span.parent_id == request.span_id),
            key=lambda span: span.start_ns,
        )
        assert [span.name for span in steps] == ["step first", "step second", "step reg-a"]
        assert [span.attributes["inferpool.model.name"] for span in steps] == [
            "scale",
            "scale",
            "reg-a",
        ]
        for before, after in itertools.pairwise(steps):
            assert before.end_ns <= after.start_ns  # one after the other
        for step in steps:
            assert request.start_ns <= step.start_ns <= step.end_ns <= request.end_ns
            stages = {span.name for span in spans if span.parent_id == step.span_id}
            assert stages == {"queue", "decode", "predict", "encode"}


def api_load(server: Server, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=60)


@pytest.mark.parametrize(
    ("name", "pipeline", "reason"),
    [
        (
            "unknown-child",
            {"steps": [{"model": "scale"}, {"model": "nowhere"}]},
            "pipeline 'unknown-child', step 2 ('nowhere'): model 'nowhere' is not loaded",
        ),
        (
            "selfish",
            {"steps": [{"model": "scale"}, {"model": "selfish"}]},
            "pipeline 'selfish' forms a cycle: selfish -> selfish",
        ),
        (
            "cycle-a",
            {"steps": [{"model": "cycle-b"}]},
            "pipeline 'cycle-a' forms a cycle: cycle-a -> cycle-b -> cycle-a",
        ),
        (
            "no-such-output",
            {"steps": [{"model": "clf-b", "outputs": ["nope"]}]},
            "pipeline 'no-such-output', step 1 ('clf-b'): model 'clf-b' has no output 'nope' "
            "(its metadata lists 'predict', 'predict_proba', 'decision_function')",
        ),
        (
            "bad-reference",
            {"steps": [{"model": "scale"}, {"model": "reg-a", "inputs": {"x": "scale.nope"}}]},
            "pipeline 'bad-reference', step 2 ('reg-a'), input 'x': step 'scale' has no "
            "'nope' (it has 'scaled')",
        ),
        (
            "later-step",
            {"steps": [{"model": "reg-a", "inputs": {"x": "scale.scaled"}}, {"model": "scale"}]},
            "pipeline 'later-step', step 1 ('reg-a'), input 'x': 'scale.scaled' names no "
            "earlier step (steps before it: none)",
        ),
    ],
)
def test_load_errors_name_the_step(setup, name: str, pipeline: dict, reason: str) -> None:
    server, _, root, stub = setup
    write_pipeline(root, name, pipeline)
    if name == "cycle-a":
        write_pipeline(root, "cycle-b", {"steps": [{"model": "cycle-a"}]})
    reply = api_load(server, name)
    assert reply.status_code == 500
    assert reply.json()["error"] == f"model '{name}' failed to load: {reason}"
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=60)
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert reason in caught.value.details()
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    (entry,) = [entry for entry in index if entry["name"] == name]
    assert entry["state"] == "FAILED"
    assert entry["reason"] == reason
    httpx.post(f"{server.url}/v2/repository/models/{name}/unload", timeout=60)
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_a_malformed_step_is_a_settings_error(setup) -> None:
    server, _, root, _ = setup
    folder = write_pipeline(root, "malformed", {"steps": [{"model": "scale", "route": {}}]})
    reply = api_load(server, "malformed")
    assert reply.status_code == 400
    message = reply.json()["error"]
    assert str(folder / "model-settings.json") in message
    assert "pipeline.steps.0" in message
    json.loads((folder / "model-settings.json").read_text())  # valid JSON, bad format


def test_a_pipeline_is_ready_when_its_children_are(setup) -> None:
    server, models, _, stub = setup
    reason = "pipeline 'mean', step 1 ('avg'): model 'reg-b' is UNAVAILABLE: unloaded"
    assert httpx.post(f"{server.url}/v2/repository/models/reg-b/unload", timeout=60).is_success
    try:
        ready = httpx.get(f"{server.url}/v2/models/mean/ready", timeout=10)
        assert ready.status_code == 503
        assert not stub.ModelReady(pb.ModelReadyRequest(name="mean"), timeout=10).ready
        document = httpx.get(f"{server.url}/v2/models/mean", timeout=10).json()
        assert (document["state"], document["reason"]) == ("UNAVAILABLE", reason)
        index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        assert {"name": "mean", "state": "UNAVAILABLE", "reason": reason} in index
        # It answers as its member does: unloaded on purpose is a 404 naming the member.
        error = "pipeline 'mean', step 1 ('avg'): model 'reg-b' was unloaded (load it again"
        reply = rest_infer(server, "mean", X[:2])
        assert reply.status_code == 404
        assert reply.json()["error"] == f"{error} to serve it)"
        assert "retry-after" not in reply.headers
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(infer_request("mean", x=X[:2]), timeout=30)
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        assert caught.value.details() == f"{error} to serve it)"
        # The member was unloaded on purpose: the server stays ready, as for any model.
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        # A pipeline not calling it serves on.
        assert rest_infer(server, "chain", X[:2]).status_code == 200
    finally:
        assert api_load(server, "reg-b").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/mean/ready", timeout=10).status_code == 200
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    assert {"name": "mean", "state": "READY", "reason": ""} in index
    expected = (models["reg-a"].predict(X[:2]) + models["reg-b"].predict(X[:2])) / 2
    np.testing.assert_allclose(rest_output(server, "mean", X[:2]), expected, rtol=1e-9)
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_a_pipeline_whose_member_failed_names_it_and_comes_back(setup) -> None:
    server, models, root, stub = setup
    artefact = root / "reg-b" / "model.joblib"
    kept = artefact.read_bytes()
    assert httpx.post(f"{server.url}/v2/repository/models/reg-b/unload", timeout=60).is_success
    try:
        artefact.write_bytes(b"not a pickle")
        assert api_load(server, "reg-b").status_code == 500
        index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        (entry,) = [entry for entry in index if entry["name"] == "mean"]
        step = "pipeline 'mean', step 1 ('avg'): model 'reg-b' failed to load: "
        assert entry["state"] == "UNAVAILABLE" and entry["reason"].startswith(step)
        # A failed member is a 503 naming it (not a 404: it is meant to serve).
        reply = rest_infer(server, "mean", X[:2])
        assert reply.status_code == 503
        assert reply.json()["error"] == entry["reason"]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(infer_request("mean", x=X[:2]), timeout=30)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert caught.value.details().startswith(step)
    finally:
        artefact.write_bytes(kept)
        assert api_load(server, "reg-b").status_code == 200
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    assert {"name": "mean", "state": "READY", "reason": ""} in index
    expected = (models["reg-a"].predict(X[:2]) + models["reg-b"].predict(X[:2])) / 2
    np.testing.assert_allclose(rest_output(server, "mean", X[:2]), expected, rtol=1e-9)


def test_the_readme_example_answers_the_mean_of_the_probabilities(setup) -> None:
    server, _, root, stub = setup
    import joblib

    row = np.array([[5.1, 3.5, 1.4, 0.2]])
    expected = np.mean(
        [
            joblib.load(root / m / "model.joblib").predict_proba(row)
            for m in ("iris-logreg", "iris-rf")
        ],
        axis=0,
    )
    curl = re.findall(r"```sh\n(curl .*?)```", readme_section(), flags=re.S)[0]
    argv = shlex.split(curl.replace("8080", str(server.http_port)).replace("\\\n", " "))
    answer = json.loads(subprocess.run(argv, capture_output=True, check=True).stdout)
    (output,) = answer["outputs"]
    assert output["shape"] == [1, 3]
    np.testing.assert_allclose(np.array(output["data"]).reshape(1, 3), expected, rtol=1e-9)
    response = stub.ModelInfer(infer_request("iris-soft-vote", x=row), timeout=30)
    np.testing.assert_allclose(response.outputs[0].contents.fp64_contents, expected.ravel())
