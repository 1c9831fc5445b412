"""For the tests of per-model environments: a virtualenv made here (no
download: ``--without-pip``) holding a marker package of a version of its own, and a
runtime that reports which interpreter and which libraries answered."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.support import write_custom_model

# Reports where it runs: the interpreter's prefix and the versions its imports found.
WHERE_RUNTIME = """
import importlib.metadata
import json
import os
import sys

import numpy as np

from inferpool import Runtime


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


class Where(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        import sklearn

        report = {
            "prefix": sys.prefix,
            "pid": os.getpid(),
            "sklearn": sklearn.__version__,
            "marker": _version("envmarker"),
        }
        return {outputs[0]: np.array([json.dumps(report).encode()] * len(payload), dtype=object)}
"""


def make_venv(folder: Path, marker_version: str = "2.5") -> Path:
    """A virtualenv of this interpreter's Python with only the package ``envmarker``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    [site] = folder.glob("lib/python*/site-packages")
    (site / "envmarker").mkdir()
    (site / "envmarker" / "__init__.py").write_text(f'__version__ = "{marker_version}"\n')
    info = site / f"envmarker-{marker_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: envmarker\nVersion: {marker_version}\n"
    )
    (info / "top_level.txt").write_text("envmarker\n")
    (info / "RECORD").write_text("")
    return folder


def write_where_model(folder: Path, **settings) -> Path:
    """A model answering, for each row, where it was predicted (``report`` below)."""
    return write_custom_model(
        folder, WHERE_RUNTIME, "Where",
        inputs=[{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
        outputs=[{"name": "where", "datatype": "BYTES", "shape": [-1]}],
        **settings,
    )  # fmt: skip


WHERE_BODY = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]}]}


def report(url: str, model: str) -> dict:
    """Where ``model`` answered a request over REST."""
    answer = httpx.post(f"{url}/v2/models/{model}/infer", json=WHERE_BODY, timeout=60)
    assert answer.status_code == 200, answer.text
    return json.loads(answer.json()["outputs"][0]["data"][0])


def reports_at_once(url: str, model: str, count: int) -> list[dict]:
    """``count`` reports asked eight at a time: concurrent requests are spread over the
    model's replicas (one at a time, they all go to the first idle one)."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: report(url, model), range(count)))
