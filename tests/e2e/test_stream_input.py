"""Stream in, stream out: a gRPC ModelStreamInfer call to an MLServer custom runtime reaches
ONE ``predict_stream`` call, whose payloads are the client's requests as it sends them
(``frontends/grpc/stream_input.py``, ``engine/stream_feed.py``), as MLServer 1.7.1 does;
inferpool's own runtimes keep Triton's semantics (each request its own call).

Real servers (a worker pool and ``--workers 0``, both gRPC servers) and a plain grpcio
client whose request iterator sends each request only after the previous answer came: the
runtime answered the first request before the second existed.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, write_custom_model
from tests.support.grpc import needs_pool
from tests.support.stream_calls import Conversation, stream_method, totals, typed_request

# An MLServer custom runtime, written against inferpool.mlserver: a running total of the
# stream's values, one response per request, each saying how many requests it has seen
# and in how many predict_stream calls; "fail" makes it raise, and its generator's end
# (closed or finished) is written to CLOSED_DIR, named by its first id and its count.
ACCUMULATOR = """
    import os
    from typing import AsyncIterator

    import numpy as np
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.codecs import NumpyCodec
    from inferpool.mlserver.errors import InferenceError
    from inferpool.mlserver.types import InferenceRequest, InferenceResponse

    CLOSED_DIR = {closed_dir!r}


    class Accumulator(MLModel):
        calls = 0

        async def predict_stream(
            self, payloads: AsyncIterator[InferenceRequest]
        ) -> AsyncIterator[InferenceResponse]:
            type(self).calls += 1
            total, seen, first_id = 0.0, 0, None
            try:
                async for payload in payloads:
                    values = NumpyCodec.decode_input(payload.inputs[0])
                    if (values < 0).any():
                        raise InferenceError("negative values are refused")
                    total += float(values.sum())
                    seen += 1
                    first_id = first_id or payload.id
                    answer = np.array([total, seen, type(self).calls], dtype=np.float64)
                    yield InferenceResponse(
                        model_name=self.name,
                        id=payload.id,
                        outputs=[NumpyCodec.encode_output("total", answer)],
                    )
            finally:
                marker = os.path.join(CLOSED_DIR, f"closed-{{first_id}}-{{seen}}")
                open(marker, "w").close()
"""

# inferpool's own Runtime with predict_stream: Triton's semantics, a call per request.
COUNTER = """
    import numpy as np
    from inferpool import Runtime


    class Counter(Runtime):
        calls = 0

        def load(self):
            pass

        def predict(self, payload, outputs):
            return {"total": np.asarray(payload, dtype=np.float64)}

        async def predict_stream(self, payloads):
            type(self).calls += 1
            async for payload in payloads:
                values = np.asarray(payload, dtype=np.float64)
                yield {"total": np.array([values.sum(), type(self).calls])}
"""

# MLServer's default predict_stream, written out: the first request only.
FIRST_ONLY = """
    from typing import AsyncIterator

    from inferpool.mlserver import MLModel
    from inferpool.mlserver.codecs import NumpyCodec
    from inferpool.mlserver.types import InferenceRequest, InferenceResponse


    class FirstOnly(MLModel):
        async def predict_stream(
            self, payloads: AsyncIterator[InferenceRequest]
        ) -> AsyncIterator[InferenceResponse]:
            payload = await payloads.__anext__()
            values = NumpyCodec.decode_input(payload.inputs[0])
            yield InferenceResponse(
                model_name=self.name, outputs=[NumpyCodec.encode_output("total", values)]
            )
