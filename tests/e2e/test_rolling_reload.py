"""Rolling reloads through the repository API fail no request, and a failed reload keeps
the previous version serving.

A 64-way load (32 REST clients over httpx, 32 gRPC clients over grpc.aio) runs while a
scikit-learn model (fork-safe: with workers, the template loads each changed version and a
new generation of workers takes over) and a custom runtime (each worker loads its own, beside
its old copy) are reloaded again and again through the API, in-process
(``--workers 0``) and with a pool of two; ``/v2/health/ready`` is polled meanwhile. Every
request is answered 200 and readiness never leaves 200. The 20-reload runs wait by design
(``slow``, as does every test on the in-process server: the CI budget); a short one (5
reloads, REST, 2 workers) and the failed reload with 2 workers run by default.

A reload of a broken artefact answers the API with the reason (500 / INTERNAL, as our
other failed loads; MLServer answers 500 too, Triton 400), says so in the log, leaves the
previous version READY and serving (reason ``reload failed: ...``) with the server ready,
and a repaired folder's reload clears the reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.grpc import needs_pool
from tests.support.pool import write_counting_model

IRIS = "iris-logreg"  # scikit-learn: fork-safe
CUSTOM = "counting"  # a custom runtime: loaded by each worker itself
REST_BODIES = {
    IRIS: {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]},
    CUSTOM: {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}]},
}

WORKERS = [pytest.param(0, marks=pytest.mark.slow), pytest.param(2, marks=needs_pool)]


def grpc_request(model: str) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    width, kind = (4, "fp32_contents") if model == IRIS else (3, "fp64_contents")
    tensor = request.inputs.add(name="x", datatype="FP32" if model == IRIS else "FP64")
    tensor.shape.extend([1, width])
    getattr(tensor.contents, kind).extend(float(v) for v in range(1, width + 1))
    return request.SerializeToString()


@pytest.fixture(scope="module", params=WORKERS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("rolling")
    repository = build_iris_repository(root / "models")
    write_counting_model(repository, CUSTOM, root / "calls")
    shutil.copytree(repository / IRIS, repository / "fragile")
    with Server(repository, "--workers", str(request.param)) as server:
        server.wait_ready(120)
        server.repository = repository
        server.workers = request.param
        yield server


@dataclass
class Outcome:
    answers: Counter = field(default_factory=Counter)  # 200, else the failure's text
    readiness: Counter = field(default_factory=Counter)  # /v2/health/ready's statuses
    reloads: Counter = field(default_factory=Counter)  # per model, reloads answered 200


async def rolling(
    server: Server, models: list[str], reloads: int, rest: int, grpc_clients: int
) -> Outcome:
    """``rest`` + ``grpc_clients`` clients send requests (to ``models`` in turn) while each
    model is reloaded ``reloads`` times, one reload after another per model."""
    outcome = Outcome()
    done = asyncio.Event()
    requests = {model: grpc_request(model) for model in models}
    limits = httpx.Limits(max_connections=rest + 2, max_keepalive_connections=rest + 2)
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client,
        grpc.aio.insecure_channel(server.grpc_address) as channel,
    ):
        stub = GRPCInferenceServiceStub(channel)

        async def send_rest(turn: int) -> None:
            while not done.is_set():
                model = models[turn % len(models)]
                turn += 1
                reply = await client.post(f"/v2/models/{model}/infer", json=REST_BODIES[model])
                code = reply.status_code
                outcome.answers[200 if code == 200 else f"REST {code} {reply.text}"] += 1

        async def send_grpc(turn: int) -> None:
            while not done.is_set():
                model = models[turn % len(models)]
                turn += 1
                request = pb.ModelInferRequest.FromString(requests[model])
                try:
                    await stub.ModelInfer(request, timeout=60)
                except grpc.aio.AioRpcError as error:
                    outcome.answers[f"gRPC {error.code().name} {error.details()}"] += 1
                else:
                    outcome.answers[200] += 1

        async def poll_ready() -> None:
            while not done.is_set():
                reply = await client.get("/v2/health/ready")
                outcome.readiness[reply.status_code] += 1
                await asyncio.sleep(0.05)

        async def reload(model: str) -> None:
            await asyncio.sleep(0.3)  # the load is under way first
            for _ in range(reloads):
                changed(server.repository / model)
                reply = await client.post(f"/v2/repository/models/{model}/load", timeout=120)
                assert reply.status_code == 200, reply.text
                outcome.reloads[model] += 1

        senders = [asyncio.create_task(send_rest(i)) for i in range(rest)]
        senders += [asyncio.create_task(send_grpc(i)) for i in range(grpc_clients)]
        senders.append(asyncio.create_task(poll_ready()))
        try:
            await asyncio.gather(*(reload(model) for model in models))
            await asyncio.sleep(0.3)  # requests sent to the last reload's new replicas
        finally:
            done.set()
            await asyncio.gather(*senders)
    return outcome


def changed(folder: Path) -> None:
    """Every file of ``folder`` is newer: a reload of changed files (with workers, the
    template loads the fork-safe model again and a new generation of workers takes over;
    unchanged files would keep the template's copy and roll no generation)."""
    for path in folder.iterdir():
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def check(outcome: Outcome, models: list[str], reloads: int, server: Server) -> None:
    assert outcome.reloads == dict.fromkeys(models, reloads)
    failed = {answer: n for answer, n in outcome.answers.items() if answer != 200}
    assert not failed, f"{failed} ({outcome.answers[200]} answered 200)\n{server.output()[-3000:]}"
    assert outcome.answers[200] > 20 * reloads * len(models)
    assert set(outcome.readiness) == {200}, outcome.readiness
    for model in models:
        assert server.output().count(f"model '{model}' is reloaded") >= reloads
    if server.workers:  # each reload of the scikit-learn model rolled a new generation
        assert server.output().count("a new generation of workers took over") >= reloads


@pytest.mark.timeout(300)
def test_five_reloads_under_rest_load_fail_nothing(server: Server) -> None:
    if server.workers == 0:
        pytest.skip("in-process, the 20-reload run below covers it (both are slow there)")
    models = [IRIS, CUSTOM]
    outcome = asyncio.run(rolling(server, models, reloads=5, rest=64, grpc_clients=0))
    check(outcome, models, 5, server)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_twenty_reloads_under_rest_and_grpc_load_fail_nothing(server: Server) -> None:
    models = [IRIS, CUSTOM]
    outcome = asyncio.run(rolling(server, models, reloads=20, rest=32, grpc_clients=32))
    check(outcome, models, 20, server)


# -- a reload that fails ----------------------------------------------------------------
def index_entry(server: Server, name: str) -> dict:
    entries = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    (entry,) = [entry for entry in entries if entry["name"] == name]
    return entry


@pytest.mark.timeout(300)
def test_a_failed_reload_keeps_the_previous_version_serving(server: Server) -> None:
    folder: Path = server.repository / "fragile"
    artefact = (folder / "model.joblib").read_bytes()
    body = REST_BODIES[IRIS]
    url = f"{server.url}/v2/models/fragile/infer"
    expected = httpx.post(url, json=body, timeout=30).json()["outputs"]

    async def reload_under_load() -> tuple[Counter, httpx.Response]:
        """8 clients send requests while the model is reloaded; the API's answer."""
        answers: Counter = Counter()
        done = asyncio.Event()
        async with httpx.AsyncClient(timeout=60) as client:

            async def send() -> None:
                while not done.is_set():
                    reply = await client.post(url, json=body)
                    ok = reply.status_code == 200 and reply.json()["outputs"] == expected
                    answers[200 if ok else reply.text] += 1

            senders = [asyncio.create_task(send()) for _ in range(8)]
            await asyncio.sleep(0.2)
            try:
                answer = await client.post(
                    f"{server.url}/v2/repository/models/fragile/load", timeout=120
                )
                await asyncio.sleep(0.2)
            finally:
                done.set()
                await asyncio.gather(*senders)
        return answers, answer

    (folder / "model.joblib").write_bytes(b"not a joblib file")
    try:
        answers, answer = asyncio.run(reload_under_load())
        assert answer.status_code == 500, answer.text
        reason = answer.json()["error"]
        assert reason.startswith("model 'fragile' failed to load: "), reason
        assert set(answers) == {200}, answers
        entry = index_entry(server, "fragile")
        assert entry["state"] == "READY"
        assert entry["reason"] == "reload failed: " + reason.removeprefix(
            "model 'fragile' failed to load: "
        )
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
        assert httpx.get(f"{server.url}/v2/models/fragile/ready", timeout=10).status_code == 200
        server.expect_lines(
            [r"model 'fragile' failed to reload \(the previous version keeps serving\)"]
        )
    finally:
        (folder / "model.joblib").write_bytes(artefact)
    # Repaired: the reload succeeds and clears the reason.
    answers, answer = asyncio.run(reload_under_load())
    assert answer.status_code == 200, answer.text
    assert set(answers) == {200}, answers
    assert index_entry(server, "fragile") == {"name": "fragile", "state": "READY", "reason": ""}
