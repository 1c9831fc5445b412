"""A local Ray instance with Serve on 127.0.0.1, started once for the session (tox -e ray).

Ray runs with no dashboard and no usage statistics, its node address on the loopback
(checked), and Serve's HTTP proxy on a free loopback port. At the end Serve and Ray shut
down, and no process of an inferpool engine that ran under Ray may be left.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.support import build_iris_repository, free_port

# Only tox's ray environment has Ray; the other runs deselect this folder by its marker, and
# must not import the test module to do so.
if importlib.util.find_spec("ray") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # Set before Ray is imported (it reads them at import): no usage statistics, and Ray's
    # single-machine mode, whose node address is 127.0.0.1, not that of the default route.
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})

ENGINE_PROCESS = "inferpool.engine.worker.template"  # the template and the workers it forks


def engine_processes() -> set[psutil.Process]:
    """The inferpool template and worker processes this test process started through Ray
    (the raylet and its workers are its descendants)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if ENGINE_PROCESS in process.cmdline():
                found.add(process)
        except psutil.NoSuchProcess:
            pass
    return found


@dataclass
class RayServe:
    url: str  # Serve's HTTP proxy
    gcs_address: str  # for another driver (`serve run --address`)
    seen: set[psutil.Process] = field(default_factory=set)  # every engine process noticed

    def engine_processes(self) -> set[psutil.Process]:
        current = engine_processes()
        self.seen |= current
        return current


@pytest.fixture(scope="session")
def ray_serve() -> Iterator[RayServe]:
    import ray
    from ray import serve

    ray.init(
        address="local",
        include_dashboard=False,
        num_cpus=2,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cluster = RayServe(f"http://127.0.0.1:{port}", ray.get_runtime_context().gcs_address)
        assert cluster.gcs_address.startswith("127.0.0.1:"), cluster.gcs_address
        yield cluster
        cluster.engine_processes()
        serve.shutdown()
    finally:
        ray.shutdown()
    left = [p.pid for p in cluster.seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"inferpool processes left after Serve and Ray shut down: {left}"


@pytest.fixture(scope="session")
def ray_iris_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The iris repository, and ``iris-count``: the logistic regression again, for the test
    that counts each replica's requests."""
    repository = build_iris_repository(tmp_path_factory.mktemp("ray-iris"))
    shutil.copytree(repository / "iris-logreg", repository / "iris-count")
    return repository