"""

SETUPS = [
    pytest.param(("builtin", 0), id="builtin-w0"),
    pytest.param(("builtin", 2), id="builtin-w2", marks=needs_pool),
    pytest.param(("grpcio", 2), id="grpcio-w2", marks=needs_pool),
]


def repository(root: Path, closed: Path) -> Path:
    source = ACCUMULATOR.format(closed_dir=str(closed))
    write_custom_model(root / "acc", source, "Accumulator", module="accumulator")
    write_custom_model(root / "other", source, "Accumulator", module="accumulator_other")
    spec = [{"name": "x", "datatype": "FP64", "shape": [-1]}]
    out = [{"name": "total", "datatype": "FP64", "shape": [-1]}]
    write_custom_model(root / "counter", COUNTER, "Counter", inputs=spec, outputs=out)
    write_custom_model(root / "first-only", FIRST_ONLY, "FirstOnly", module="first_only")
    return root


@pytest.fixture(scope="module", params=SETUPS)
def server(request, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("stream-input")
    closed = root / "closed"
    closed.mkdir()
    implementation, workers = request.param
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(repository(root / "models", closed), *flags) as running:
        running.wait_ready()
        running.closed = closed  # type: ignore[attr-defined]
        yield running


def test_one_predict_stream_takes_the_clients_whole_stream(server: Server) -> None:
    talk = Conversation(server.grpc_address)
    talk.send(typed_request("acc", [1.0, 2.0], "first-id"))
    first = talk.receive()  # answered while the second request does not exist yet
    talk.send(typed_request("acc", [10.0]))
    second = talk.receive()
    talk.send(typed_request("acc", [100.0], "ignored-id"))
    third = talk.receive()
    assert talk.close() == []  # no more responses; the call ends OK
    total, seen, calls = totals(first)
    assert (total, seen) == (3.0, 1.0)
    assert totals(second)[:2] == [13.0, 2.0]
    assert totals(third) == [113.0, 3.0, calls]  # the same predict_stream call throughout
    # MLServer's rule: every response carries the stream's first id.
    assert [r.id for r in (first, second, third)] == ["first-id"] * 3
    assert all(r.model_name == "acc" for r in (first, second, third))


def test_a_second_call_is_a_second_predict_stream(server: Server) -> None:
    runs = []
    for _ in range(2):
        talk = Conversation(server.grpc_address)
        talk.send(typed_request("acc", [1.0]))
        runs.append(totals(talk.receive()))
        assert talk.close() == []
    assert runs[0][:2] == runs[1][:2] == [1.0, 1.0]  # a fresh total each call


def test_a_fast_client_is_held_back_and_loses_nothing(server: Server) -> None:
    # Many requests at once (no waiting for answers): the input window holds the client
    # back; every request is answered, in order, by the one call.
    count = 40
    with grpc.insecure_channel(server.grpc_address) as channel:
        method = stream_method(channel, pb.ModelInferResponse)
        requests = (typed_request("acc", [float(n)]) for n in range(1, count + 1))
        answers = [totals(answer) for answer in method(requests, timeout=60)]
    assert [answer[1] for answer in answers] == [float(n) for n in range(1, count + 1)]
    assert answers[-1][0] == count * (count + 1) / 2
    assert len({answer[2] for answer in answers}) == 1


def test_a_request_naming_another_model_ends_the_call(server: Server) -> None:
    talk = Conversation(server.grpc_address)
    talk.send(typed_request("acc", [1.0]))
    assert totals(talk.receive())[:2] == [1.0, 1.0]
    talk.send(typed_request("other", [2.0]))
    with pytest.raises(grpc.RpcError) as failure:
        talk.receive()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request 2 of the stream names model 'other'" in failure.value.details()
    assert "runs model 'acc'" in failure.value.details()
    talk.channel.close()


def test_a_request_without_a_model_name_joins_the_stream(server: Server) -> None:
    talk = Conversation(server.grpc_address)
    talk.send(typed_request("acc", [1.0]))
    talk.receive()
    talk.send(typed_request("", [2.0]))
    assert totals(talk.receive())[:2] == [3.0, 2.0]
    assert talk.close() == []


def test_the_runtimes_error_ends_the_call_with_its_status(server: Server) -> None:
    talk = Conversation(server.grpc_address)
    talk.send(typed_request("acc", [1.0]))
    assert totals(talk.receive())[:2] == [1.0, 1.0]
    talk.send(typed_request("acc", [-1.0]))
    with pytest.raises(grpc.RpcError) as failure:
        talk.receive()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "negative values are refused" in failure.value.details()
    talk.channel.close()


def test_tritons_message_carries_the_error_then_the_call_ends(server: Server) -> None:
    # Raw contents: Triton's ModelStreamInferResponse, the same single predict_stream.
    def raw(values):
        request = pb.ModelInferRequest(model_name="acc")
        request.inputs.add(name="x", datatype="FP64", shape=[len(values)])
        import numpy as np

        request.raw_input_contents.append(np.array(values, "<f8").tobytes())
        return request

    with grpc.insecure_channel(server.grpc_address) as channel:
        method = stream_method(channel, pb.ModelStreamInferResponse)
        answers = list(method(iter([raw([1.0]), raw([2.0]), raw([-1.0]), raw([5.0])]), timeout=60))
    assert [totals(a.infer_response)[:2] for a in answers[:2]] == [[1.0, 1.0], [3.0, 2.0]]
    assert "negative values are refused" in answers[2].error_message
    assert len(answers) == 3  # the stream ended with its predict_stream


def test_a_client_that_cancels_closes_the_runtimes_generator(server: Server) -> None:
    closed: Path = server.closed  # type: ignore[attr-defined]
    talk = Conversation(server.grpc_address)
    talk.send(typed_request("acc", [7.0], "cancelled-call"))
    assert totals(talk.receive())[:2] == [7.0, 1.0]
    # The runtime now awaits the next request; the client goes away instead.
    marker = closed / "closed-cancelled-call-1"
    assert not marker.exists()
    talk.call.cancel()
    talk.channel.close()
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), sorted(p.name for p in closed.iterdir())
    # Nothing held: the frontend counts no request of the model in flight any more.
    assert in_flight(server, "acc") == 0
    # Nothing stuck: the next call streams as usual.
    again = Conversation(server.grpc_address)
    again.send(typed_request("acc", [1.0]))
    assert totals(again.receive())[:2] == [1.0, 1.0]
    assert again.close() == []


def test_the_call_ends_when_the_runtime_stops_taking_requests(server: Server) -> None:
    # MLServer's: the runtime's generator ends the call; requests it did not take are
    # not answered, and the server stays well (the next call works).
    with grpc.insecure_channel(server.grpc_address) as channel:
        method = stream_method(channel, pb.ModelInferResponse)
        for _ in range(2):
            requests = (typed_request("first-only", [float(n)]) for n in range(1, 30))
            answers = [totals(answer) for answer in method(requests, timeout=60)]
            assert answers == [[1.0]]
    assert in_flight(server, "first-only") == 0


def in_flight(server: Server, model: str, timeout: float = 10) -> float:
    """The model's ``inferpool_model_in_flight_requests``, once it is 0 (or the timeout)."""
    pattern = re.compile(rf'inferpool_model_in_flight_requests\{{model="{model}",[^}}]*\}} (\S+)')
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        value = float(pattern.search(text).group(1))
        if value == 0 or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_inferpools_own_runtimes_take_each_request_on_its_own(server: Server) -> None:
    # Triton's semantics: each request of the call is its own predict_stream call.
    with grpc.insecure_channel(server.grpc_address) as channel:
        method = stream_method(channel, pb.ModelStreamInferResponse)
        requests = [typed_request("counter", [1.0, 2.0]), typed_request("counter", [5.0])]
        answers = [totals(a.infer_response) for a in method(iter(requests), timeout=60)]
    assert [answer[0] for answer in answers] == [3.0, 5.0]
    assert answers[1][1] == answers[0][1] + 1  # a second call of predict_stream


def test_many_streams_at_once_stay_apart(server: Server) -> None:
    results: dict[int, list] = {}

    def run(n: int) -> None:
        talk = Conversation(server.grpc_address)
        got = []
        for _ in range(3):
            talk.send(typed_request("acc", [float(n)]))
            got.append(totals(talk.receive())[:2])
        talk.close()
        results[n] = got

    threads = [threading.Thread(target=run, args=(n,)) for n in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {n: [[n, 1.0], [2.0 * n, 2.0], [3.0 * n, 3.0]] for n in range(1, 7)}
