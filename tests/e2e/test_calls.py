"""A runtime's calls to other models of the same server (``inferpool.calls``), end to end:
REST and gRPC, ``--workers 0`` and ``--workers 2``; unknown models, cycles, timeouts and a
callee's worker dying are errors, never hangs; a worker whose predict waits in a call
keeps answering other requests."""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from inferpool.calls import MAX_DEPTH
from tests.support import (
    Server,
    build_iris_repository,
    iris_data,
    write_custom_model,
    write_sklearn_model,
)
from tests.support.grpc import infer_request, needs_pool, running_server, stub_for
from tests.support.readme import page_section

RUNTIMES = """
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from inferpool import Runtime
    from inferpool.calls import CallError, infer


    class Base(Runtime):
        def load(self):
            pass


    class Post(Base):
        # Calls iris-logreg and post-processes its probabilities.
        def predict(self, payload, outputs):
            answer = infer(
                "iris-logreg", {"x": np.asarray(payload, dtype=np.float64)},
                outputs=["predict_proba"],
            )
            proba = answer["outputs"][0]["data"]
            return {"label": proba.argmax(axis=1), "confidence": proba.max(axis=1)}


    class Threaded(Base):
        # Calls iris-logreg from threads of its own while its predict waits for them.
        def predict(self, payload, outputs):
            def proba(rows):
                answer = infer("iris-logreg", {"x": rows}, outputs=["predict_proba"])
                return answer["outputs"][0]["data"]

            rows = np.array_split(np.asarray(payload, dtype=np.float64), 2)
            with ThreadPoolExecutor(2) as pool:
                return {"proba": np.concatenate(list(pool.map(proba, rows)))}


    class Call(Base):
        # Calls the model named by its class attribute; lets any error propagate.
        target = ""
        timeout = None

        def predict(self, payload, outputs):
            answer = infer(self.target, {"x": np.asarray(payload)}, timeout=self.timeout)
            by_name = {output["name"]: output["data"] for output in answer["outputs"]}
            result = {"y": answer["outputs"][0]["data"], "pid": np.array([os.getpid()])}
            if "pid" in by_name:
                result["callee_pid"] = by_name["pid"]
            return result


    class Missing(Call):
        target = "no-such-model"


    class ToRf(Call):
        target = "iris-rf"


    class Selfish(Call):
        target = "selfish"


    class PingA(Call):
        target = "ping-b"


    class PingB(Call):
        target = "ping-a"


    class Impatient(Call):
        target = "sleepy"
        timeout = 0.5


    class Waiter(Call):
        target = "sleepy"


    class Doomed(Call):
        target = "killer"


    class Chain(Call):
        # chain-0 calls chain-1, which calls chain-2, ...
        def load(self):
            self.target = "chain-" + str(int(self.settings.name.split("-")[1]) + 1)


    class Catcher(Base):
        # Catches the error of a call to a model that does not exist.
        def predict(self, payload, outputs):
            try:
                infer("no-such-model", {"x": np.asarray(payload)})
            except CallError as exc:
                return {"status": np.array([exc.status]), "message": np.array([exc.message])}
            return {"status": np.array([200])}


    class Sleepy(Base):
        def predict(self, payload, outputs):
            time.sleep(2.5)
            return {"y": np.asarray(payload), "pid": np.array([os.getpid()])}


    class WhoAmI(Base):
        def predict(self, payload, outputs):
            return {"pid": np.array([os.getpid()])}


    class Killer(Base):
        def predict(self, payload, outputs):
            os._exit(3)
"""

ONE = {"replicas": 1}


def docs_example(root: Path) -> None:
    """The page's example (docs/custom-runtimes.md, "Calling other models"): the model
    ``iris`` it calls, and ``iris-labels`` written from the page's two blocks."""
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    write_sklearn_model(root / "iris", LogisticRegression(max_iter=1000).fit(X, y))
    section = page_section("docs/custom-runtimes.md", "## Calling other models")
    source, settings = re.findall(r"```(?:python|json)\n(.*?)```", section, re.DOTALL)
    (root / "iris-labels").mkdir()
    (root / "iris-labels" / "labeller.py").write_text(source)
    (root / "iris-labels" / "model-settings.json").write_text(settings)


def repository(root: Path) -> Path:
    build_iris_repository(root)
    docs_example(root)
    for name, cls, settings in [
        ("post", "Post", {}),
        ("threaded", "Threaded", {}),
        ("missing", "Missing", {}),
        ("selfish", "Selfish", {}),
        ("to-rf", "ToRf", {}),
        ("ping-a", "PingA", {}),
        ("ping-b", "PingB", {}),
        ("impatient", "Impatient", {}),
        ("catcher", "Catcher", {}),
        ("sleepy", "Sleepy", {}),
        *[(f"chain-{number}", "Chain", {}) for number in range(MAX_DEPTH + 1)],
    ]:
        write_custom_model(root / name, RUNTIMES, cls, module=f"{cls.lower()}_rt", **settings)
    return root


