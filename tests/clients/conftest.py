"""Live servers for the client tests: the iris repository behind each gRPC implementation
(the builtin HTTP/2 server with a worker pool, grpc.aio in-process), as a client meets them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server, build_iris_repository

# kserve and tritonclient.grpc both register the ``inference.*`` messages in protobuf's default
# descriptor pool, so one process can import only one of them (inferpool keeps its own pool).
# test_clients_kserve.py is collected only when named on the command line: tox's ``clients``
# environment runs it in a pytest process of its own.
KSERVE_FILE = Path(__file__).with_name("test_clients_kserve.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path != KSERVE_FILE:
        return None
    named = {Path(arg.split("::")[0]).resolve() for arg in config.args}
    return KSERVE_FILE not in named


# (workers, --grpc-implementation): each client runs against both gRPC servers.
SETUPS = [
    pytest.param(("2", "builtin"), id="builtin-w2"),
    pytest.param(("0", "grpcio"), id="grpcio-w0"),
]


@pytest.fixture(scope="package")
def clients_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_iris_repository(tmp_path_factory.mktemp("clients-repo"))


@pytest.fixture(scope="module", params=SETUPS)
def clients_server(clients_repository: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    workers, implementation = request.param
    flags = ("--workers", workers, "--grpc-implementation", implementation)
    with Server(clients_repository, *flags) as server:
        server.wait_ready()
        yield server
