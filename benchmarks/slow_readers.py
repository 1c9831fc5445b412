"""``python -m benchmarks.slow_readers``: what clients that read large answers slowly cost
the frontend's memory, over REST and over the builtin gRPC server (issue 37, point 6).

A custom model answers ``big`` UINT8 zeros (REST: two bytes each in JSON) or, for a
negative ``big``, FP64 ones (gRPC: eight bytes each in protobuf, quicker to encode):
8.6 MiB answers by default. ``--readers`` clients on raw sockets each send one request at
once and then read 64 KiB every 50 ms (the gRPC ones grant HTTP/2 window only for what
they have read). The frontend's RSS is sampled every 20 ms: its baseline (after one
answer read whole), its peak while the readers read, what it held once every answer was
written or refused (the peak also has the answers in flight: read from the workers,
refused or not), and what it is 3 s after the last reader finished. Each reader's outcome
is counted (its whole answer, or a 503 / RESOURCE_EXHAUSTED naming the bound).

    python -m benchmarks.slow_readers --protocol rest --workers 2 [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb

MODEL = """
    import numpy as np

    from inferpool import Runtime, TensorSpec


    class Big(Runtime):
        accepts = "dict"

        def load(self):
            pass

        def outputs(self):
            return [TensorSpec("y", "UINT8", [-1]), TensorSpec("z", "FP64", [-1])]

        def predict(self, payload, outputs):
            size = int(payload["big"].reshape(-1)[0])
            if size < 0:  # FP64 zeros: quicker to encode in protobuf than UINT8 ones
                return {"z": np.zeros(-size, dtype=np.float64)}
            return {"y": np.zeros(size, dtype=np.uint8)}
"""

CHUNK = 64 * 1024
PAUSE = 0.05


def _nothing() -> None:
    pass


def write_model(root: Path) -> None:
    folder = root / "big"
    folder.mkdir(parents=True)
    (folder / "big_runtime.py").write_text(textwrap.dedent(MODEL))
    document = {"name": "big", "implementation": "big_runtime.Big"}
    (folder / "model-settings.json").write_text(json.dumps(document))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def rest_request(count: int) -> bytes:
    tensor = {"name": "big", "datatype": "INT64", "shape": [1], "data": [count]}
    body = json.dumps({"inputs": [tensor]}).encode()
    head = f"POST /v2/models/big/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def read_rest_answer(
    port: int, count: int, slow: bool, on_head: Callable[[], None] = _nothing
) -> tuple[str, bytes, bytes]:
    """One request, its answer read ``CHUNK`` every ``PAUSE``: its status ("closed" or
    "cut" if the server closed first), head and first ``CHUNK`` bytes (an error whole)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
        sock.sendall(rest_request(count))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(CHUNK)
            if not chunk:
                return "closed", data, b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        on_head()
        lines = head.lower().split(b"\r\n")
        length = next(int(line[15:]) for line in lines if line.startswith(b"content-length:"))
        received = len(body)
        while received < length:
            if slow:
                time.sleep(PAUSE)
            chunk = sock.recv(CHUNK)
            if not chunk:
                return "cut", head, body
            body += chunk if len(body) < CHUNK else b""
            received += len(chunk)
        return head.split(b" ")[1].decode(), head, body


def rest_reader(port: int, count: int, slow: bool, on_head: Callable[[], None] = _nothing) -> str:
    """One request, its answer read ``CHUNK`` every ``PAUSE``; the answer's status."""
    return read_rest_answer(port, count, slow, on_head)[0]


def grpc_request(count: int) -> bytes:
    request = pb.ModelInferRequest(model_name="big")
    tensor = request.inputs.add(name="big", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(count)
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def grpc_reader(port: int, count: int, slow: bool, on_head: Callable[[], None] = _nothing) -> str:
    """One call over h2, window granted as the answer is read; its grpc-status."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        conn = h2.connection.H2Connection(config=config)
        conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4 << 20}
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(4 << 20)
        headers = [
            (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"x"),
            (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        ]  # fmt: skip
        conn.send_headers(1, headers)
        conn.send_data(1, grpc_request(count), end_stream=True)
        sock.sendall(conn.data_to_send())
        status = "none"
        while True:
            if slow:
                time.sleep(PAUSE)
            data = sock.recv(CHUNK)
            if not data:
                return "closed:" + status
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    if isinstance(event, h2.events.ResponseReceived):
                        on_head()
                    status = dict(event.headers).get(b"grpc-status", status.encode()).decode()
                elif isinstance(event, h2.events.StreamEnded):
                    return status
                elif isinstance(event, h2.events.StreamReset):
                    return f"reset {event.error_code}"
            sock.sendall(conn.data_to_send())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=["rest", "grpc"], default="rest")
    parser.add_argument("--readers", type=int, default=30)
    parser.add_argument("--elements", type=int, default=0, help="UINT8 zeros an answer holds")
    parser.add_argument("--workers", default="2")
    parser.add_argument("serve", nargs="*", help="extra flags for inferpool serve")
    args = parser.parse_args(argv)
    # 8.6 MiB answers: UINT8 zeros in JSON are two bytes each, FP64 ones in protobuf eight.
    count = args.elements or (4_500_000 if args.protocol == "rest" else -1_125_000)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_model(root)
        http_port, grpc_port = free_port(), free_port()
        command = [
            sys.executable, "-m", "inferpool", "serve", str(root), "--host", "127.0.0.1",
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port",
            str(free_port()), "--workers", args.workers, *args.serve,
        ]  # fmt: skip
        log = open(root / "server.log", "w")  # noqa: SIM115 - closed with the folder
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            return run(server, args, http_port, grpc_port, count)
        finally:
            server.terminate()
            server.wait(60)
            log.close()


def run(
    server: subprocess.Popen, args: argparse.Namespace, http: int, grpc: int, count: int
) -> int:
    reader, port = (rest_reader, http) if args.protocol == "rest" else (grpc_reader, grpc)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", http), timeout=1) as sock:
                sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                if b" 200 " in sock.recv(1024):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not get ready")
        time.sleep(0.2)
    print("warm-up:", reader(port, count, slow=False))
    time.sleep(1)
    baseline = rss_mib(server.pid)
    outcomes: Counter[str] = Counter()
    peak = baseline
    heads = threading.Semaphore(0)
    threads = [
        threading.Thread(target=lambda: outcomes.update([reader(port, count, True, heads.release)]))
        for _ in range(args.readers)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    answered, held_until = 0, 0.0
    held = baseline  # once every answer is written or refused: what is kept for the readers
    while any(thread.is_alive() for thread in threads):
        rss = rss_mib(server.pid)
        peak = max(peak, rss)
        while answered < args.readers and heads.acquire(blocking=False):
            answered += 1
            if answered == args.readers:
                held_until = time.monotonic() + 0.3
        if answered == args.readers and time.monotonic() < held_until:
            held = max(held, rss)
        time.sleep(0.02)
    took = time.monotonic() - started
    time.sleep(3)
    after = rss_mib(server.pid)
    print(f"{args.protocol} readers={args.readers} elements={count} outcomes={dict(outcomes)}")
    print(
        f"frontend RSS: baseline {baseline:.0f} MiB, peak {peak:.0f} (+{peak - baseline:.0f}), "
        f"held once every answer was out +{held - baseline:.0f}, "
        f"3 s after {after:.0f} (+{after - baseline:.0f}); readers took {took:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