@pytest.fixture(
    scope="module",
    params=[pytest.param(0, id="w0"), pytest.param(2, id="w2", marks=needs_pool)],
)
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    root = repository(tmp_path_factory.mktemp("calls"))
    with running_server(root, request.param) as running:
        running.workers = request.param
        yield running


def rest(server: Server, model: str, rows: np.ndarray, timeout: float = 30) -> httpx.Response:
    tensor = {"name": "x", "datatype": "FP64", "shape": list(rows.shape)}
    body = {"inputs": [{**tensor, "data": rows.ravel().tolist()}]}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=timeout)


def outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def test_a_runtime_calls_another_model_over_rest(server: Server) -> None:
    from tests.support import rest_output

    X, _ = iris_data()
    rows = X[::30]
    proba = rest_output(server.url, "iris-logreg", rows)
    answer = outputs(rest(server, "post", rows))
    np.testing.assert_array_equal(answer["label"], proba.argmax(axis=1))
    np.testing.assert_allclose(answer["confidence"], proba.max(axis=1))


def test_a_runtime_calls_another_model_over_grpc(server: Server) -> None:
    from tests.support import rest_output

    X, _ = iris_data()
    rows = X[1::25]
    proba = rest_output(server.url, "iris-logreg", rows)
    with stub_for(server) as stub:
        reply = stub.ModelInfer(infer_request("post", x=rows), timeout=30)
        by_name = {tensor.name: tensor for tensor in reply.outputs}
        labels = list(by_name["label"].contents.int64_contents)
        assert labels == proba.argmax(axis=1).tolist()
        confidence = list(by_name["confidence"].contents.fp64_contents)
        np.testing.assert_allclose(confidence, proba.max(axis=1))


def test_threads_of_a_runtime_call_while_its_predict_waits_for_them(server: Server) -> None:
    """In a worker, the loop is busy in the predict: the threads' calls go on sockets
    of their own (their threads end with each request: new ones the next time)."""
    from tests.support import rest_output

    X, _ = iris_data()
    rows = X[::10]
    for _ in range(2):
        answer = outputs(rest(server, "threaded", rows))
        np.testing.assert_allclose(answer["proba"], rest_output(server.url, "iris-logreg", rows))


def test_the_pages_example_answers_the_likeliest_species(server: Server) -> None:
    from tests.support import rest_output

    X, _ = iris_data()
    rows = X[::25]
    proba = rest_output(server.url, "iris", rows)
    response = rest(server, "iris-labels", rows)
    assert response.status_code == 200, response.text
    answer = {output["name"]: output["data"] for output in response.json()["outputs"]}
    species = ["setosa", "versicolor", "virginica"]
    assert answer["species"] == [species[label] for label in proba.argmax(axis=1)]
    np.testing.assert_allclose(answer["probability"], proba.max(axis=1))


def test_an_unknown_model_raises_in_the_caller_naming_it(server: Server) -> None:
    answer = outputs(rest(server, "catcher", np.ones((1, 2))))
    assert answer["status"].tolist() == [404]
    assert "no-such-model" in answer["message"][0]
    # Let through, it answers the outer request with the callee's status.
    response = rest(server, "missing", np.ones((1, 2)))
    assert response.status_code == 404
    assert "call to model 'no-such-model' failed" in response.json()["error"]


