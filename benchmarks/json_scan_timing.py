"""``python -m benchmarks.json_scan_timing``: what decoding a V2 JSON request's tensor costs
in-process, for the two ways clients write float32 numbers (issue 44).

The bodies are the harness's LightGBM batch (``--rows`` x 50 FP32 values of a seeded normal
sample, flat, compact JSON): ``short``, each value's shortest float32 repr (``rest-json``,
``-0.13210486``), and ``tolist``, each value through a Python float as
``ndarray.tolist()`` + ``json.dumps`` write it (``rest-json17``, ``-0.13210485875606537``).
For each, the process CPU time of ``rest_json.decode_request`` (the JSON scanner, then
orjson on the rest) and of the scanner alone, best of ``--repeat`` rounds of ``--number``
calls, the bodies interleaved within each round; and the ratio of the two bodies.

To compare two checkouts, run it with each one first on ``PYTHONPATH``, alternately::

    for i in 1 2 3; do for tree in /path/before /path/after; do
        PYTHONPATH=$tree python -m benchmarks.json_scan_timing; done; done
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from inferpool.protocol import json_scan, limits, rest_json

FEATURES = 50


def bodies(rows: int) -> dict[str, bytes]:
    """The ``short`` and ``tolist`` request bodies of ``rows`` x 50 float32 values."""
    x = np.random.default_rng(0).standard_normal((rows, FEATURES)).astype(np.float32)
    forms = {"short": [float(str(v)) for v in x.ravel()], "tolist": x.ravel().tolist()}
    return {
        name: json.dumps(
            {"inputs": [{"name": "input-0", "shape": [rows, FEATURES], "datatype": "FP32",
                         "data": data}]},
            separators=(",", ":"),
        ).encode()
        for name, data in forms.items()
    }  # fmt: skip


def measure(rows: int, number: int, repeat: int) -> dict[str, dict[str, float]]:
    """Best CPU microseconds per call of ``decode`` and ``scan``, by body."""
    current = limits.current()
    calls: dict[str, Callable[[bytes], object]] = {
        "decode": rest_json.decode_request,
        "scan": lambda body: json_scan.scan(body, current, current.max_json_depth - 3),
    }
    made = bodies(rows)
    best = {name: {call: float("inf") for call in calls} for name in made}
    for _ in range(repeat):
        for name, body in made.items():
            for call, function in calls.items():
                start = time.process_time()
                for _ in range(number):
                    function(body)
                spent = (time.process_time() - start) / number * 1e6
                best[name][call] = min(best[name][call], spent)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--number", type=int, default=20, help="calls a measurement")
    parser.add_argument("--repeat", type=int, default=15, help="measurements, best kept")
    args = parser.parse_args()
    best = measure(args.rows, args.number, args.repeat)
    for name, figures in best.items():
        print(f"{name:7} decode {figures['decode']:8.1f} us  scan {figures['scan']:8.1f} us")
    ratio = best["tolist"]["decode"] / best["short"]["decode"]
    print(f"tolist / short decode: {ratio:.2f}x")


if __name__ == "__main__":
    main()
