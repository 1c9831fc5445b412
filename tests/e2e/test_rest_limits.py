"""REST limits and timeouts against hostile clients (issue 12, points 1-2 for REST).

Real servers on 127.0.0.1, raw sockets for the slow, silent and lying peers. Every test
asserts the error or the close, and that another client's health check kept answering
quickly meanwhile; the big-body and slow-reader tests also check the server's memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Server, build_iris_repository, free_port, write_custom_model
from tests.support.probes import HealthProbe, health_latency, peak_rss_mib, rss_mib

MAX_BODY = 1_000_000
HEADER_TIMEOUT = 1.0
HANDSHAKE_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
IDLE_TIMEOUT = 3.0
WRITE_TIMEOUT = 2.0
MAX_CONNECTIONS = 50
LIMIT_FLAGS = (
    "--max-body-bytes", str(MAX_BODY),
    "--max-header-bytes", "8192",
    "--max-header-count", "50",
    "--handshake-timeout", str(HANDSHAKE_TIMEOUT),
    "--header-timeout", str(HEADER_TIMEOUT),
    "--body-timeout", str(BODY_TIMEOUT),
    "--idle-timeout", str(IDLE_TIMEOUT),
    "--write-timeout", str(WRITE_TIMEOUT),
    "--max-connections", str(MAX_CONNECTIONS),
)  # fmt: skip

# Test hooks: sleep (seconds), mark (a folder the model drops a file into as it starts),
# big (answer that many UINT8 zeros: about twice as many bytes of JSON).
HOOKS_RUNTIME = """
    import os
    import time
    import uuid

    import numpy as np

    from inferpool import Runtime, TensorSpec, custom_endpoint


    class Hooks(Runtime):
        accepts = "dict"

        def load(self):
            pass

        @custom_endpoint("/echo", methods=["POST"])
        def echo(self, request):
            return request.body

        def outputs(self):
            return [TensorSpec("y", "UINT8", [-1])]

        def predict(self, payload, outputs):
            if "mark" in payload:
                folder = payload["mark"].reshape(-1)[0].decode()
                open(os.path.join(folder, uuid.uuid4().hex), "w").close()
            if "sleep" in payload:
                time.sleep(float(payload["sleep"].reshape(-1)[0]))
            size = int(payload["big"].reshape(-1)[0]) if "big" in payload else 1
            return {"y": np.zeros(size, dtype=np.uint8)}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("limits-repo"))
    write_custom_model(root / "hooks", HOOKS_RUNTIME, "Hooks")
    return root


@pytest.fixture(scope="module")
def pool(repo) -> Iterator[Server]:
    with Server(repo, "--workers", "2", *LIMIT_FLAGS) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="module")
def inproc(repo) -> Iterator[Server]:
    with Server(repo, "--workers", "0", *LIMIT_FLAGS) as server:
        server.wait_ready()
        yield server


@pytest.fixture(params=["pool", "inproc"])
def server(request) -> Server:
    """Both engines: workers 2 and workers 0."""
    return request.getfixturevalue(request.param)


# -- helpers -------------------------------------------------------------------------------
def iris_body() -> bytes:
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5.1, 3.5, 1.4, 0.2]}
    return json.dumps({"inputs": [tensor]}).encode()


def hooks_body(**hooks) -> bytes:
    inputs = []
    for name, value in hooks.items():
        datatype = {"sleep": "FP64", "mark": "BYTES", "big": "INT64"}[name]
        inputs.append({"name": name, "shape": [1], "datatype": datatype, "data": [value]})
    return json.dumps({"inputs": inputs}).encode()