def test_a_model_unloaded_raises_in_the_caller_as_a_client_would_be_answered(
    server: Server,
) -> None:
    rows = iris_data()[0][:2]
    assert outputs(rest(server, "to-rf", rows))["y"].shape == (2,)
    unloaded = httpx.post(f"{server.url}/v2/repository/models/iris-rf/unload", timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    try:
        direct = rest(server, "iris-rf", rows)  # what a client asking it directly gets
        assert direct.status_code in (404, 503), direct.text
        response = rest(server, "to-rf", rows)
        assert response.status_code == direct.status_code, response.text
        reason = direct.json()["error"]
        assert "iris-rf" in reason
        assert response.json()["error"] == f"call to model 'iris-rf' failed: {reason}"
    finally:
        loaded = httpx.post(f"{server.url}/v2/repository/models/iris-rf/load", timeout=120)
        assert loaded.status_code == 200, loaded.text
    assert outputs(rest(server, "to-rf", rows))["y"].shape == (2,)


def test_a_model_calling_itself_is_refused_at_once(server: Server) -> None:
    started = time.monotonic()
    response = rest(server, "selfish", np.ones((1, 2)))
    assert time.monotonic() - started < 5
    assert response.status_code == 400
    assert "call cycle 'selfish' -> 'selfish'" in response.json()["error"]


def test_a_cycle_of_calls_is_refused_at_once(server: Server) -> None:
    started = time.monotonic()
    response = rest(server, "ping-a", np.ones((1, 2)))
    assert time.monotonic() - started < 5
    assert response.status_code == 400
    assert "call cycle 'ping-a' -> 'ping-b' -> 'ping-a'" in response.json()["error"]


def test_a_chain_of_calls_deeper_than_the_limit_is_refused(server: Server) -> None:
    """chain-0 -> chain-1 -> ... -> chain-7 run (with --workers 0, each waiting in a
    predict thread of its own), chain-7's call to chain-8 is refused."""
    started = time.monotonic()
    response = rest(server, "chain-0", np.ones((1, 2)))
    assert time.monotonic() - started < 10
    assert response.status_code == 400
    path = " -> ".join(f"'chain-{number}'" for number in range(MAX_DEPTH + 1))
    assert f"calls nest deeper than {MAX_DEPTH} models: {path}" in response.json()["error"]


def test_a_call_past_its_timeout_is_a_504(server: Server) -> None:
    started = time.monotonic()
    response = rest(server, "impatient", np.ones((1, 2)))
    assert time.monotonic() - started < 1.4  # the callee takes 2.5 s
    assert response.status_code == 504
    assert "model 'sleepy' did not answer within the call's timeout (0.5 s)" in response.text
    # The server goes on: the callee's late answer is dropped.
    assert outputs(rest(server, "sleepy", np.ones((1, 2))))["y"].shape == (1, 2)


@needs_pool
def test_the_callers_worker_answers_other_requests_during_a_call(tmp_path: Path) -> None:
    """``waiter`` (one replica) waits 2.5 s in a call to ``sleepy`` (on the other
    worker): requests sent to its worker meanwhile are answered at once, and so are
    its heartbeats (a worker silent for 1 s is killed; ``waiter`` has no timeout that
    would excuse it, ``sleepy`` has one)."""
    build_iris_repository(tmp_path)
    write_custom_model(tmp_path / "waiter", RUNTIMES, "Waiter", module="waiter_rt", **ONE)
    # On both workers: the call goes to the least loaded, the one not running ``waiter``.
    write_custom_model(tmp_path / "sleepy", RUNTIMES, "Sleepy", module="sleepy_rt", timeout=30)
    write_custom_model(tmp_path / "whoami", RUNTIMES, "WhoAmI", module="whoami_rt")
    flags = ("--stall-threshold", "30", "--worker-heartbeat-timeout", "1", "--model-timeout", "0")
    server_running = running_server(tmp_path, 2, *flags)
    with server_running as server, concurrent.futures.ThreadPoolExecutor(8) as pool:
        waiting = pool.submit(finished, rest, server, "waiter", np.ones((1, 2)))
        time.sleep(0.4)  # its call is in flight
        others = [pool.submit(timed_pid, server) for _ in range(6)]
        answered = [other.result() for other in others]
        response, waiter_done = waiting.result()
        output = server.output()
    assert "answered nothing" not in output, output
    answer = outputs(response)
    caller_pid, callee_pid = int(answer["pid"][0]), int(answer["callee_pid"][0])
    assert caller_pid != callee_pid, "the test needs the two models on different workers"
    # Some went to the caller's worker (the others wait behind the callee's 2.5 s) ...
    by_caller = [(seconds, done) for pid, seconds, done in answered if pid == caller_pid]
    assert by_caller, answered
    # ... and were answered at once, while its predict waited for its call.
    assert max(seconds for seconds, _ in by_caller) < 0.8, answered
    assert max(done for _, done in by_caller) < waiter_done, (answered, waiter_done)


def finished(function, *args):
    """``function(*args)`` and when it returned."""
    result = function(*args)
    return result, time.monotonic()


def timed_pid(server: Server) -> tuple[int, float, float]:
    """The pid of the worker that answers ``whoami``, the seconds it took, when it ended."""
    started = time.monotonic()
    pid = int(outputs(rest(server, "whoami", np.ones((1, 1))))["pid"][0])
    done = time.monotonic()
    return pid, done - started, done


@needs_pool
def test_a_callee_whose_worker_dies_is_an_error_not_a_hang(tmp_path: Path) -> None:
    build_iris_repository(tmp_path)
    write_custom_model(tmp_path / "doomed", RUNTIMES, "Doomed", module="doomed_rt", **ONE)
    write_custom_model(tmp_path / "killer", RUNTIMES, "Killer", module="killer_rt", **ONE)
    with running_server(tmp_path, 2) as server:
        started = time.monotonic()
        response = rest(server, "doomed", np.ones((1, 2)))
        assert time.monotonic() - started < 10
        assert response.status_code == 503, response.text
        assert "error" in response.json()
        # The server recovers: its workers are replaced.
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.url}/v2/models/iris-rf/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
