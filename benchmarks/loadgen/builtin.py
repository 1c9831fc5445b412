"""Built-in asyncio load generator, the fallback when wrk or h2load is not installed.

It runs as its own process (``python -m benchmarks.loadgen.builtin SPEC.json``) so its
CPU is measured like the external tools'. REST uses a minimal keep-alive HTTP/1.1 client
on asyncio streams (a full client library would cost the server more CPU); gRPC uses
grpc.aio with one channel per connection and the payload's bytes passed through as they are.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.loadgen.base import Job, LoadResult, run_child
from benchmarks.payloads import grpc_unframe
from benchmarks.stats import latency_summary

# Where `python -m benchmarks...` resolves, whatever the caller's working directory.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    """Per-process counters shared by the connection tasks (one event loop, no locks)."""

    latencies_us: list[float]
    errors: int = 0
    error_sample: str = ""

    def fail(self, message: str) -> None:
        self.errors += 1
        self.error_sample = self.error_sample or message


def http_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """The complete HTTP/1.1 request bytes, built once and written as they are."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Read one HTTP/1.1 response (Content-Length or chunked); return status and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    fields = {}
    for line in header_lines:
        if ":" in line:
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
    if "content-length" in fields:
        return status, await reader.readexactly(int(fields["content-length"]))
    if fields.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")  # the empty trailer section
        return status, b"".join(chunks)
    raise ValueError("response has neither Content-Length nor chunked encoding")


async def rest_connection(spec: dict, stop_at: float, tally: Tally) -> None:
    request = http_request(
        spec["host"],
        spec["port"],
        spec["path"],
        spec["headers"],
        Path(spec["body_file"]).read_bytes(),
    )
    reader = writer = None
    while time.perf_counter() < stop_at:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(spec["host"], spec["port"])
            start = time.perf_counter()
            writer.write(request)
            status, _ = await read_response(reader)
            tally.latencies_us.append((time.perf_counter() - start) * 1e6)
            if status != 200:
                tally.fail(f"HTTP {status}")
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            tally.fail(f"{type(exc).__name__}: {exc}")
            writer = None
            await asyncio.sleep(0.01)  # a refused connection must not spin the loop
    if writer is not None:
        writer.close()


async def grpc_connection(spec: dict, stop_at: float, tally: Tally) -> None:
    import grpc

    message = grpc_unframe(Path(spec["body_file"]).read_bytes())
    # A local subchannel pool gives every channel its own TCP connection, like h2load -c.
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"{spec['host']}:{spec['port']}", options) as channel:
        call = channel.unary_unary(spec["path"])  # no serializers: bytes in, bytes out
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                await call(message, timeout=10)
                tally.latencies_us.append((time.perf_counter() - start) * 1e6)
            except grpc.aio.AioRpcError as exc:
                tally.latencies_us.append((time.perf_counter() - start) * 1e6)
                tally.fail(f"{exc.code().name}: {exc.details()}")


async def generate(spec: dict) -> dict[str, object]:
    """Drive ``spec['concurrency']`` connections for ``spec['duration']`` seconds."""
    tally = Tally(latencies_us=[])
    connection = grpc_connection if spec["transport"] == "grpc" else rest_connection
    start = time.perf_counter()
    stop_at = start + spec["duration"]
    await asyncio.gather(*(connection(spec, stop_at, tally) for _ in range(spec["concurrency"])))
    elapsed = time.perf_counter() - start
    return {
        "requests": len(tally.latencies_us),
        "errors": tally.errors,
        "duration": elapsed,
        "latency_us": latency_summary(tally.latencies_us),
        "error_sample": tally.error_sample,
    }


def run(job: Job) -> LoadResult:
    """Run the generator in a child process (it sees every status: no response_bytes)."""
    spec = {
        "transport": job.payload.transport,
        "host": job.target.host,
        "port": job.target.port_for(job.payload.transport),
        "path": job.payload.path,
        "headers": job.payload.headers,
        "body_file": str(job.body_file()),
        "concurrency": job.concurrency,
        "duration": job.duration,
    }
    spec_file = job.workdir / "builtin.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "benchmarks.loadgen.builtin", str(spec_file.resolve())]
    child = run_child("built-in generator", cmd, job.timeout, cwd=PROJECT_ROOT)
    data = json.loads(child.stdout.strip().splitlines()[-1])
    return LoadResult(**data, generator_cpu=child.cpu_seconds)


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        from uvloop import run as run_loop  # a cheaper loop leaves more CPU to the server
    except ImportError:
        run_loop = asyncio.run
    print(json.dumps(run_loop(generate(spec))))


if __name__ == "__main__":
    main(sys.argv[1:])
