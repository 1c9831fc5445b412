"""The peers that do not speak V2 (BentoML, LitServe, Ray Serve): their server folder, command
line, readiness path, request bodies and answers.

Each serves the harness's models through its own JSON API, written in
``benchmarks/peers/`` the way its docs serve a scikit-learn model on CPU. The harness copies
that service file and ``zoo.py`` into the server's folder with a ``peer.json`` (host, port,
worker count, each model's library and artefact) and runs it with the peer's virtualenv
(``benchmarks/native_env.py``). A scenario's V2 JSON payload becomes the peer's native body
(``{"model": NAME, "input": ROWS}`` to ``/predict``) carrying the very same number tokens,
so the load generator sends the same batch to every server; only the JSON scenarios
(``rest-json``, ``rest-json17``) apply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.payloads import Payload

PEERS_DIR = Path(__file__).resolve().with_name("peers")
NAME = re.compile(r"^(?P<kind>bentoml|litserve|rayserve)(?:-w(?P<workers>\d+))?$")
PATH = "/predict"
PROTOCOLS = frozenset({"rest-json", "rest-json17"})
# MLServer's implementation (model-settings.json) -> the library zoo.py loads it with.
LIBRARIES = {
    "mlserver_sklearn.SKLearnModel": "sklearn",
    "mlserver_lightgbm.LightGBMModel": "lightgbm",
    "mlserver_xgboost.XGBoostModel": "xgboost",
}


@dataclass(frozen=True)
class Peer:
    """How one peer is run: its service file, the path that answers 200 once it serves, and
    the service BentoML's CLI serves (None: the file is run as a script)."""

    service: str
    ready_path: str
    bentoml_target: str | None = None

    def command(self, python: Path, folder: Path, host: str, port: int) -> list[str]:
        if self.bentoml_target:  # `bentoml serve`, from the virtualenv's bin folder
            bentoml = str(python.with_name("bentoml"))
            return [bentoml, "serve", self.bentoml_target, "--host", host, "--port", str(port),
                    "--working-dir", str(folder)]  # fmt: skip
        return [str(python), str(folder / self.service)]


PEERS = {
    "bentoml": Peer("bentoml_service.py", "/readyz", "bentoml_service:Classifier"),
    "litserve": Peer("litserve_server.py", "/health"),
    "rayserve": Peer("rayserve_app.py", PATH),
}


def parse(name: str) -> tuple[str, int] | None:
    """(kind, workers) for ``bentoml``, ``litserve-w2`` ...; None when not a native peer.
    Without ``-wN`` the peer gets one worker (process or replica) per core."""
    match = NAME.match(name)
    if match is None:
        return None
    workers = int(match["workers"]) if match["workers"] else os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"{name}: a peer needs 1 worker or more")
    return match["kind"], workers


def model_entry(repo: Path, model: str) -> dict[str, str]:
    """What ``zoo.py`` needs of a repository folder: its library and artefact's path."""
    settings = json.loads((repo / model / "model-settings.json").read_text())
    library = LIBRARIES.get(settings.get("implementation", ""))
    uri = (settings.get("parameters") or {}).get("uri")
    if library is None or not uri:
        raise ValueError(f"the native peers cannot serve {model!r} ({settings})")
    return {"library": library, "path": str((repo / model / uri).resolve())}


def peer_config(repo: Path, models: list[str], host: str, port: int, workers: int) -> dict:
    """The content of ``peer.json``."""
    entries = {model: model_entry(repo, model) for model in models}
    return {"host": host, "port": port, "workers": workers, "models": entries}


def write_folder(
    kind: str, folder: Path, repo: Path, models: list[str], host: str, port: int, workers: int
) -> Path:
    """The peer's folder: its service file, ``zoo.py`` and ``peer.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (PEERS[kind].service, "zoo.py"):
        shutil.copyfile(PEERS_DIR / name, folder / name)
    config = peer_config(repo, models, host, port, workers)
    (folder / "peer.json").write_text(json.dumps(config, indent=2))
    return folder


def environment(kind: str, folder: Path, home: Path) -> dict[str, str]:
    """Variables the peer runs with: ``zoo`` importable (Ray's replicas too), no usage
    reports, BentoML's home inside the run's folder."""
    env = {"PYTHONPATH": str(folder), "RAY_USAGE_STATS_ENABLED": "0"}
    if kind == "bentoml":
        env |= {"BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}
    return env


def native_body(model: str, v2_body: bytes) -> bytes:
    """A V2 JSON request's first input as ``{"model": ..., "input": [[...], ...]}``. The
    numbers are parsed and written again by Python's shortest round-trip repr, which gives
    back the very tokens the V2 body had (6-digit float32 or tolist()'s 17 digits)."""
    tensor = json.loads(v2_body)["inputs"][0]
    rows = np.asarray(tensor["data"], dtype=np.float64).reshape(tensor["shape"]).tolist()
    return json.dumps({"model": model, "input": rows}, separators=(",", ":")).encode()


def adapt(kind: str, payload: Payload) -> Payload:
    """The payload as the peer ``kind`` takes it (unchanged for a V2 server)."""
    if kind not in PEERS:
        return payload
    if payload.protocol not in PROTOCOLS:
        raise ValueError(f"{kind} takes JSON only, not {payload.protocol}")
    body = native_body(payload.model, payload.body)
    return replace(payload, path=PATH, headers={"Content-Type": "application/json"}, body=body)


def decode_answer(headers: dict[str, str], body: bytes) -> np.ndarray:
    """A peer's predictions: a JSON list (BentoML) or ``{"output": [...]}``."""
    document = json.loads(body)
    if isinstance(document, dict):
        document = document["output"]
    if not isinstance(document, list):
        raise ValueError(f"not a list of predictions: {body[:200]!r}")
    return np.asarray(document).ravel()
