"""MLServer 1.7.1's side of ``benchmarks/codecs.py``: run by MLServer's own interpreter.

It times what MLServer's REST path does with the same bodies: ``json.loads`` and pydantic
validation (as FastAPI does), then ``NumpyCodec``/``PandasCodec``; and back: the codec's
encode, ``model_dump`` and MLServer's JSON renderer. Prints one JSON object of timings.

Usage: python codecs_mlserver.py BODIES_DIR BUDGET SIZE...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from codec_timing import best_time
from mlserver.codecs import NumpyCodec, PandasCodec
from mlserver.codecs.json import encode_to_json_bytes
from mlserver.types import InferenceRequest, InferenceResponse


def parse(body: bytes) -> InferenceRequest:
    return InferenceRequest.model_validate(json.loads(body))


def numpy_case(body: bytes, budget: float) -> tuple[float, float]:
    array = NumpyCodec.decode_input(parse(body).inputs[0])

    def encode() -> bytes:
        output = NumpyCodec.encode_output("out", array)
        response = InferenceResponse(model_name="m", outputs=[output])
        return encode_to_json_bytes(response.model_dump())

    decode_s = best_time(lambda: NumpyCodec.decode_input(parse(body).inputs[0]), budget)
    return decode_s, best_time(encode, budget)


def pandas_case(body: bytes, budget: float) -> tuple[float, float]:
    frame = PandasCodec.decode_request(parse(body))

    def encode() -> bytes:
        response = PandasCodec.encode_response(model_name="m", payload=frame)
        return encode_to_json_bytes(response.model_dump())

    decode_s = best_time(lambda: PandasCodec.decode_request(parse(body)), budget)
    return decode_s, best_time(encode, budget)


def main() -> None:
    folder, budget, sizes = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    results = {}
    for size in sizes:
        results[f"np-json-{size}"] = numpy_case((folder / f"np-json-{size}").read_bytes(), budget)
        results[f"pd-json-{size}"] = pandas_case((folder / f"pd-json-{size}").read_bytes(), budget)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
