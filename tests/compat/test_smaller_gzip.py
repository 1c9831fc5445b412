"""Compressed REST request bodies (issue 13, smaller breaks): ``Content-Encoding: gzip`` and
``deflate`` are inflated as they arrive, bounded by ``--max-body-bytes``; a bomb is 413
with the server's memory flat, an unknown encoding 415, a corrupt or truncated stream 400.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest

from tests.support import Server, build_iris_repository
from tests.support.probes import peak_rss_mib

MAX_BODY = 1_000_000
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
INFER = "/v2/models/iris-logreg/infer"


def iris_body(rows: list[list[float]] = ROWS) -> bytes:
    tensor = {"name": "x", "shape": [len(rows), 4], "datatype": "FP64", "data": rows}
    return orjson.dumps({"inputs": [tensor], "outputs": [{"name": "predict"}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("gzip-repo"))
    with Server(repository, "--workers", "1", "--max-body-bytes", str(MAX_BODY)) as server:
        server.wait_ready()
        yield server


def post(server: Server, body: bytes, encoding: str | None, path: str = INFER) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return httpx.post(server.url + path, content=body, headers=headers, timeout=30)


def predictions(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("GZip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("identity", lambda body: body),
    ],
)
def test_a_compressed_body_answers_as_the_plain_one(server, encoding, compress):
    plain = predictions(post(server, iris_body(), None))
    assert predictions(post(server, compress(iris_body()), encoding)) == plain == [0, 2]


def test_several_gzip_members_are_one_body(server):
    body = iris_body()
    members = gzip.compress(body[:20]) + gzip.compress(body[20:])
    assert predictions(post(server, members, "gzip")) == [0, 2]


def test_a_chunked_gzip_body_is_inflated_as_it_arrives(server):
    compressed = gzip.compress(iris_body())

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(compressed), 7):
            yield compressed[start : start + 7]

    response = httpx.post(
        server.url + INFER, content=chunks(), headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert predictions(response) == [0, 2]


def test_tritonclient_with_gzip_request_compression(server):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    rows = np.array(ROWS, dtype=np.float64)
    for binary in (False, True):
        x = triton.InferInput("x", list(rows.shape), "FP64")
        x.set_data_from_numpy(rows, binary_data=binary)
        result = client.infer(
            "iris-logreg",
            [x],
            outputs=[triton.InferRequestedOutput("predict", binary_data=binary)],
            request_compression_algorithm="gzip",
        )
        assert result.as_numpy("predict").tolist() == [0, 2]


def test_the_decompressed_size_is_bounded_by_max_body_bytes(server):
    # Under the limit compressed (about 10 KB), over it once inflated (about 10 MB).
    rows = [[5.1, 3.5, 1.4, 0.2]] * 260_000
    body = iris_body(rows)
    assert len(body) > MAX_BODY
    compressed = gzip.compress(body)
    assert len(compressed) < MAX_BODY
    response = post(server, compressed, "gzip")
    assert response.status_code == 413, response.text
    assert response.json()["error"] == (
        f"decompressed request body exceeds the limit of {MAX_BODY} bytes (--max-body-bytes)"
    )


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_a_bomb_is_413_and_the_memory_stays_flat(server, encoding, compress):
    bomb = compress(b"\0" * 500_000_000)  # 500 MB of zeros in about 500 KB
    assert len(bomb) < MAX_BODY
    peak_before = peak_rss_mib(server.process.pid)
    response = post(server, bomb, encoding)
    assert response.status_code == 413, response.text
    assert "decompressed request body exceeds the limit" in response.json()["error"]
    # Inflated at most the limit before the refusal: the frontend's peak barely moved.
    assert peak_rss_mib(server.process.pid) - peak_before < 20
    assert predictions(post(server, iris_body(), None)) == [0, 2]


@pytest.mark.parametrize("encoding", ["br", "compress", "gzip, gzip", "zstd", "gzip;q=1", ""])
def test_an_unknown_encoding_is_415(server, encoding):
    response = post(server, gzip.compress(iris_body()), encoding)
    assert response.status_code == 415, response.text
    assert "is not supported; use gzip, deflate or identity" in response.json()["error"]


def test_a_corrupt_stream_is_400(server):
    compressed = bytearray(gzip.compress(iris_body()))
    compressed[12:20] = b"\xff" * 8
    response = post(server, bytes(compressed), "gzip")
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("request body is not valid gzip data")


@pytest.mark.parametrize(
    ("encoding", "body", "message"),
    [
        ("gzip", gzip.compress(iris_body())[:-10], "ends inside its gzip stream (truncated)"),
        ("deflate", zlib.compress(iris_body())[:-3], "ends inside its deflate stream"),
        ("gzip", b"", "ends inside its gzip stream"),
        ("gzip", iris_body(), "is not valid gzip data"),
        ("deflate", gzip.compress(iris_body()), "is not valid deflate data"),
        ("deflate", zlib.compress(iris_body()) + b"junk", "data after the end of its deflate"),
        ("gzip", gzip.compress(iris_body()) + b"junk", "is not valid gzip data"),
    ],
)
def test_a_broken_stream_is_400(server, encoding, body, message):
    response = post(server, body, encoding)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_the_repository_index_takes_gzip_too(server):
    response = post(server, gzip.compress(b'{"ready": true}'), "gzip", "/v2/repository/index")
    assert response.status_code == 200, response.text
    assert {entry["name"] for entry in response.json()} == {"iris-logreg", "iris-rf"}
    response = post(server, b"garbage", "gzip", "/v2/repository/index")
    assert response.status_code == 400
