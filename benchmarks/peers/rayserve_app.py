"""The Ray Serve peer: a deployment of N replicas of one CPU each (N the cores the harness
gives it, ``peer.json``) whose plain ``__call__`` takes the Starlette request, as Ray
Serve's scikit-learn example does, on a local Ray cluster of exactly N CPUs.

    python rayserve_app.py

Request: ``POST /predict`` with ``{"model": "iris", "input": [[5.1, 3.5, 1.4, 0.2]]}``;
answer: ``{"output": [...]}``; ``GET /predict`` answers 200 once a replica serves. SIGTERM
shuts Serve and the Ray cluster it started down. Runs in Ray's virtualenv beside ``zoo.py``.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import ray
import zoo
from ray import serve
from starlette.requests import Request


@serve.deployment
class Classifier:
    def __init__(self) -> None:
        self.models = zoo.load()

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.method == "GET":
            return {"ready": True}
        return {"output": zoo.answer(self.models, await request.json())}


def main() -> None:
    config = zoo.settings()
    workers = int(config["workers"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # address="local": a cluster of its own, never one another process started.
    ray.init(address="local", num_cpus=workers, include_dashboard=False,
             object_store_memory=100 * 2**20)  # fmt: skip
    try:
        serve.start(http_options={"host": config["host"], "port": int(config["port"])})
        app = Classifier.options(num_replicas=workers, ray_actor_options={"num_cpus": 1})
        serve.run(app.bind(), route_prefix="/predict")
        print("Ray Serve peer ready", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
