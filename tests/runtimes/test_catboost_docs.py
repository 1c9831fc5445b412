"""docs/runtimes/catboost.md's example, pasted: its training code run in an empty folder,
the folder served, its client code and its one-table request sent; the answers are the
saved model's own."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.support import Server

catboost = pytest.importorskip("catboost")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "runtimes" / "catboost.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def test_the_pages_example_runs_and_answers_as_the_model(tmp_path: Path) -> None:
    train, client = python_blocks()
    here = Path.cwd()
    os.chdir(tmp_path)
    try:
        exec(compile(train, "training", "exec"), {})
    finally:
        os.chdir(here)
    model = catboost.CatBoostClassifier()
    model.load_model(str(tmp_path / "models" / "fares" / "model.cbm"))
    rides = pd.DataFrame({"distance": [12.5, 3.0], "city": ["paris", "nice"], "hour": [18, 9]})
    with Server(tmp_path / "models", "--workers", "0") as server:
        server.wait_ready(timeout=120)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(client.replace("http://127.0.0.1:8080", server.url), {})
        outputs = {o["name"]: o for o in eval(printed.getvalue())}  # the printed list
        assert outputs["predict"]["data"] == model.predict(rides).tolist()
        probabilities = np.array(outputs["predict_proba"]["data"]).reshape(2, 2)
        np.testing.assert_allclose(probabilities, model.predict_proba(rides))
        table = json.loads(re.search(r'`(\{"name": "rides".*?\})`', PAGE.read_text(), re.DOTALL)[1])
        body = {"inputs": [table], "outputs": [{"name": "predict_proba"}]}
        reply = httpx.post(f"{server.url}/v2/models/fares/infer", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(reply.json()["outputs"][0]["data"], probabilities.ravel())
