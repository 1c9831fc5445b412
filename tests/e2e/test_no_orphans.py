"""No orphans (issue 37, point 5): the server killed, SIGKILL included, leaves nothing.

Every process of the server's tree (its template, each worker, an environment's template
and workers) exits within a second of the server's death, and with them every memfd of
the rings, however busy they were: serving a load over REST and gRPC, stuck in a
``predict``, or a template stuck loading a model (before the fix, such a template was
still running 5 s later, and so were workers stuck in a predict). The tree is found
twice over: its pids listed before the kill, and every process carrying an environment
variable set for this server alone (inherited by whatever it starts, even a process
started after the listing).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
from sklearn.linear_model import LogisticRegression

from tests.support import Server, iris_data, write_custom_model, write_sklearn_model
from tests.support.grpc import infer_request, needs_pool, stub_for
from tests.support.pool import template_pid, wait_for
from tests.support.where import make_venv, report, write_where_model

pytestmark = pytest.mark.timeout(240)

TAG = "INFERPOOL_TEST_TREE"
GONE_WITHIN = 2.0  # seconds; the kernel kills them in milliseconds (1 s is the promise)

# A model whose predict never returns (a pure-Python loop, holding the GIL) and one whose
# fork-safe load never returns (in the template, which loads such models for the workers).
STUCK_RUNTIME = """
import os
import time

from inferpool import Runtime


class Stuck(Runtime):
    fork_safe = True

    def load(self):
        extra = self.settings.parameters.extra
        self.started = extra["started"]
        if extra["hang_load"]:
            time.sleep(3600)

    def predict(self, payload, outputs):
        with open(self.started, "a") as started:
            started.write(f"{os.getpid()}\\n")
        while True:
            pass
