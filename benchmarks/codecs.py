"""Codec throughput: decode + encode of FP32 tensors, inferpool beside MLServer 1.7.1.

For 1e3, 1e5 and 1e6 elements it times, on the same request bodies:
  np-json   a V2 JSON request → the ndarray a model receives, and the ndarray → a JSON reply
  np-binary the same over Triton's binary tensor extension (MLServer has no such path)
  pd-json   a ``pd`` request of 4 FP32 columns → DataFrame, and a DataFrame → a JSON reply
MLServer's side runs in its own interpreter (``--mlserver-python``; by default the
harness's ``benchmarks/.venv-mlserver``) on the same bodies. MB/s counts tensor bytes
(4 per element) over decode + encode time; each cell is the best of repeated runs.

Run from the repository root:  python -m benchmarks.codecs [--mlserver-python PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from benchmarks.codec_timing import best_time
from inferpool.codecs.payload import decode_payload
from inferpool.codecs.registry import encode_outputs
from inferpool.protocol import rest_json, rest_wire
from inferpool.protocol.types import InferenceResponse

HERE = Path(__file__).resolve().parent
DEFAULT_MLSERVER_PYTHON = HERE / ".venv-mlserver" / "bin" / "python"
SIZES = (1_000, 100_000, 1_000_000)
COLUMNS = 4
NUMPY = orjson.OPT_SERIALIZE_NUMPY


def label(size: int) -> str:
    return f"1e{len(str(size)) - 1}"


def bodies(size: int) -> dict[str, tuple[bytes, int | None]]:
    """The request bodies (and JSON lengths for binary ones) of every case at one size."""
    values = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": [size]}
    np_json = orjson.dumps(
        {"inputs": [{**tensor, "data": values}]}, option=orjson.OPT_SERIALIZE_NUMPY
    )
    binary = {**tensor, "parameters": {"binary_data_size": values.nbytes}}
    header = orjson.dumps({"inputs": [binary], "parameters": {"binary_data_output": True}})
    rows = size // COLUMNS
    columns = [
        {
            "name": f"c{j}",
            "datatype": "FP32",
            "shape": [rows],
            "data": np.ascontiguousarray(values[j::COLUMNS][:rows]),
        }
        for j in range(COLUMNS)
    ]
    pd_json = orjson.dumps(
        {"inputs": columns, "parameters": {"content_type": "pd"}},
        option=NUMPY,
    )
    return {
        "np-json": (np_json, None),
        "np-binary": (header + values.tobytes(), len(header)),
        "pd-json": (pd_json, None),
    }


def inferpool_case(case: str, body: bytes, json_length: int | None, budget: float):
    """(decode seconds, encode seconds) through the engine's own decode and encode steps."""
    accepts = "dataframe" if case.startswith("pd") else "array"

    def decode():
        request = rest_wire.decode(body, json_length)
        return request, decode_payload(request, accepts, {})

    request, payload = decode()

    def encode() -> tuple[bytes, int | None]:
        outputs, content_type = encode_outputs({"out": payload})
        parameters = {"content_type": content_type} if content_type else {}
        response = InferenceResponse("m", outputs, parameters=parameters)
        return rest_wire.encode(response, request)

    check_round_trip(case, encode(), payload)
    return best_time(decode, budget), best_time(encode, budget)


def check_round_trip(case: str, reply: tuple[bytes, int | None], payload) -> None:
    """The reply decodes to what was encoded: a benchmark of wrong output proves nothing."""
    from inferpool.codecs.registry import decode_response

    response = rest_json.decode_response(*reply)
    back = decode_response(response.outputs, response.parameters.get("content_type"))
    if case.startswith("pd"):
        assert back.equals(payload), case
    else:
        assert np.array_equal(back["out"], payload), case


def mlserver_results(python: Path, folder: Path, sizes, budget: float) -> dict[str, list[float]]:
    script = HERE / "codecs_mlserver.py"
    command = [str(python), str(script), str(folder), str(budget), *map(label, sizes)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"MLServer side failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def row(cells: list[str]) -> str:
    return " ".join(cell.rjust(width) for cell, width in zip(cells, WIDTHS, strict=True))


HEADER = [
    "size",
    "case",
    "ip dec ms",
    "ip enc ms",
    "ip MB/s",
    "ml dec ms",
    "ml enc ms",
    "ml MB/s",
    "x",
]
WIDTHS = [5, 10, 10, 10, 9, 10, 10, 9, 7]


def table_row(size: int, case: str, ours, theirs) -> str:
    megabytes = size * 4 / 1e6
    rate: Callable[[list[float]], float] = lambda t: megabytes / (t[0] + t[1])  # noqa: E731
    cells = [label(size), case, f"{ours[0] * 1e3:.2f}", f"{ours[1] * 1e3:.2f}", f"{rate(ours):.0f}"]
    if theirs is None:
        cells += ["n/a", "n/a", "n/a", ""]
    else:
        speedup = (theirs[0] + theirs[1]) / (ours[0] + ours[1])
        cells += [f"{theirs[0] * 1e3:.2f}", f"{theirs[1] * 1e3:.2f}", f"{rate(theirs):.0f}"]
        cells.append(f"{speedup:.1f}x")
    return row(cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlserver-python", type=Path, default=DEFAULT_MLSERVER_PYTHON)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of repeats per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="inferpool-codecs-") as tmp:
        folder = Path(tmp)
        ours: dict[str, tuple[float, float]] = {}
        for size in args.sizes:
            for case, (body, json_length) in bodies(size).items():
                (folder / f"{case}-{label(size)}").write_bytes(body)
                ours[f"{case}-{label(size)}"] = inferpool_case(case, body, json_length, args.budget)
        theirs: dict[str, list[float]] = {}
        if args.mlserver_python.exists():
            theirs = mlserver_results(args.mlserver_python, folder, args.sizes, args.budget)
        else:
            print(f"(no MLServer interpreter at {args.mlserver_python}: inferpool only)")
    print(row(HEADER))
    for size in args.sizes:
        for case in ("np-json", "np-binary", "pd-json"):
            key = f"{case}-{label(size)}"
            print(table_row(size, case, ours[key], theirs.get(key)))
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; MB = 1e6 tensor bytes")


if __name__ == "__main__":
    main()
