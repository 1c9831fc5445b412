"""The LitServe peer: a ``LitAPI`` whose ``setup`` loads the benchmark models, served by
``LitServer(accelerator="cpu", workers_per_device=N)`` with N the cores the harness gives it
(``peer.json``), as LitServe's docs scale a model on CPU.

    python litserve_server.py

Request: ``POST /predict`` with ``{"model": "iris", "input": [[5.1, 3.5, 1.4, 0.2]]}``;
answer: ``{"output": [...]}``. Runs in LitServe's virtualenv beside ``zoo.py``.
"""

from typing import Any

import litserve as ls
import zoo


class ClassifierAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.models = zoo.load()

    # Unannotated, as LitServe's docs write it: LitServe builds the FastAPI endpoint from
    # this signature, and an annotation would make the body a query parameter.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request

    def predict(self, request: dict[str, Any]) -> list[Any]:
        return zoo.answer(self.models, request)

    def encode_response(self, output: list[Any]) -> dict[str, Any]:
        return {"output": output}


if __name__ == "__main__":
    config = zoo.settings()
    server = ls.LitServer(
        ClassifierAPI(), accelerator="cpu", workers_per_device=int(config["workers"])
    )
    server.run(host=config["host"], port=int(config["port"]), generate_client_file=False)
