"""MLflow ``binary`` and ``datetime`` signature columns arrive as bytes and timestamps.

The signature's types become BYTES inputs tagged ``base64`` / ``datetime`` in the model's
metadata, so a client that follows the metadata gets the right Python types decoded.
"""

from __future__ import annotations

import base64

import httpx
import pandas as pd

from tests.e2e.test_runtime_mlflow import save_from_code
from tests.support import Server

EVENTS_MODEL = """
import mlflow
import pandas as pd


class Events(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        sizes = model_input["blob"].map(len)
        days = pd.to_datetime(model_input["when"]).dt.day
        return pd.DataFrame({"size": sizes, "day": days})


mlflow.models.set_model(Events())
"""


def test_binary_and_datetime_columns(tmp_path):
    from mlflow.models import infer_signature

    example = pd.DataFrame(
        {"blob": [b"\x00\x01\x02"], "when": pd.to_datetime(["2026-01-02T03:04:05"])}
    )
    signature = infer_signature(example, pd.DataFrame({"size": [3], "day": [2]}))
    save_from_code(tmp_path / "events", EVENTS_MODEL, signature)
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_ready(timeout=120)
        metadata = httpx.get(f"{server.url}/v2/models/events").json()
        by_name = {spec["name"]: spec for spec in metadata["inputs"]}
        assert by_name["blob"]["datatype"] == "BYTES"
        assert by_name["blob"]["parameters"]["content_type"] == "base64"
        assert by_name["when"]["parameters"]["content_type"] == "datetime"
        blobs = [b"\xff\xfe\x00", b"hello world"]
        body = {
            "inputs": [
                {"name": "blob", "shape": [2], "datatype": "BYTES",
                 "data": [base64.b64encode(b).decode() for b in blobs]},
                {"name": "when", "shape": [2], "datatype": "BYTES",
                 "data": ["2026-03-09T10:00:00", "2026-12-31T23:59:59"]},
            ]
        }  # fmt: skip
        response = httpx.post(f"{server.url}/v2/models/events/infer", json=body)
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs["size"] == [3, 11]
        assert outputs["day"] == [9, 31]
        body["inputs"][1]["data"] = ["not a date", "2026-12-31"]
        bad = httpx.post(f"{server.url}/v2/models/events/infer", json=body)
        assert bad.status_code == 400 and "when" in bad.json()["error"]
