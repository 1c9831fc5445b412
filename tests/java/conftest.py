"""The java tests' live servers: the module's ``root`` repository served in-process
(``--workers 0``) and by two workers, each starting its own JVM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, stub_for


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, root: Path) -> Iterator[Server]:
    # JVM start-ups and JPMML-Evaluator's first load take tens of seconds on a busy host
    with Server(root, "--workers", str(request.param)) as running:
        running.wait_ready(timeout=240)
        running.workers = request.param  # type: ignore[attr-defined]
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as connected:
        yield connected
