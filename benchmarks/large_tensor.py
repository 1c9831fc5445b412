"""``python -m benchmarks large``: one 64 MiB FP32 tensor through an identity model.

Issue 44's fifth target. The tensor goes over REST with Triton's binary tensor extension
(and comes back binary) and over gRPC in ``raw_input_contents``, one request at a time;
the rate is the payload's bytes over each round trip (in and back), set against this
machine's single-core memcpy bandwidth measured in the same run (numpy ``copyto`` of the
same 64 MiB, best of its repetitions, before and after the requests). Peak memory per
request: before each request every process of the server's tree has its RSS high-water
mark reset (``/proc/PID/clear_refs`` 5); after it, the sum over the processes of the
high-water mark less the RSS before. The clients are lean (a raw socket for REST, grpc
with bytes in and out) so the server's copies are what is measured. Beside them, the
ceiling of any server reached over TCP on this machine: the same bytes echoed by a child
process over a loopback connection (``loopback_echo``), so each protocol's rate is also
given as a fraction of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.payloads import BINARY_HEADER
from benchmarks.process_stats import process_tree

MIB = 1 << 20
MODEL = "identity"
IDENTITY = '''\
"""Returns its input: the large-tensor benchmark's model."""

from inferpool import Runtime, TensorSpec


class Identity(Runtime):
    def load(self):
        pass

    def inputs(self):
        return [TensorSpec("x", "FP32", [-1])]

    def outputs(self):
        return [TensorSpec("y", "FP32", [-1])]

    def predict(self, payload, outputs):
        return {"y": payload}
