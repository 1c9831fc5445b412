"""Loading is contained (issue 37.1): a broken model file fails that model alone, once, with
one sentence naming the file, the library and what is wrong; the other models serve.

Before: a truncated LightGBM ``model.txt`` killed the worker template process (SIGABRT or
SIGSEGV) at every restart, without end, readiness said "starting up" forever and nothing
named the model; with ``--workers 0`` the server itself died (exit 134 or 139). A corrupt
``model.joblib`` was reported as ``KeyError: 204``, naming no file.

One server per mode loads the whole corpus (``tests/support/broken_models.py``, 33 broken
models) beside two good ones with ``--no-exit-on-error``; a few small servers check the
exit code at start-up and a worker that dies loading a custom runtime.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Server, build_iris_repository, iris_data, write_custom_model
from tests.support.broken_models import Broken, Sources, corpus, file_model
from tests.support.pool import children, process_exists, wait_for

pytestmark = pytest.mark.timeout(600)

CRASHED = re.compile(r"the process (aborted|crashed \(\w+\)|hung for)")


@pytest.fixture(scope="module")
def sources() -> Sources:
    return Sources()


def index_of(server: Server) -> dict[str, dict]:
    response = httpx.post(f"{server.url}/v2/repository/index", timeout=10)
    return {model["name"]: model for model in response.json()}


def settled(server: Server, count: int, timeout: float = 300) -> dict[str, dict]:
    """The repository index once its ``count`` models are READY or FAILED."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.output()[-3000:]
        try:
            index = index_of(server)
        except httpx.HTTPError:
            index = {}
        if len(index) == count and all(m["state"] in ("READY", "FAILED") for m in index.values()):
            return index
        time.sleep(0.2)
    raise TimeoutError(f"models still loading after {timeout}s:\n{server.output()[-3000:]}")


def infer_iris(server: Server, model: str = "iris-logreg") -> httpx.Response:
    X, _ = iris_data()
    rows = X[:3]
    body = {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


class Corpus:
    """A running server holding the corpus, its index once settled, its processes."""

    def __init__(self, server: Server, entries: list[Broken], index: dict[str, dict]) -> None:
        self.server = server
        self.entries = entries
        self.index = index
        self.children = set(children(server.process.pid))


@pytest.fixture(scope="module", params=["0", "2"], ids=["w0", "w2"])
def loaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, sources: Sources
) -> Iterator[Corpus]:
    repository = build_iris_repository(tmp_path_factory.mktemp("corpus") / "models")
    entries = corpus(sources)
    for entry in entries:
        entry.write(repository / entry.name)
    with Server(repository, "--workers", request.param, "--no-exit-on-error") as server:
        server.wait_live(120)
        index = settled(server, len(entries) + 2)
        yield Corpus(server, entries, index)
        pids = set(children(server.process.pid))
        assert server.stop() == 0
    wait_for(lambda: not any(process_exists(pid) for pid in pids), 10, "children gone")


def test_the_corpus_is_big_enough(sources: Sources) -> None:
    entries = corpus(sources)
    assert len(entries) >= 25
    assert len({entry.name for entry in entries}) == len(entries)
    assert {entry.library for entry in entries} >= {"scikit-learn", "LightGBM", "XGBoost", "MLflow"}


def test_each_broken_model_fails_with_its_sentence(loaded: Corpus) -> None:
    wrong = []
    for entry in loaded.entries:
        status = loaded.index[entry.name]
        if status["state"] != "FAILED" or not re.search(entry.pattern(), status["reason"]):
            wrong.append(f"{entry.name}: {status['state']} {status['reason']!r}")
    assert not wrong, "\n".join(wrong)


def test_the_good_models_beside_them_serve(loaded: Corpus) -> None:
    assert loaded.index["iris-logreg"]["state"] == "READY"
    assert loaded.index["iris-rf"]["state"] == "READY"
    for model in ("iris-logreg", "iris-rf"):
        response = infer_iris(loaded.server, model)
        assert response.status_code == 200, response.text


