"""A large REST JSON tensor through a real server (issue 18 point 4): the JSON tensor
scanner's answer is the one of the path without it.

The same 256 x 50 FP32 tensor goes three ways: as a client writes it (the scanner reads
the data), with the data before the datatype and shape (the scanner reads it when the
tensor's object closes), and with the ``data`` key escaped (``"d\\u0061ta"``: orjson reads
it, as it does every body without the scanner). An identity model sends the tensor back;
the three replies are the same bytes and hold the tensor exactly. A wrong value count is
the same 400 both ways.

A tensor as Python clients write it (17 digits a value, read by the scanner's Eisel-Lemire
conversion) gives the same answer too. Hostile bodies: millions of values for a 2 x 2
shape, in the quick runs' form, in 17 digits (Eisel-Lemire's) and in more digits than 19
(left to orjson), and a body that trickles in small chunks, each with health checks kept
fast and the memory coming back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import psutil
import pytest

from inferpool.protocol import json_scan
from tests.support import Server
from tests.support.probes import HealthProbe
from tests.support.runtimes import write_echo_model

ROWS, COLUMNS = 256, 50


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("json-scan-repo")
    write_echo_model(root, "identity", [{"name": "x", "datatype": "FP32", "shape": [-1, COLUMNS]}])
    with Server(root, "--workers", "1") as running:
        running.wait_ready()
        yield running


def tensor() -> np.ndarray:
    x = np.random.default_rng(7).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    # Values where rounding or signs go wrong first: -0, subnormals, the largest float32.
    x[0, :4] = [-0.0, 1e-45, -3.4028235e38, 1.1754942e-38]
    return x


def body(x: np.ndarray, variant: str, shape: list[int] | None = None) -> bytes:
    data = "[" + ",".join(str(v) for v in x.ravel()) + "]"  # how a float32 client writes
    key = '"d\\u0061ta"' if variant == "escaped" else '"data"'
    header = f'"name": "x", "shape": {shape or list(x.shape)}, "datatype": "FP32"'
    fields = f"{key}: {data}, {header}" if variant == "data-first" else f"{header}, {key}: {data}"
    return ('{"id": "same", "inputs": [{' + fields + "}]}").encode()


def infer(server: Server, payload: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v2/models/identity/infer",
        content=payload,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )


@pytest.mark.skipif(not json_scan.AVAILABLE, reason="the _jsonscan extension is not built")
def test_a_large_json_tensor_decodes_as_without_the_scanner(server: Server) -> None:
    x = tensor()
    replies = {
        variant: infer(server, body(x, variant)) for variant in ("plain", "data-first", "escaped")
    }
    for variant, reply in replies.items():
        assert reply.status_code == 200, (variant, reply.text[:300])
    assert replies["plain"].content == replies["escaped"].content
    assert replies["data-first"].content == replies["escaped"].content
    (output,) = orjson.loads(replies["plain"].content)["outputs"]
    got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    assert got.tobytes() == x.tobytes()  # bit for bit, -0.0 and subnormals included


@pytest.mark.skipif(not json_scan.AVAILABLE, reason="the _jsonscan extension is not built")
def test_a_wrong_value_count_is_the_same_400(server: Server) -> None:
    x = tensor()
    wrong = [ROWS, COLUMNS + 1]
    fast, slow = (infer(server, body(x, variant, wrong)) for variant in ("plain", "escaped"))
    assert fast.status_code == slow.status_code == 400
    assert fast.json() == slow.json()
    assert "needs 13056 values, got 12800" in fast.text


def tree_rss_mib(server: Server) -> float:
    """The resident memory of the frontend and its workers."""
    process = psutil.Process(server.process.pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


@pytest.mark.skipif(not json_scan.AVAILABLE, reason="the _jsonscan extension is not built")
@pytest.mark.parametrize(
    ("token", "count"),
    [
        # Plain decimals, each followed by a comma: read in quick runs, counted, never
        # stored past the 4 the shape declares.
        ("1.5", 4_000_000),
        # 17 significant digits, as tritonclient writes them: each one read by Eisel-Lemire,
        # counted, never stored past the 4.
        ("1.2345678901234567", 3_000_000),
        # 21 significant digits: past the scanner's conversions, so it leaves the body to
        # orjson after the first few (SLOW_TRIAL), which builds the list of them all.
        ("1.23456789012345678901", 2_500_000),
    ],
)
def test_millions_of_values_for_a_small_shape_are_a_400_and_memory_comes_back(
    server: Server, token: str, count: int
) -> None:
    lying = (
        '{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": ['
        + f"{token}," * (count - 1)
        + f'{token}]}}], "id": "lying"}}'
    ).encode()
    before = tree_rss_mib(server)
    with HealthProbe(server):
        for _ in range(3):
            reply = infer(server, lying)
            assert reply.status_code == 400, reply.text[:300]
            assert f"needs 4 values, got {count}" in reply.json()["error"]
    assert infer(server, body(tensor(), "plain")).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and tree_rss_mib(server) > before * 1.1 + 20:
        time.sleep(0.2)
    assert tree_rss_mib(server) <= before * 1.1 + 20, (before, tree_rss_mib(server))


@pytest.mark.skipif(not json_scan.AVAILABLE, reason="the _jsonscan extension is not built")
def test_a_tensor_written_through_python_floats_decodes_exactly(server: Server) -> None:
    # ndarray.tolist(), as tritonclient and MLServer's codecs write JSON: 17 digits a
    # value, which the scanner reads (Eisel-Lemire); the answer is the escaped body's.
    x = tensor()
    document = {"id": "same", "inputs": [{"name": "x", "shape": [ROWS, COLUMNS],
                                          "datatype": "FP32", "data": x.tolist()}]}  # fmt: skip
    reply = infer(server, orjson.dumps(document))
    assert reply.status_code == 200, reply.text[:300]
    assert reply.content == infer(server, body(x, "escaped")).content
    (output,) = orjson.loads(reply.content)["outputs"]
    assert np.array(output["data"], dtype=np.float32).tobytes() == x.tobytes()


def test_a_body_that_trickles_in_small_chunks_is_read_whole(server: Server) -> None:
    x = tensor()
    payload = body(x, "plain")

    def trickle() -> Iterator[bytes]:
        yield payload[:70_000]  # a first chunk that is kept as it came, then small ones
        for start in range(70_000, len(payload), 997):
            yield payload[start : start + 997]
            if start % 20 == 0:
                time.sleep(0.001)

    with HealthProbe(server):
        reply = httpx.post(
            f"{server.url}/v2/models/identity/infer",
            content=trickle(),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
    assert reply.status_code == 200, reply.text[:300]
    (output,) = reply.json()["outputs"]
    assert np.array(output["data"], dtype=np.float32).tobytes() == x.tobytes()