'''


def write_model(repo: Path) -> Path:
    """The identity model's folder in ``repo``."""
    folder = repo / MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "identity_runtime.py").write_text(IDENTITY)
    settings = {"name": MODEL, "implementation": "identity_runtime.Identity"}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder


def memcpy_bandwidth(nbytes: int, repeat: int = 10) -> float:
    """Bytes a second one core copies (numpy copyto of ``nbytes``, best of ``repeat``)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def _echo(conn: socket.socket, size: int) -> None:
    """Send back every ``size`` bytes received, until the peer closes."""
    view = memoryview(bytearray(size))
    while True:
        got = 0
        while got < size:
            count = conn.recv_into(view[got:])
            if not count:
                return
            got += count
        conn.sendall(view)


def loopback_echo(raw: bytes, repeat: int) -> dict[str, Any]:
    """What any server over TCP can reach here: ``raw`` sent over a loopback connection to
    a child process that sends it straight back (received into one buffer, sent from it),
    ``repeat`` round trips after a first. Fork before any grpc channel exists."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    pid = os.fork()
    if pid == 0:  # the echo: no Python object of the parent's is touched
        try:
            conn, _ = listener.accept()
            _echo(conn, len(raw))
        finally:
            os._exit(0)
    listener.close()
    seconds = []
    view = memoryview(bytearray(len(raw)))
    try:
        with socket.create_connection(address) as sock:
            for _ in range(repeat + 1):
                start = time.perf_counter()
                sock.sendall(raw)
                got = 0
                while got < len(raw):
                    got += sock.recv_into(view[got:])
                seconds.append(time.perf_counter() - start)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # gone already once the connection closed
        os.waitpid(pid, 0)
    if view != raw:
        raise RuntimeError("the echo differs from what was sent")
    median = statistics.median(seconds[1:])
    return {"seconds_median": median, "seconds_best": min(seconds[1:]),
            "rate_mb_s": len(raw) / median / 1e6}  # fmt: skip


def rest_request(host: str, port: int, raw: bytes) -> bytes:
    """The binary-extension request: the tensor in, the output asked back binary."""
    tensor = {"name": "x", "datatype": "FP32", "shape": [len(raw) // 4]}
    tensor["parameters"] = {"binary_data_size": len(raw)}
    outputs = [{"name": "y", "parameters": {"binary_data": True}}]
    header = json.dumps({"inputs": [tensor], "outputs": outputs}).encode()
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/octet-stream\r\n{BINARY_HEADER}: {len(header)}\r\n"
        f"Content-Length: {len(header) + len(raw)}\r\n\r\n"
    )
    return head.encode() + header


class RestClient:
    """One keep-alive connection; the answer read into a preallocated buffer."""

    def __init__(self, host: str, port: int, raw: bytes) -> None:
        self.sock = socket.create_connection((host, port))
        self.head = rest_request(host, port, raw)
        self.raw = raw
        self.buffer = bytearray(len(raw) + MIB)

    def call(self) -> memoryview:
        """One round trip; the answer's binary output (a view of the buffer)."""
        self.sock.sendall(self.head)
        self.sock.sendall(self.raw)
        view = memoryview(self.buffer)
        got = 0
        while (end := bytes(view[:got]).find(b"\r\n\r\n")) < 0:
            got += self.sock.recv_into(view[got:], 65536)
        head = bytes(view[:end]).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:])
        total = end + 4 + int(fields["content-length"])
        while got < total:
            got += self.sock.recv_into(view[got:total])
        body = view[end + 4 : total]
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {bytes(body[:300])!r}")
        header_length = int(fields[BINARY_HEADER.lower()])
        return body[header_length:]

    def close(self) -> None:
        self.sock.close()


class GrpcClient:
    """grpc with bytes in and out: the serialized ModelInferRequest built once."""

    def __init__(self, host: str, port: int, raw: bytes) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        limit = len(raw) + 16 * MIB
        options = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ]
        self.channel = grpc.insecure_channel(f"{host}:{port}", options)
        self.call_ = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="x", datatype="FP32", shape=[len(raw) // 4])
        request.raw_input_contents.append(raw)
        self.message = request.SerializeToString()
        self.response_type = service_pb2.ModelInferResponse

    def call(self) -> bytes:
        answer = self.call_(self.message, timeout=120)
        return self.response_type.FromString(answer).raw_output_contents[0]

    def close(self) -> None:
        self.channel.close()


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_high_water(pid: int) -> dict[int, int]:
    """Reset every process's VmHWM to its RSS now; their RSS (KiB) by pid."""
    before = {}
    for proc in process_tree(pid):
        try:
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
            before[proc.pid] = status_kib(proc.pid, "VmRSS")
        except OSError:
            continue
    return before


def peak_growth(before: dict[int, int]) -> int:
    """Bytes: the sum of each process's high-water mark over its RSS at the reset."""
    grown = 0
    for pid, rss in before.items():
        try:
            grown += max(0, status_kib(pid, "VmHWM") - rss)
        except OSError:
            continue
    return grown * 1024


def measure(client: Any, pid: int, raw: bytes, repeat: int) -> dict[str, Any]:
    """``repeat`` round trips: seconds each and the peak growth of the server's memory."""
    seconds, peaks = [], []
    first = client.call()
    if bytes(first[:4096]) != raw[:4096] or len(first) != len(raw):
        raise RuntimeError("the identity model's answer differs from its input")
    for _ in range(repeat):
        before = reset_high_water(pid)
        start = time.perf_counter()
        client.call()
        seconds.append(time.perf_counter() - start)
        peaks.append(peak_growth(before))
    best = min(seconds)
    return {
        "seconds_median": statistics.median(seconds),
        "seconds_best": best,
        "rate_mb_s": len(raw) / statistics.median(seconds) / 1e6,
        "peak_growth_mib_median": statistics.median(peaks) / MIB,
        "peak_growth_mib_max": max(peaks) / MIB,
    }


def run(host: str, http: int, grpc: int, pid: int, size_mib: int, repeat: int) -> dict[str, Any]:
    """memcpy, REST binary, gRPC raw, memcpy again."""
    raw = np.random.default_rng(0).random(size_mib * MIB // 4, dtype=np.float32).tobytes()
    result: dict[str, Any] = {"payload_mib": size_mib, "memcpy_mb_s": []}
    result["memcpy_mb_s"].append(memcpy_bandwidth(len(raw)) / 1e6)
    result["tcp-echo"] = loopback_echo(raw, repeat)
    for name, kind in (("rest-binary", RestClient), ("grpc-raw", GrpcClient)):
        client = kind(host, http if kind is RestClient else grpc, raw)
        try:
            result[name] = measure(client, pid, raw, repeat)
        finally:
            client.close()
    result["memcpy_mb_s"].append(memcpy_bandwidth(len(raw)) / 1e6)
    memcpy = statistics.median(result["memcpy_mb_s"])
    echo = result["tcp-echo"]["rate_mb_s"]
    result["tcp-echo"]["of_memcpy"] = echo / memcpy
    for name in ("rest-binary", "grpc-raw"):
        cell = result[name]
        cell["of_memcpy"] = cell["rate_mb_s"] / memcpy
        cell["of_echo"] = cell["rate_mb_s"] / echo
        cell["peak_over_payload"] = cell["peak_growth_mib_median"] / size_mib
    return result


def markdown(result: dict[str, Any]) -> str:
    memcpy = " / ".join(f"{v:,.0f}" for v in result["memcpy_mb_s"])
    echo = result["tcp-echo"]
    lines = [
        f"single-core memcpy (numpy copyto of {result['payload_mib']} MiB, before / after): "
        f"{memcpy} MB/s\n",
        "| protocol | round trip s (median, best) | MB/s of payload | x memcpy | x tcp echo "
        "| peak growth MiB (median, max) | x payload |",
        "|---|---|---|---|---|---|---|",
        f"| tcp echo (the ceiling over TCP) | {echo['seconds_median']:.3f}, "
        f"{echo['seconds_best']:.3f} | {echo['rate_mb_s']:,.0f} | {echo['of_memcpy']:.2f} "
        "| 1.00 | | |",
    ]
    for name in ("rest-binary", "grpc-raw"):
        c = result[name]
        lines.append(
            f"| {name} | {c['seconds_median']:.3f}, {c['seconds_best']:.3f} | "
            f"{c['rate_mb_s']:,.0f} | {c['of_memcpy']:.2f} | {c['of_echo']:.2f} | "
            f"{c['peak_growth_mib_median']:.0f}, {c['peak_growth_mib_max']:.0f} | "
            f"{c['peak_over_payload']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def start_with_limit(
    spec: Any, repo: Path, workdir: Path, size_mib: int, base_checkout: Path | None = None
) -> Any:
    """The server started with a body limit that fits the tensor: the default
    --max-body-bytes (65 MiB) admits a tensor of up to 64 MiB with its JSON header; a
    larger one gets the limit raised. A ``-base`` server runs from ``base_checkout``."""
    from benchmarks.servers import start

    if size_mib <= 64:
        return start(spec, repo, [MODEL], workdir / "servers", base_checkout=base_checkout)
    name, old = "INFERPOOL_MAX_BODY_BYTES", os.environ.get("INFERPOOL_MAX_BODY_BYTES")
    os.environ[name] = str((size_mib + 16) * MIB)  # start() passes our environment on
    try:
        return start(spec, repo, [MODEL], workdir / "servers", base_checkout=base_checkout)
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def main(
    servers: list[str], workdir: Path, size_mib: int, repeat: int, base_checkout: Path | None = None
) -> int:
    """Start each server with the identity model (its body limit raised to fit the
    tensor; a ``-base`` one from ``base_checkout``), measure it, print the tables, write
    results.json and results.md."""
    from benchmarks.servers import ServerSpec

    repo = workdir / "repo"
    write_model(repo)
    results, text = {}, []
    for name in servers:
        server = start_with_limit(ServerSpec.parse(name), repo, workdir, size_mib, base_checkout)
        try:
            target = server.target
            assert target.http_port and target.grpc_port and server.pid
            print(f"{name}: {size_mib} MiB x {repeat}", file=sys.stderr)
            result = run(target.host, target.http_port, target.grpc_port, server.pid, size_mib,
                         repeat)  # fmt: skip
        finally:
            server.stop()
        results[name] = result
        text.append(f"### {name}\n\n{markdown(result)}")
    print("\n".join(text))
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    (workdir / "results.md").write_text("\n".join(text))
    return 0