"""
STUCK_IO = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1]}],
    "timeout": 3600,  # the pool never kills it: only the server's death may
}
ROW = [[5.1, 3.5, 1.4, 0.2]]


def rest_body(rows: list[list[float]]) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP64", "shape": [len(rows), 4], "data": rows}]}


def write_repository(root: Path, *stuck: str, hang_load: bool = False) -> Path:
    X, y = iris_data()
    write_sklearn_model(root / "iris", LogisticRegression(max_iter=500).fit(X, y))
    for name in stuck:
        extra = {"hang_load": hang_load, "started": str(root / "started")}
        write_custom_model(
            root / name, STUCK_RUNTIME, "Stuck", parameters={"extra": extra}, **STUCK_IO
        )
    return root


def tagged(tag: str) -> set[int]:
    """The live processes started with ``TAG=tag`` in their environment (a zombie's
    environment reads empty: it holds no memory and no fd any more)."""
    marker = f"{TAG}={tag}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return found


def memfds(pids: set[int]) -> dict[int, list[str]]:
    """The inferpool memfds (rings, payloads) each of ``pids`` holds open."""
    held: dict[int, list[str]] = {}
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        names = [link for link in links if link.startswith("/memfd:inferpool")]
        if names:
            held[pid] = names
    return held


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Load:
    """Threads that keep sending requests (REST and gRPC) to a model until stopped."""

    def __init__(self, server: Server, model: str, threads: int = 2) -> None:
        self.server, self.model = server, model
        self.answered = 0
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._rest, daemon=True) for _ in range(threads)]
        self.threads.append(threading.Thread(target=self._grpc, daemon=True))
        for thread in self.threads:
            thread.start()

    def _rest(self) -> None:
        url = f"{self.server.url}/v2/models/{self.model}/infer"
        with httpx.Client(timeout=30) as client:
            while not self.stopped.is_set():
                try:
                    if client.post(url, json=rest_body(ROW * 4)).status_code == 200:
                        self.answered += 1
                except httpx.HTTPError:
                    time.sleep(0.01)  # the server is gone

    def _grpc(self) -> None:
        request = infer_request(self.model, x=np.array(ROW * 4))
        with stub_for(self.server) as stub:
            while not self.stopped.is_set():
                try:
                    stub.ModelInfer(request, timeout=30)
                    self.answered += 1
                except grpc.RpcError:
                    time.sleep(0.01)

    def running(self, answers: int = 20) -> None:
        """Wait until it has had ``answers`` answers: the server is under load."""
        wait_for(lambda: self.answered >= answers, 60, f"{answers} answers to the load")

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(60)

    def __enter__(self) -> Load:
        """Under way: ``running()`` done."""
        try:
            self.running()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def tagged_server(root: Path, *args: str) -> Iterator[tuple[Server, str]]:
    """A server on ``root`` whose tree carries a tag of its own; whatever of that tree a
    failing test leaves is killed, so that it cannot disturb the tests after it."""
    tag = uuid.uuid4().hex
    try:
        with Server(root, *args, env={TAG: tag}) as server:
            yield server, tag
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_server(server: Server, tag: str, expect: Callable[[set[int]], None]) -> float:
    """SIGKILL the server; the seconds until the last process of its tree had exited
    (failing past ``GONE_WITHIN``), after which none is left and no memfd of theirs
    either. ``expect(pids)`` checks the tree before the kill."""
    tree = psutil.Process(server.process.pid).children(recursive=True)
    pids = tagged(tag)
    assert server.process.pid in pids
    assert {p.pid for p in tree} <= pids, "the tag marks the whole tree"
    expect(pids - {server.process.pid})
    # Each exit as the kernel records it (a pidfd turns readable), not as polling sees it.
    exits = {os.pidfd_open(pid): pid for pid in pids - {server.process.pid}}
    poller = select.poll()
    for fd in exits:
        poller.register(fd, select.POLLIN)
    server.process.kill()
    killed = time.monotonic()
    waiting = set(exits)
    while waiting and time.monotonic() - killed < GONE_WITHIN + 3:
        for fd, _ in poller.poll(100):
            poller.unregister(fd)
            waiting.discard(fd)
    gone = time.monotonic() - killed
    for fd in exits:
        os.close(fd)
    server.process.wait(30)
    assert not waiting, f"left after {gone:.2f}s: {[exits[fd] for fd in waiting]}"
    assert gone < GONE_WITHIN, f"the tree took {gone:.2f}s to exit"
    # Nor any process it started after the listing; their memfds went with them. (A dying
    # process drops its memory, and so its environment, before its fds: waited for.)
    wait_for(lambda: not tagged(tag) and not memfds(pids), 5, "the tree and its memfds gone")
    assert not any(alive(p) for p in tree)
    print(f"tree of {len(pids)} processes gone {gone * 1000:.0f} ms after SIGKILL")
    return gone


def with_workers(count: int) -> Callable[[set[int]], None]:
    """The tree holds the template and ``count`` workers (or more: a standby worker the
    pool may start while the others are busy), the rings' memfds among them."""

    def expect(children: set[int]) -> None:
        assert len(children) >= count + 1, children
        assert memfds(children), "the workers map their rings"

    return expect


@needs_pool
def test_sigkill_under_load_leaves_no_process_and_no_memfd(tmp_path: Path) -> None:
    with tagged_server(write_repository(tmp_path), "--workers", "2") as (server, tag):
        server.wait_ready(120)
        with Load(server, "iris"):
            kill_server(server, tag, with_workers(2))


