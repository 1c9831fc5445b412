"""``python -m benchmarks.bridge_timing``: what the JVM bridges cost per request, beside a
Python model of the same kind (docs/languages.md).

Two pairs: a Java linear model (``io.inferpool.Model``, 3 features, the ``java`` runtime
through JPype) beside scikit-learn's ``LinearRegression`` on 3 features, and iris's
``LogisticRegression`` exported to PMML by sklearn2pmml (the ``pmml`` runtime,
JPMML-Evaluator: label and class probabilities) beside the same estimator pickled
(``predict_proba``). Needs a JDK (javac compiles the Java model) and the ``java`` and
``pmml`` extras plus sklearn2pmml.

``calls`` (the default): in this process, microseconds per ``Runtime.predict`` at batch 1
and 256 (best of repeated runs: a shared machine's noise damped), and per row.

``served``: ``inferpool serve --workers 2`` on the four models, REST JSON driven by
``wrk`` (one thread, ``--connections``) at batch 1 and 256: requests/s, mean latency and
the server's CPU per request (frontend, template and workers).

Examples::

    python -m benchmarks.bridge_timing
    python -m benchmarks.bridge_timing served --duration 8 --connections 8
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson

from benchmarks.codec_timing import best_time

BATCHES = (1, 256)
# (a model through a bridge, the same kind of model in Python)
PAIRS = (("java-linear", "sklearn-linear"), ("pmml-logreg", "sklearn-logreg"))


def build(root: Path) -> Path:
    """The four models' repository under ``root``."""
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn2pmml.pipeline import PMMLPipeline

    from tests.java.models import (
        IRIS_COLUMNS,
        LINEAR,
        WEIGHTS,
        compile_jar,
        export_pmml,
        write_java_model,
    )

    compile_jar(root / "java-linear" / "demo.jar", {"demo/Linear": LINEAR})
    write_java_model(root / "java-linear", "demo.Linear")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    linear = LinearRegression().fit(X, 0.5 + X @ np.array(WEIGHTS))
    (root / "sklearn-linear").mkdir()
    joblib.dump(linear, root / "sklearn-linear" / "model.joblib")
    import pandas as pd

    iris_X, iris_y = load_iris(return_X_y=True)
    frame = pd.DataFrame(iris_X, columns=IRIS_COLUMNS)
    species = pd.Series(iris_y, name="species")
    pipeline = PMMLPipeline([("model", LogisticRegression(max_iter=1000))]).fit(frame, species)
    (root / "pmml-logreg").mkdir()
    export_pmml(pipeline, root / "pmml-logreg" / "model.pmml")
    (root / "sklearn-logreg").mkdir()
    logreg = LogisticRegression(max_iter=1000).fit(iris_X, iris_y)
    joblib.dump(logreg, root / "sklearn-logreg" / "model.joblib")
    return root


def rows_for(model: str, rows: int) -> np.ndarray:
    rng = np.random.default_rng(rows)
    if model.endswith("logreg"):
        return rng.uniform([4.3, 2.0, 1.0, 0.1], [7.9, 4.4, 6.9, 2.5], (rows, 4)).round(1)
    return rng.normal(size=(rows, 3)).round(3)


def output_of(model: str) -> str | None:
    """The output each model is asked for (None: its default ones)."""
    return {"sklearn-linear": "predict", "sklearn-logreg": "predict_proba"}.get(model)


def calls(root: Path) -> None:
    from tests.support.runtimes import infer, load

    print(f"{'model':<16}{'batch':>6}{'us/call':>10}{'us/row':>9}")
    for pair in PAIRS:
        for model in pair:
            loaded = load(root / model)
            output = output_of(model)
            for batch in BATCHES:
                X = rows_for(model, batch)
                outputs = [output] if output else None
                seconds = best_time(lambda m=loaded, X=X, o=outputs: infer(m, X, o), 1.0, 20, 2000)
                print(f"{model:<16}{batch:>6}{seconds * 1e6:>10.1f}{seconds * 1e6 / batch:>9.2f}")


def body(model: str, rows: int) -> bytes:
    X = rows_for(model, rows)
    tensor = {"name": "x", "shape": list(X.shape), "datatype": "FP64", "data": X.ravel().tolist()}
    document: dict = {"inputs": [tensor]}
    output = output_of(model)
    if output:
        document["outputs"] = [{"name": output}]
    return orjson.dumps(document)


def served(root: Path, duration: int, connections: int) -> None:
    import httpx
    import psutil

    from benchmarks.gzip_timing import LUA, _tree_cpu
    from tests.support import free_port, wait_for_200

    port = free_port()
    command = [sys.executable, "-m", "inferpool", "serve", str(root), "--workers", "2"]
    command += ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1"]
    server = subprocess.Popen(
        [*command, "--metrics-port", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_200(url + "/v2/health/ready", server, lambda: "(output not kept)", 300)
        process = psutil.Process(server.pid)
        print(f"{'model':<16}{'batch':>6}{'req/s':>9}{'mean ms':>9}{'CPU us/req':>12}")
        for pair in PAIRS:
            for model in pair:
                for batch in BATCHES:
                    path = root / f"body-{model}-{batch}.json"
                    path.write_bytes(body(model, batch))
                    target = f"{url}/v2/models/{model}/infer"
                    reply = httpx.post(target, content=path.read_bytes(), timeout=60)
                    assert reply.status_code == 200, reply.text
                    script = root / f"post-{model}-{batch}.lua"
                    script.write_text(LUA % (str(path), "identity"))
                    before = _tree_cpu(process)
                    wrk = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "-s", str(script)]
                    output = subprocess.run(
                        [*wrk, target], capture_output=True, text=True, check=True
                    ).stdout
                    cpu = _tree_cpu(process) - before
                    print(f"{model:<16}{batch:>6}" + _wrk_figures(output, cpu), flush=True)
    finally:
        server.terminate()
        server.wait(60)


def _wrk_figures(output: str, cpu: float) -> str:
    """req/s, mean latency (ms) and CPU µs per request from a wrk report."""
    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    mean = re.search(r"Latency\s+([\d.]+)(us|ms|s)", output)
    assert mean is not None
    milliseconds = float(mean.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[mean.group(2)]
    return f"{rate:>9.0f}{milliseconds:>9.2f}{cpu / requests * 1e6:>12.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bridge_timing", description=__doc__)
    parser.add_argument("what", nargs="?", choices=("calls", "served"), default="calls")
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bridge-timing-") as tmp:
        root = build(Path(tmp) / "repo")
        if args.what == "calls":
            calls(root)
        else:
            served(root, args.duration, args.connections)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
