"""Shared fixtures (a trained iris repository and a running server on it), and which test
files are slow or need a tox environment of their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server, build_iris_repository

# Files that wait by design (floods, timeouts, a soak, millions of ring messages): marked
# ``slow`` and run by tox's ``slow`` environment, so the default one stays short. The
# README's test command (``python -m tox``) runs both.
SLOW_FILES = frozenset(
    {
        "tests/e2e/test_drain_signals.py",
        "tests/e2e/test_http2_hostile.py",
        "tests/e2e/test_worker_recycling.py",
        "tests/e2e/test_stalled_workers.py",
        "tests/e2e/test_server_environment.py",
        "tests/e2e/test_slow_readers.py",
        "tests/e2e/test_load_containment_hangs.py",
        "tests/fuzz/test_soak.py",
        "tests/unit/engine/test_ring_stress.py",
        "tests/bench/test_quick_profile.py",
        "tests/bench/test_overload_command.py",
        "tests/bench/test_cores.py",
        # Not waiting by design, but many servers each (33 broken models loaded with and
        # without workers; the gRPC service's faults; the repository API's refusals): the
        # default environment's 20 minutes (CI measured 19.5 with them).
        "tests/e2e/test_load_containment.py",
        "tests/e2e/test_grpc_service.py",
        "tests/e2e/test_repository_api_security.py",
        # Waiting by design: the watcher's quiet periods, drain delays, crash loops, a
        # client that never reads.
        "tests/e2e/test_repository_poll.py",
        "tests/e2e/test_pool_quarantine.py",
        "tests/e2e/test_drain_probes.py",
        "tests/compat/test_health_grpc_hostile.py",
    }
)


# Folders whose tests need packages the default environment cannot hold beside inferpool's
# own dependencies (each pins protobuf, pandas or starlette to other majors): marked with the
# folder's name and run by the tox environment of that name.
ENVIRONMENT_FOLDERS = {
    "tests/clients": "clients",  # the newest tritonclient[all], kserve's clients, perf_analyzer
    "tests/mlserver": "mlserver",  # MLServer 1.7.1 installed: its custom runtimes unchanged
    "tests/image": "image",  # buildah and mmdebstrap: the container image built and run
    "tests/deploy": "deploy",  # kserve's typed models and kubernetes-validate: the manifests
    "tests/ray": "ray",  # Ray Serve: a local Ray instance on 127.0.0.1
    "tests/package": "package",  # the wheel built and installed into a clean virtualenv
    "tests/environments": "environments",  # a virtualenv with scikit-learn 1.5.2 (item 19.6)
    "tests/ecosystem": "ecosystem",  # inferpool[all] beside kserve, MLServer, Ray... (plain pip)
    "tests/docs": "docs",  # mkdocs-material: the site built strict, the pages' code blocks run
    "tests/runtimes": "runtimes",  # CatBoost, ONNX Runtime: libraries not in [test]
    "tests/browser": "browser",  # Chromium and chromedriver from apt, selenium: Swagger UI
    "tests/native": "native",  # gcc and tl2cgen: C libraries on the native runtime
    "tests/rlang": "rlang",  # R from apt and rpy2: R models on the R runtime
    "tests/java": "java",  # a JDK, JPype, JPMML-Evaluator and sklearn2pmml: the JVM runtimes
    "tests/storage": "storage",  # s3fs, moto's S3 server: models fetched from remote stores
    "tests/spark": "spark",  # pyspark and a JDK: PipelineModels in a Spark session per worker
    "tests/huggingface": "huggingface",  # transformers and a CPU torch: text pipelines
    "tests/alibi_deep": "alibi_deep",  # alibi(-detect) on torch and TensorFlow, packed env
}


ENVIRONMENT_MARKERS = frozenset(ENVIRONMENT_FOLDERS.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow files, and each environment folder's tests with its environment; a
    test of any environment (by folder or by its own marker) is also ``elsewhere``, which
    the default and lowest environments deselect whatever environments are added."""
    root = Path(config.rootpath)
    for item in items:
        path = item.path.relative_to(root).as_posix()
        if path in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        for folder, marker in ENVIRONMENT_FOLDERS.items():
            if path.startswith(folder + "/"):
                item.add_marker(getattr(pytest.mark, marker))
        if any(mark.name in ENVIRONMENT_MARKERS for mark in item.iter_markers()):
            item.add_marker(pytest.mark.elsewhere)


# How much of each running server's log a failing test's report shows.
LOG_TAIL = 6000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A failing test's report ends with the logs of the servers still running: CI keeps
    nothing else of them, and a timeout in the test says little of why."""
    report = yield
    if report.failed:
        for server in list(Server.running):
            try:
                tail = server.output()[-LOG_TAIL:]
            except OSError:  # its log is gone
                continue
            report.sections.append((f"server on port {server.http_port}: end of its log", tail))
    return report


@pytest.fixture(scope="session")
def iris_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_iris_repository(tmp_path_factory.mktemp("iris-repo"))


@pytest.fixture(scope="session")
def iris_server(iris_repo: Path) -> Iterator[Server]:
    """One in-process (``--workers 0``) server for read-only tests of the whole session."""
    with Server(iris_repo, "--workers", "0") as server:
        server.wait_ready()
        yield server
