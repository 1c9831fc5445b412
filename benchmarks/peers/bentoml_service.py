"""The BentoML peer: the benchmark models behind one ``@bentoml.service``, as BentoML's docs
write a scikit-learn service (a class whose ``__init__`` loads the models, a synchronous
``@bentoml.api`` taking and returning ``np.ndarray``), with ``workers`` set to the cores the
harness gives it (``peer.json``): one process per core, each running the whole service.

    bentoml serve bentoml_service:Classifier --host 127.0.0.1 --port 3000

Request: ``POST /predict`` with ``{"model": "iris", "input": [[5.1, 3.5, 1.4, 0.2]]}``;
answer: the predictions as a JSON list. Runs in BentoML's virtualenv beside ``zoo.py``.
"""

from __future__ import annotations

import bentoml
import numpy as np
import zoo

WORKERS = int(zoo.settings()["workers"])


@bentoml.service(workers=WORKERS, resources={"cpu": str(WORKERS)}, traffic={"timeout": 30})
class Classifier:
    def __init__(self) -> None:
        self.models = zoo.load()

    @bentoml.api
    def predict(self, model: str, input: np.ndarray) -> np.ndarray:
        return np.asarray(self.models[model](input.astype(np.float32, copy=False)))
