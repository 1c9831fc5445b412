"""``python -m benchmarks.bridges``: what a call costs through each bridge to another
language, beside the same model served from Python.

One linear regression on 8 features, three ways: scikit-learn's ``LinearRegression``
(the ``sklearn`` runtime, inferpool's linear kernel), the same coefficients in
``docs/examples/native/linear.c`` (the ``native`` runtime, ctypes), and R's ``lm`` fitted
on the same rows (the ``r`` runtime, rpy2). For batch 1 and batch 256:

- ``predict``: ``Runtime.predict`` in this process, best of repeated runs (µs per call);
- ``served``: one server (``--workers 1``) answering REST requests sent one after the
  other on one keep-alive connection, for ``--seconds`` per model and batch (req/s and
  the mean µs per request, the client's time included: the same for the three models,
  so the differences are the bridges').

Needs gcc, R with rpy2 (``pip install -e '.[r]'``, ``scripts/install_r.sh``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.codec_timing import best_time

ROOT = Path(__file__).resolve().parents[1]
FEATURES = 8
BATCHES = (1, 256)
MODELS = ("sklearn-linear", "native-linear", "r-lm")


def build(root: Path) -> np.ndarray:
    """The three models' folders in ``root``; the rows they are asked about."""
    import joblib
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, FEATURES))
    y = X @ rng.normal(size=FEATURES) + 0.3 + rng.normal(scale=0.1, size=500)
    python = LinearRegression().fit(X, y)
    (root / "sklearn-linear").mkdir()
    joblib.dump(python, root / "sklearn-linear" / "model.joblib")

    native = root / "native-linear"
    native.mkdir()
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", f"-I{ROOT / 'docs' / 'native'}",
         str(ROOT / "docs" / "examples" / "native" / "linear.c"), "-o", str(native / "model.so")],
        check=True,
    )  # fmt: skip
    weights = [python.intercept_, *python.coef_]
    (native / "coefficients.txt").write_text(" ".join(repr(float(w)) for w in weights))
    (native / "model-settings.json").write_text(
        json.dumps({"name": "native-linear", "implementation": "native"})
    )

    r_folder = root / "r-lm"
    r_folder.mkdir()
    np.savetxt(root / "train.csv", np.column_stack([X, y]), delimiter=",")
    names = [f"x{i}" for i in range(FEATURES)]
    program = (
        f"d <- read.csv({json.dumps(str(root / 'train.csv'))}, header = FALSE, "
        f"col.names = c({', '.join(json.dumps(n) for n in names)}, 'y'))\n"
        f"saveRDS(lm(y ~ ., data = d), {json.dumps(str(r_folder / 'model.rds'))})\n"
    )
    subprocess.run(["Rscript", "-e", program], check=True)
    (r_folder / "model-settings.json").write_text(
        json.dumps({"name": "r-lm", "implementation": "r"})
    )
    return X


def in_process(root: Path, X: np.ndarray, budget: float) -> dict[tuple[str, int], float]:
    """µs per ``Runtime.predict`` call, by (model, batch)."""
    from inferpool.engine.worker.model import load_model
    from inferpool.settings import read_model_settings

    times = {}
    for name in MODELS:
        runtime = load_model(read_model_settings(root / name, name)).runtime
        payload_of = (lambda rows: {"x": rows}) if name == "r-lm" else (lambda rows: rows)
        for batch in BATCHES:
            payload = payload_of(np.ascontiguousarray(X[:batch]))
            call = runtime.predict
            seconds = best_time(lambda c=call, p=payload: c(p, ["predict"]), budget, 20, 2000)
            times[(name, batch)] = seconds * 1e6
    return times


def served(root: Path, X: np.ndarray, seconds: float) -> dict[tuple[str, int], float]:
    """Requests per second of one client sending one request after the other."""
    import httpx

    from benchmarks.ports import free_port

    port = free_port()
    command = [sys.executable, "-m", "inferpool", "serve", str(root), "--workers", "1",
               "--http-port", str(port), "--grpc-port", str(free_port()),
               "--metrics-port", str(free_port()), "--host", "127.0.0.1"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rates = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_ready(client, server)
            for name in MODELS:
                for batch in BATCHES:
                    rates[(name, batch)] = _rate(client, name, X[:batch], seconds)
    finally:
        server.terminate()
        server.wait(60)
    return rates


def _wait_ready(client, server: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if client.get("/v2/health/ready").status_code == 200:
                return
        except httpx.HTTPError:  # not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def _rate(client, name: str, rows: np.ndarray, seconds: float) -> float:
    body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": list(rows.shape),
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    url = f"/v2/models/{name}/infer"
    for _ in range(20):  # warm-up
        assert client.post(url, content=content, headers=headers).status_code == 200
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.post(url, content=content, headers=headers)
        count += 1
    return count / (time.perf_counter() - start)


def table(calls: dict, rates: dict) -> str:
    lines = [
        "| model | batch | predict µs/call | served req/s | served µs/request |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in MODELS:
        for batch in BATCHES:
            rate = rates.get((name, batch))
            served_cells = f"{rate:,.0f} | {1e6 / rate:,.0f}" if rate else "- | -"
            lines.append(f"| {name} | {batch} | {calls[(name, batch)]:,.1f} | {served_cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per predict timing")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per served cell")
    parser.add_argument("--no-server", action="store_true", help="in-process timings only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferpool-bridges-") as folder:
        root = Path(folder)
        X = build(root)
        calls = in_process(root, X, args.budget)
        rates = {} if args.no_server else served(root, X, args.seconds)
    print(table(calls, rates))


if __name__ == "__main__":
    main()
