"""A minimal V2 server standing in for ``inferpool serve`` until the real one is merged.

``python -m tests.bench.standin serve REPO --host H --http-port P --grpc-port G --workers N``
serves the benchmark models over REST (JSON and Triton binary tensors) and gRPC (typed and
raw), with Triton-style statistics, on one asyncio loop. ``--workers`` is accepted and
ignored: everything runs in-process. It exists only to exercise the harness end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.models import MODELS, load_predictor
from benchmarks.payloads import BINARY_HEADER, DATATYPES

STAGES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


class Model:
    """A loaded model with Triton-style cumulative statistics."""

    def __init__(self, repo: Path, name: str) -> None:
        self.name = name
        self.predict = load_predictor(repo, name)
        self.stats = {stage: {"count": 0, "ns": 0} for stage in STAGES}

    def record(self, stage: str, start: int) -> int:
        now = time.perf_counter_ns()
        self.stats[stage]["count"] += 1
        self.stats[stage]["ns"] += now - start
        return now

    def run(self, decode, encode):
        """decode() -> ndarray, predict, encode(ndarray) -> response, timing each stage."""
        start = t = time.perf_counter_ns()
        t = self.record("queue", t)  # nothing queues in-process; counted so the split is whole
        x = decode()
        t = self.record("compute_input", t)
        y = np.asarray(self.predict(x))
        t = self.record("compute_infer", t)
        response = encode(y)
        self.record("compute_output", t)
        self.record("success", start)
        return response


def datatype(y: np.ndarray) -> str:
    return next(name for name, (dtype, _) in DATATYPES.items() if np.dtype(dtype) == y.dtype)


def rest_app(models: dict[str, Model]):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def ready(request: Request) -> Response:
        name = request.path_params.get("name")
        return Response(status_code=200 if name is None or name in models else 404)

    async def stats(request: Request) -> Response:
        model = models[request.path_params["name"]]
        return JSONResponse({"model_stats": [{"name": model.name, "inference_stats": model.stats}]})

    async def infer(request: Request) -> Response:
        model = models.get(request.path_params["name"])
        if model is None:
            return JSONResponse({"error": "unknown model"}, status_code=404)
        body = await request.body()

        def decode() -> np.ndarray:
            header_len = int(request.headers.get(BINARY_HEADER, len(body)))
            tensor = json.loads(body[:header_len])["inputs"][0]
            dtype = DATATYPES[tensor["datatype"]][0]
            if "data" in tensor:
                return np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
            return np.frombuffer(body[header_len:], dtype=dtype).reshape(tensor["shape"])

        def encode(y: np.ndarray) -> Response:
            output = {"name": "predict", "shape": list(y.shape), "datatype": datatype(y)}
            outputs = [{**output, "data": y.ravel().tolist()}]
            return JSONResponse({"model_name": model.name, "outputs": outputs})

        return model.run(decode, encode)

    return Starlette(
        routes=[
            Route("/v2/health/ready", ready),
            Route("/v2/models/{name}/ready", ready),
            Route("/v2/models/{name}/stats", stats),
            Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        ]
    )


def grpc_handler(models: dict[str, Model]):
    import grpc
    from tritonclient.grpc import service_pb2

    async def model_infer(request, context):
        model = models.get(request.model_name)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown model")

        def decode() -> np.ndarray:
            tensor = request.inputs[0]
            dtype, field = DATATYPES[tensor.datatype]
            if request.raw_input_contents:
                flat = np.frombuffer(request.raw_input_contents[0], dtype=dtype)
            else:
                flat = np.asarray(getattr(tensor.contents, field), dtype=dtype)
            return flat.reshape(list(tensor.shape))

        def encode(y: np.ndarray):
            response = service_pb2.ModelInferResponse(model_name=model.name)
            name = datatype(y)
            out = response.outputs.add(name="predict", datatype=name, shape=list(y.shape))
            getattr(out.contents, DATATYPES[name][1]).extend(y.ravel().tolist())
            return response

        return model.run(decode, encode)

    handler = grpc.unary_unary_rpc_method_handler(
        model_infer,
        request_deserializer=service_pb2.ModelInferRequest.FromString,
        response_serializer=service_pb2.ModelInferResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler}
    )


async def serve(args: argparse.Namespace) -> None:
    import grpc
    import uvicorn

    repo = Path(args.repo)
    models = {
        name: Model(repo, name)
        for name, spec in MODELS.items()
        if (repo / name / spec.artefact).exists()
    }
    grpc_server = grpc.aio.server()
    grpc_server.add_generic_rpc_handlers((grpc_handler(models),))
    grpc_server.add_insecure_port(f"{args.host}:{args.grpc_port}")
    await grpc_server.start()
    config = uvicorn.Config(
        rest_app(models), host=args.host, port=args.http_port, log_level="warning"
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await grpc_server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="standin")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve")
    run.add_argument("repo")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--http-port", type=int, default=8080)
    run.add_argument("--grpc-port", type=int, default=8081)
    run.add_argument("--workers", type=int, default=0)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