def connect(server: Server, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def request_bytes(path: str, body: bytes = b"", method: str = "POST", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_until_closed(sock: socket.socket, limit: float = 10) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and how long that took."""
    started = time.monotonic()
    data = b""
    while time.monotonic() - started < limit:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    else:
        raise AssertionError(f"the server kept the connection open for {limit}s")
    return data, time.monotonic() - started


def read_response(sock: socket.socket) -> bytes:
    """One whole answer (with a Content-Length) from a keep-alive connection."""
    return read_responses(sock, 1)[0]


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` whole answers from a keep-alive connection (pipelined answers may share a
    read, which ``read_response`` would drop)."""
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            length = next(
                int(line.split(b":")[1])
                for line in data[:head_end].split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            end = head_end + 4 + length
            if len(data) >= end:
                answers.append(data[:end])
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} answers and {data[:200]!r}"
        data += chunk
    return answers


def status_and_error(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- body size -----------------------------------------------------------------------------
def test_content_length_over_the_limit_is_413_before_the_body_is_sent(server):
    with HealthProbe(server), connect(server) as sock:
        head = request_bytes("/v2/models/iris-logreg/infer")
        sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 100000000"))
        raw, elapsed = read_until_closed(sock)
    status, error = status_and_error(raw)
    assert status == 413
    assert f"exceeds the limit of {MAX_BODY} bytes (--max-body-bytes)" in error
    assert elapsed < 5  # answered at once, closed after a short linger


@pytest.mark.parametrize(
    "route",
    [
        "/v2/models/iris-logreg/infer",
        "/v2/models/hooks/echo",
        # Every other route that reads a body: KServe V1, Triton's trace and log settings.
        "/v1/models/iris-logreg:predict",
        "/v2/trace/setting",
        "/v2/models/iris-logreg/trace/setting",
        "/v2/logging",
    ],
)
def test_chunked_body_over_the_limit_is_413_and_memory_stays_flat(server, route):
    chunk = b" " * 65536
    sent = 0

    def upload():
        nonlocal sent
        for _ in range(800):  # 50 MiB, unless the server stops reading
            sent += len(chunk)
            yield chunk

    peak_before = peak_rss_mib(server.process.pid)
    with HealthProbe(server), httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post(route, content=upload())
    assert response.status_code == 413, response.text
    assert "(--max-body-bytes)" in response.json()["error"]
    # The body was cut at the limit, not buffered: the peak RSS barely moved.
    assert peak_rss_mib(server.process.pid) - peak_before < 20
    assert httpx.post(server.url + "/v2/models/iris-logreg/infer", content=iris_body()).is_success


def test_body_at_the_limit_is_served(pool):
    padded = iris_body()[:-1] + b" " * (MAX_BODY - len(iris_body())) + b"}"
    assert len(padded) == MAX_BODY
    response = httpx.post(pool.url + "/v2/models/iris-logreg/infer", content=padded, timeout=30)
    assert response.status_code == 200, response.text


def test_an_answer_before_the_body_arrived_keeps_the_connection_usable(server):
    with connect(server) as sock:
        # A route that reads no body answers (405) before the body has arrived ...
        head = request_bytes("/v2/health/live", b"0123456789")
        sock.sendall(head[:-10])
        assert read_response(sock).startswith(b"HTTP/1.1 405")
        # ... which then arrives, and the next request on the connection is served.
        time.sleep(0.2)
        sock.sendall(b"0123456789" + request_bytes("/v2/health/live", method="GET"))
        assert read_response(sock).startswith(b"HTTP/1.1 200")


# -- large bodies, pipelined, cut short or stopped ---------------------------------------------
def iris_rows_body(rows: int) -> bytes:
    """A JSON body of about 22 bytes a row: larger than one read from about 3,000 rows."""
    data = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 2.8, 4.3, 1.3]] * (rows // 3)
    tensor = {"name": "x", "shape": [len(data), 4], "datatype": "FP32", "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


def chunked_answer(server: Server, body: bytes) -> list:
    """The model's answer to ``body`` sent chunked, on a connection of its own."""
    response = httpx.post(
        server.url + "/v2/models/iris-logreg/infer", content=iter([body[:1000], body[1000:]])
    )
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def test_pipelined_large_requests_are_each_answered_in_turn(server):
    bodies = [iris_rows_body(rows) for rows in (3000, 1500, 2400)]
    expected = [chunked_answer(server, body) for body in bodies]
    path = "/v2/models/iris-logreg/infer"
    with HealthProbe(server), connect(server) as sock:
        sock.sendall(
            b"".join(request_bytes(path, body) for body in bodies)
            + request_bytes("/v2/health/live", method="GET")
        )
        answers = read_responses(sock, 4)
    for raw, want in zip(answers[:3], expected, strict=True):
        assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
        assert json.loads(raw.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == want
    assert answers[3].startswith(b"HTTP/1.1 200")  # the health check behind them


def test_a_content_length_short_of_a_large_body_cuts_it_there(server):
    """The body ends where its Content-Length says, and what follows is parsed as the next
    request: here not one, while the first still runs, so the connection is cut at once
    (no answer can go in front of the running one's); the server goes on serving."""
    body = iris_rows_body(3000)
    head = request_bytes("/v2/models/iris-logreg/infer", body)
    short = b"Content-Length: %d" % (len(body) - 50)
    lying = head.replace(b"Content-Length: %d" % len(body), short)
    with HealthProbe(server), connect(server) as sock:
        sock.sendall(lying)
        raw, elapsed = read_until_closed(sock)
    assert not raw.startswith(b"HTTP/1.1 200"), raw[:300]
    assert elapsed < 2
    assert chunked_answer(server, body)  # and the same body, sent right, is served


def test_a_large_body_that_stops_arriving_gets_408_at_the_body_timeout(server):
    body = iris_rows_body(3000)
    with HealthProbe(server), connect(server) as sock:
        sock.sendall(request_bytes("/v2/models/iris-logreg/infer", body)[: -len(body) // 2])
        raw, elapsed = read_until_closed(sock)
    status, error = status_and_error(raw)
    assert status == 408
    assert "--body-timeout" in error
    assert BODY_TIMEOUT - 0.2 < elapsed < BODY_TIMEOUT + 2


# -- Inference-Header-Content-Length --------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("99999999999999999999999", "non-negative integer"),
        ("9223372036854775808", "larger than the request body"),
        ("-1", "non-negative integer"),
        ("+5", "non-negative integer"),
        ("1_0", "non-negative integer"),
        ("abc", "non-negative integer"),
        ("1000", "larger than the request body"),
    ],
)
def test_bad_binary_header_length_is_400_at_once(server, value, fragment):
    headers = {"Inference-Header-Content-Length": value}
    response = httpx.post(
        server.url + "/v2/models/iris-logreg/infer", content=iris_body(), headers=headers
    )
    assert response.status_code == 400, response.text
    assert "Inference-Header-Content-Length" in response.json()["error"]
    assert fragment in response.json()["error"]


def test_many_bad_binary_header_lengths_leave_every_queue_slot_free(pool):
    headers = {"Inference-Header-Content-Length": "99999999999999999999"}
    with httpx.Client(base_url=pool.url, timeout=30) as http:
        for _ in range(300):  # more than --max-queue (128) per worker
            response = http.post("/v2/models/iris-logreg/infer", content=b"{}", headers=headers)
            assert response.status_code == 400
        response = http.post("/v2/models/iris-logreg/infer", content=iris_body())
        assert response.status_code == 200, response.text


# -- Request-Timeout -------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", ""])
def test_bad_request_timeout_is_400(server, value):
    response = httpx.post(
        server.url + "/v2/models/iris-logreg/infer",
        content=iris_body(),
        headers={"Request-Timeout": value},
    )
    assert response.status_code == 400, response.text
    assert "Request-Timeout" in response.json()["error"]


def test_request_timeout_answers_504_and_the_frontend_stops_waiting(pool):
    # The probe's bound is the 3 s predict less the 0.5 s deadline: a frontend that waited
    # for the predict on its loop would hold a check that long. Fresh-connection checks
    # took 1.1-1.7 s under tox -e lowest's coverage on a loaded host (ci17).
    with HealthProbe(pool, limit=2.5):
        started = time.monotonic()
        response = httpx.post(
            pool.url + "/v2/models/hooks/infer",
            content=hooks_body(sleep=3),
            headers={"Request-Timeout": "0.5"},
            timeout=30,
        )
        elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert "deadline" in response.json()["error"]
    assert elapsed < 2.5
    # A huge timeout means no deadline (it must still fit the worker's slot header).
    response = httpx.post(
        pool.url + "/v2/models/iris-logreg/infer",
        content=iris_body(),
        headers={"Request-Timeout": "1e300"},
    )
    assert response.status_code == 200, response.text


# -- disconnects -----------------------------------------------------------------------------
def queued_then_gone(server: Server, marks: Path, queued: int) -> int:
    """How many of ``queued`` requests ran after their clients went away.

    Two requests keep the model busy for 2 s (both workers, or the one loop); then
    ``queued`` requests that would each leave a file in ``marks`` queue behind them, and
    their clients close their connections.
    """
    busy = [connect(server) for _ in range(2)]
    for sock in busy:
        sock.sendall(request_bytes("/v2/models/hooks/infer", hooks_body(sleep=2)))
    time.sleep(0.3)
    waiting = [connect(server) for _ in range(queued)]
    for sock in waiting:
        sock.sendall(request_bytes("/v2/models/hooks/infer", hooks_body(mark=str(marks))))
    time.sleep(0.3)
    for sock in waiting:
        sock.close()
    for sock in busy:
        raw = read_response(sock)
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        sock.close()
    time.sleep(1.0)
    return len(list(marks.iterdir()))


def test_a_client_that_disconnects_cancels_its_queued_requests(pool, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    ran = queued_then_gone(pool, marks, 6)
    assert ran == 0, f"{ran} of 6 requests of clients gone still ran"
    # The workers serve on.
    response = httpx.post(pool.url + "/v2/models/hooks/infer", content=hooks_body(mark=str(marks)))
    assert response.status_code == 200
    assert len(list(marks.iterdir())) == 1


def test_disconnects_during_upload_and_while_queued_log_no_traceback(server):
    before = server.output()
    for _ in range(5):
        with connect(server) as sock:
            head = request_bytes("/v2/models/iris-logreg/infer", iris_body())
            sock.sendall(head[:-20])  # headers, and part of the body
            time.sleep(0.05)
    if server.process.args[server.process.args.index("--workers") + 1] != "0":
        with connect(server) as sock:
            sock.sendall(request_bytes("/v2/models/hooks/infer", hooks_body(sleep=0.5)))
            time.sleep(0.1)
    time.sleep(1.0)
    assert health_latency(server) < 1.5
    new = server.output()[len(before) :]
    assert "Traceback" not in new, new
    assert "ERROR" not in new, new


# -- header limits and timeouts --------------------------------------------------------------
def test_too_many_headers_is_431(server):
    headers = {f"X-Filler-{i}": "y" for i in range(80)}
    with HealthProbe(server), connect(server) as sock:
        sock.sendall(request_bytes("/v2/health/live", method="GET", **headers))
        raw, _ = read_until_closed(sock)
    status, error = status_and_error(raw)
    assert status == 431
    assert "50 fields (--max-header-count)" in error


@pytest.mark.parametrize("size", [10_000, 5_000_000])
def test_a_header_block_over_the_limit_is_431(server, size):
    with HealthProbe(server), connect(server) as sock:
        head = request_bytes("/v2/health/live", method="GET", X_Big="a" * 100)
        big = head.replace(b"a" * 100, b"a" * size)
        # The server may answer and close before the whole block is sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(big)
        raw, _ = read_until_closed(sock)
    status, error = status_and_error(raw)
    assert status == 431
    assert "8192 bytes (--max-header-bytes)" in error


def test_silent_connection_is_closed_after_the_handshake_timeout(server):
    with HealthProbe(server), connect(server) as sock:
        raw, elapsed = read_until_closed(sock)
    assert raw == b""
    assert HANDSHAKE_TIMEOUT - 0.2 < elapsed < HANDSHAKE_TIMEOUT + 2


def test_headers_one_byte_at_a_time_get_408_at_the_header_timeout(server):
    head = request_bytes("/v2/health/live", method="GET")
    with HealthProbe(server), connect(server) as sock:
        started = time.monotonic()
        try:
            for byte in head[:-2]:  # never the final CRLF
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - started > 10:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw, _ = read_until_closed(sock)
        elapsed = time.monotonic() - started
    status, error = status_and_error(raw)
    assert status == 408
    assert "--header-timeout" in error
    assert elapsed < HEADER_TIMEOUT + 2.5


def test_a_body_that_stops_arriving_gets_408_at_the_body_timeout(server):
    with HealthProbe(server), connect(server) as sock:
        body = iris_body()
        sock.sendall(request_bytes("/v2/models/iris-logreg/infer", body)[: -len(body) + 5])
        raw, elapsed = read_until_closed(sock)
    status, error = status_and_error(raw)
    assert status == 408
    assert "--body-timeout" in error
    assert BODY_TIMEOUT - 0.2 < elapsed < BODY_TIMEOUT + 2


def test_idle_keep_alive_connection_is_closed_at_the_idle_timeout(server):
    with connect(server) as sock:
        sock.sendall(request_bytes("/v2/health/live", method="GET"))
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        raw, _ = read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert raw == b""
    assert IDLE_TIMEOUT - 0.3 < elapsed < IDLE_TIMEOUT + 1.5  # Uvicorn alone: 5 s
    # A connection that keeps asking is not idle: it stays open past the idle timeout.
    with httpx.Client(base_url=server.url) as http:
        for _ in range(int(IDLE_TIMEOUT / 0.5) + 2):
            assert http.get("/v2/health/live").status_code == 200
            time.sleep(0.5)


def test_the_metrics_port_has_the_same_timeouts(pool):
    with socket.create_connection(("127.0.0.1", pool.metrics_port), timeout=10) as sock:
        raw, elapsed = read_until_closed(sock)
    assert raw == b""
    assert elapsed < HANDSHAKE_TIMEOUT + 2


# -- slow readers ----------------------------------------------------------------------------
def test_a_reader_that_stops_reading_is_closed_and_memory_comes_back(pool):
    """On the module's server, after the tests before it: the answers' memory was kept
    until a full garbage collection ran (frontends/reclaim.py)."""
    pid = pool.process.pid
    baseline = rss_mib(pid)
    readers = []
    # The workers encode 40 MB answers meanwhile, on a shared 2-core machine: a looser bound.
    with HealthProbe(pool, limit=3.0):
        for _ in range(3):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", pool.http_port))
            sock.settimeout(10)
            # 20 M zeros: an answer of about 40 MB that the reader never reads.
            sock.sendall(request_bytes("/v2/models/hooks/infer", hooks_body(big=20_000_000)))
            readers.append(sock)
        deadline = time.monotonic() + 30
        grown = baseline
        while time.monotonic() < deadline and grown < baseline + 60:
            grown = max(grown, rss_mib(pid))
            time.sleep(0.1)
        assert grown >= baseline + 60, (baseline, grown)
        # Within the write timeout (and the time to encode), every reader is cut off. Read
        # only once it has passed: reading earlier would let the server write on (a busy
        # machine may still be encoding the last answers when the memory has grown).
        time.sleep(WRITE_TIMEOUT + 1.5)
        for sock in readers:
            raw, _ = read_until_closed(sock, limit=20)
            assert len(raw) < 20_000_000
            sock.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and rss_mib(pid) > baseline * 1.1 + 5:
            time.sleep(0.2)
    assert rss_mib(pid) <= baseline * 1.1 + 5, (baseline, rss_mib(pid))


def test_pipelined_requests_of_a_peer_that_does_not_read_are_not_served(pool, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", pool.http_port))
    sock.settimeout(10)
    with HealthProbe(pool), sock:
        # A 4 MB answer it never reads, then two more requests behind it.
        pipelined = request_bytes("/v2/models/hooks/infer", hooks_body(big=2_000_000))
        for _ in range(2):
            pipelined += request_bytes("/v2/models/hooks/infer", hooks_body(mark=str(marks)))
        sock.sendall(pipelined)
        time.sleep(WRITE_TIMEOUT + 1)
        raw, _ = read_until_closed(sock, limit=10)
    assert len(raw) < 4_000_000  # cut off, not served
    assert not list(marks.iterdir()), "a request behind an unread answer was run"


# -- connections -----------------------------------------------------------------------------
def test_idle_connections_over_the_cap_never_lock_out_a_health_check(pool):
    pid = pool.process.pid
    fds_before = open_fds(pid)
    sockets = []
    try:
        for _ in range(MAX_CONNECTIONS + 10):
            sock = connect(pool)
            sock.sendall(request_bytes("/v2/health/live", method="GET"))
            assert read_response(sock).startswith(b"HTTP/1.1 200")
            sockets.append(sock)  # idle keep-alive from now on
        assert health_latency(pool) < 1.5
        # The oldest idle connections were closed to make room.
        sockets[0].settimeout(2)
        assert sockets[0].recv(10) == b""
        assert open_fds(pid) <= fds_before + MAX_CONNECTIONS + 5
    finally:
        for sock in sockets:
            sock.close()


def test_fd_soft_limit_is_raised_to_the_hard_limit(tmp_path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard limit is already low")
    port = free_port()
    command = [
        sys.executable, "-m", "inferpool", "serve", str(tmp_path), "--workers", "0",
        "--allow-empty", "--host", "127.0.0.1", "--http-port", str(port),
        "--grpc-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    with open(tmp_path / "server.log", "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/live").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        limits = Path(f"/proc/{process.pid}/limits").read_text()
    finally:
        process.terminate()
        process.wait(30)
    (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
    soft_now = line.split()[3]
    expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert soft_now in (expected, str(1 << 20)), line


def test_when_every_connection_is_busy_a_new_one_is_closed_at_once(pool):
    body = iris_body()
    head = request_bytes("/v2/models/iris-logreg/infer", body)[: -len(body) + 5]
    busy = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = connect(pool)
            sock.sendall(head)  # its body never ends: a request in flight until it times out
            busy.append(sock)
        time.sleep(0.2)
        with connect(pool) as extra:
            raw, elapsed = read_until_closed(extra)
        assert raw == b""
        assert elapsed < 0.5  # not the handshake timeout: refused at once
        # The body timeout frees them all, and health checks answer again.
        for sock in busy:
            raw, _ = read_until_closed(sock)
            assert status_and_error(raw)[0] == 408
        assert health_latency(pool) < 1.5
    finally:
        for sock in busy:
            sock.close()