def post_quietly(url: str, body: dict | None = None) -> None:
    """A request whose answer never comes: the server dies first."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, json=body, timeout=120)


def state(server: Server, model: str) -> str | None:
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    return next((entry["state"] for entry in index if entry["name"] == model), None)


def in_background(function: Callable[..., None], *args: object) -> None:
    threading.Thread(target=function, args=args, daemon=True).start()


def spin_both_workers(server: Server, started: Path) -> None:
    """Calls to ``spin`` until both workers run one (the least loaded takes the next, but
    the load's requests count too: another call goes every few seconds, up to 8)."""
    url, sent, last = f"{server.url}/v2/models/spin/infer", 0, 0.0
    deadline = time.monotonic() + 90
    while not started.exists() or len(set(started.read_text().split())) < 2:
        assert time.monotonic() < deadline, "both workers spinning: not after 90 s"
        if sent < 2 or (sent < 8 and time.monotonic() - last > 3):
            in_background(post_quietly, url, rest_body(ROW))
            sent, last = sent + 1, time.monotonic()
        time.sleep(0.05)


@needs_pool
def test_sigkill_with_stuck_predicts_and_a_template_stuck_loading(tmp_path: Path) -> None:
    """Both workers spin in a predict that never ends, a load keeps coming, and the
    template is stuck loading a model asked for through the repository API: none of
    them reads its control channel any more, so none sees its EOF."""
    root = write_repository(tmp_path, "spin")
    started = root / "started"
    with tagged_server(root, "--workers", "2") as (server, tag):
        server.wait_ready(120)
        with Load(server, "iris"):
            spin_both_workers(server, started)
            write_repository(tmp_path, "hang", hang_load=True)
            in_background(post_quietly, f"{server.url}/v2/repository/models/hang/load")
            wait_for(lambda: state(server, "hang") == "LOADING", 30, "the load under way")
            time.sleep(1.0)  # the template is in it
            kill_server(server, tag, with_workers(2))


@needs_pool
def test_sigkill_during_start_up_with_the_template_stuck_loading(tmp_path: Path) -> None:
    """The issue's case: the template never finishes preloading, so no worker starts."""
    root = write_repository(tmp_path, "hang", hang_load=True)
    with tagged_server(root, "--workers", "2") as (server, tag):
        server.wait_live(120)
        wait_for(lambda: len(tagged(tag)) >= 2, 60, "the template started")
        time.sleep(2.0)  # it is loading the models (iris, then hang forever)
        assert httpx.get(f"{server.url}/v2/health/ready").status_code != 200

        def template_only(children: set[int]) -> None:
            assert len(children) >= 1  # the template (no worker is forked before it is up)

        kill_server(server, tag, template_only)


def current_template(server: Server) -> int | None:
    try:
        return template_pid(server.process.pid)
    except AssertionError:  # restarting
        return None


@pytest.mark.slow
@needs_pool
def test_workers_outlive_their_template_but_not_the_server(tmp_path: Path) -> None:
    """The workers' parent is the template, which may die and be restarted while they
    serve: they are tied to the server itself, not to their parent."""
    with tagged_server(write_repository(tmp_path), "--workers", "2") as (server, tag):
        server.wait_ready(120)
        with Load(server, "iris") as load:
            first = template_pid(server.process.pid)
            workers = {p.pid for p in psutil.Process(first).children()}
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: current_template(server) not in (None, first), 60, "a new template")
            answered = load.answered
            load.running(answered + 20)  # the same workers still serve
            assert all(psutil.pid_exists(pid) for pid in workers)
            assert workers <= tagged(tag)

            def orphaned(children: set[int]) -> None:
                assert workers <= children and len(children) >= 3  # + the new template
                assert set(memfds(workers)) == workers

            kill_server(server, tag, orphaned)


@pytest.mark.slow
@needs_pool
def test_an_environment_groups_template_and_workers_die_with_the_server(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv")
    root = write_repository(tmp_path / "repo")
    write_where_model(root / "isolated", parameters={"environment_path": str(venv)})
    with tagged_server(root, "--workers", "1") as (server, tag):
        server.wait_ready(120)
        with Load(server, "iris"):
            where = report(server.url, "isolated")
            assert Path(where["prefix"]) == venv

            def two_templates(children: set[int]) -> None:
                # The server's template and worker, the environment's template and worker.
                assert where["pid"] in children and len(children) >= 4, children
                assert where["pid"] in memfds(children)

            kill_server(server, tag, two_templates)


def test_sigkill_of_an_in_process_server_leaves_no_child(tmp_path: Path) -> None:
    with tagged_server(write_repository(tmp_path), "--workers", "0") as (server, tag):
        server.wait_ready(120)
        with Load(server, "iris"):

            def whatever(children: set[int]) -> None:
                """None expected; a child it may start (a load probe) must go too."""

            kill_server(server, tag, whatever)
