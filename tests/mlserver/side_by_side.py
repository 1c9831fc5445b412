"""inferpool and ``mlserver start`` serving one repository side by side, and the
comparison of their answers (status, each output's name, datatype, shape and data), for
the modules that run MLServer's documentation examples on both
(``test_examples_installed.py``, ``test_examples_second_installed.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.mlserver.runtimes import grpc_outputs, grpc_request
from tests.support import Server
from tests.support.mlserver import running_mlserver
from tests.support.same_outputs import assert_same_outputs


@contextmanager
def side_by_side(repository: Path, *flags: str) -> Iterator[tuple[Server, tuple[str, str]]]:
    """inferpool (started with ``flags``) and MLServer on ``repository``, started
    together so that each loads its models while the other does: inferpool's server and
    MLServer's REST URL and gRPC address."""
    with Server(repository, *flags) as ours, running_mlserver(repository) as theirs:
        ours.wait_ready(timeout=300)  # generous: a loaded machine
        yield ours, theirs


def assert_rest_same(ours: str, theirs: str, path: str, body: dict) -> None:
    """``body`` posted to ``path`` on both REST URLs: both 200, the same outputs and
    model version."""
    mine = httpx.post(ours + path, json=body, timeout=60)
    other = httpx.post(theirs + path, json=body, timeout=60)
    assert mine.status_code == other.status_code == 200, (mine.text, other.text)
    assert_same_outputs(mine.json()["outputs"], other.json()["outputs"], atol=1e-7)
    assert mine.json().get("model_version") == other.json().get("model_version")


def grpc_infer(address: str, path: str, body: dict) -> list[dict]:
    """The REST request ``body`` for ``path`` sent as a gRPC ModelInfer: its outputs."""
    parts = path.split("/")
    request = grpc_request(parts[3], body)
    if "versions" in parts:
        request.model_version = parts[5]
    with grpc.insecure_channel(address) as channel:
        return grpc_outputs(GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60))
