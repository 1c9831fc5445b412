"""Stream in, stream out with MLServer 1.7.1 installed: an unchanged MLServer runtime
(``from mlserver import MLModel``) whose ``predict_stream`` keeps a running total over the
client's requests, driven one request at a time over gRPC ModelStreamInfer, answers the
same in inferpool (a worker, and in-process) as in MLServer itself: one ``predict_stream``
call for the whole client stream, each request answered before the next is sent, every
response under the first request's id.

Run by tox's ``mlserver`` environment (marker ``mlserver``, tests/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server
from tests.support.mlserver import running_mlserver
from tests.support.stream_calls import Conversation, totals, typed_request

RUNNING_TOTAL = """
from typing import AsyncIterator

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class RunningTotal(MLModel):
    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        total, seen = 0.0, 0
        async for payload in payloads:
            total += float(NumpyCodec.decode_input(payload.inputs[0]).sum())
            seen += 1
            yield InferenceResponse(
                model_name=self.name,
                outputs=[NumpyCodec.encode_output("total", np.array([total, seen]))],
            )
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlserver-stream-input")
    folder = root / "total"
    folder.mkdir()
    (folder / "running_total.py").write_text(RUNNING_TOTAL)
    settings = {"name": "total", "implementation": "running_total.RunningTotal"}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(scope="module", params=["1", "0"], ids=["workers", "in-process"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def mlserver_grpc(repository: Path) -> Iterator[str]:
    with running_mlserver(repository) as (_, address):
        yield address


def converse(address: str) -> list:
    """Three requests, each sent once the previous one's answer came; then the end."""
    talk = Conversation(address)
    answers = []
    for n, values in enumerate(([1.0, 2.0], [10.0], [100.0])):
        talk.send(typed_request("total", values, "stream-1" if n == 0 else f"later-{n}"))
        answers.append(talk.receive())
    assert talk.close() == []
    return answers


def test_one_predict_stream_takes_the_whole_stream_as_in_mlserver(
    server: Server, mlserver_grpc: str
) -> None:
    ours, theirs = converse(server.grpc_address), converse(mlserver_grpc)
    expected = [[3.0, 1.0], [13.0, 2.0], [113.0, 3.0]]
    assert [totals(answer) for answer in ours] == [totals(a) for a in theirs] == expected
    assert [a.id for a in ours] == [a.id for a in theirs] == ["stream-1"] * 3
    assert [a.model_name for a in ours] == [a.model_name for a in theirs] == ["total"] * 3