def test_the_server_stays_up_not_ready(loaded: Corpus) -> None:
    url = loaded.server.url
    assert httpx.get(f"{url}/v2/health/live", timeout=10).status_code == 200
    ready = httpx.get(f"{url}/v2/health/ready", timeout=10)
    assert ready.status_code == 503
    assert "failed to load" in ready.json()["error"]


def test_each_reason_is_logged_once(loaded: Corpus) -> None:
    lines = [line for line in loaded.server.output().splitlines() if "started with" not in line]
    for entry in loaded.entries:
        reason = loaded.index[entry.name]["reason"]
        logged = [line for line in lines if f"model '{entry.name}' failed to load: " in line]
        assert len(logged) == 1, (entry.name, logged)
        assert logged[0].endswith(reason)


def test_no_restart_loop(loaded: Corpus) -> None:
    """Each model that killed its process did so once: the template restarted once for each
    (workers), or the server kept running (in-process); nothing restarts afterwards."""
    server = loaded.server
    crashed = [name for name, m in loaded.index.items() if CRASHED.search(m["reason"])]
    assert crashed, "no broken file crashed its library: the corpus lost its point"
    time.sleep(3)
    output = server.output()
    restarts = len(re.findall(r"worker template process restarted", output))
    if "inferpool.engine.worker.template" in str(children(server.process.pid)):  # workers
        assert restarts == len(crashed), output[-3000:]
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        assert re.search(rf"^inferpool_template_restarts(_total)? {len(crashed)}(\.0)?$",
                         metrics, re.M), metrics  # fmt: skip
        assert "starting a replacement" not in output  # no worker died either
    else:
        assert restarts == 0
    for name in crashed:  # the model that killed its process is named beside it
        assert re.search(rf"'{re.escape(name)}'", output)


def test_no_probe_process_is_left(loaded: Corpus) -> None:
    """With workers: the template and the workers only; in-process: no child at all (the
    probes have exited)."""
    commands = [command for _, command in children(loaded.server.process.pid).values()]
    assert not [c for c in commands if b"inferpool.engine.worker.probe" in c]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_crashing_file_makes_the_start_up_exit_1(
    tmp_path: Path, sources: Sources, workers: str
) -> None:
    repository = build_iris_repository(tmp_path / "models")
    file_model("model.txt", sources.lightgbm_text[:3000])(repository / "lgb")
    with Server(repository, "--workers", workers) as server:
        assert server.wait_exit(180) == 1
        output = server.output()
    sentence = "model 'lgb' failed to load: model.txt is not a valid LightGBM model (the process "
    assert sentence in output
    assert len(re.findall(r"worker template process restarted", output)) <= 1


WORKER_LOADED = """
import ctypes

from inferpool import Runtime


class Loaded(Runtime):
    def load(self):
        if self.settings.parameters.extra.get("crash"):
            ctypes.string_at(0)  # a segfault in the worker loading it

    def predict(self, payload, outputs):
        return {outputs[0]: payload}
"""


def test_a_worker_that_dies_loading_a_model_fails_that_model_alone(tmp_path: Path) -> None:
    """A custom runtime is loaded by each worker (not by the template): the worker that dies
    loading it blames it; the model loaded beside it on that worker is placed again."""
    crash = {"extra": {"crash": True}}
    write_custom_model(tmp_path / "boom", WORKER_LOADED, "Loaded", parameters=crash)
    write_custom_model(tmp_path / "fine", WORKER_LOADED, "Loaded")
    with Server(tmp_path, "--workers", "2", "--no-exit-on-error") as server:
        server.wait_live(120)
        index = settled(server, 2)
        assert index["boom"]["state"] == "FAILED"
        assert index["boom"]["reason"] == (
            "the process loading it crashed (SIGSEGV) while its runtime's load() ran "
            "(no model file opened yet)"
        )
        assert index["fine"]["state"] == "READY", index
        body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}
        response = httpx.post(f"{server.url}/v2/models/fine/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        time.sleep(2)
        output = server.output()
        assert output.count("starting a replacement") == 1  # the one that died, once
        assert output.count("model 'boom' failed to load") == 2  # its line, and the summary
