"""Models whose ``parameters.uri`` names a remote object: one server (poll mode) over a
repository whose models live in a local S3 (moto's server), a local GCS
(gcp-storage-emulator) and a local HTTP server, the
good ones serving, each broken one FAILED with its one-sentence reason beside them, and
a changed S3 object reloaded while requests keep being answered."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from tests.support import Server, iris_data
from tests.support.stores import HttpStore, S3Store, gcs_store, http_store, s3_store

MIB = 1024 * 1024


def _joblib(estimator) -> bytes:
    import joblib

    buffer = io.BytesIO()
    joblib.dump(estimator, buffer)
    return buffer.getvalue()


def _iris_model(flipped: bool = False) -> bytes:
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    return _joblib(LogisticRegression(max_iter=1000).fit(X, (2 - y) if flipped else y))


def _model(s3: S3Store, name: str, uri: str) -> None:
    """A model folder of the remote repository s3://models/repo (its settings file)."""
    settings = {"name": name, "implementation": "sklearn", "parameters": {"uri": uri}}
    s3.put(f"repo/{name}/model-settings.json", json.dumps(settings).encode())


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[S3Store, HttpStore, tuple]]:
    with s3_store() as s3, http_store() as web, gcs_store() as gcs:
        yield s3, web, gcs


@pytest.fixture(scope="module")
def server(stores, tmp_path_factory) -> Iterator[Server]:
    s3, web, (emulator, gcs) = stores
    model = _iris_model()
    gcs.pipe("models/iris/model.joblib", model)
    s3.put("iris/model.joblib", model)
    s3.put("huge/model.joblib", os.urandom(MIB + MIB // 4))
    web.objects["/iris/model.joblib"] = model
    sha = hashlib.sha256(model).hexdigest()
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    _model(s3, "s3-iris", "s3://models/iris/model.joblib")
    _model(s3, "gs-iris", "gs://models/iris/model.joblib")
    _model(s3, "http-iris", f"{web.url}/iris/model.joblib#sha256={sha}")
    _model(s3, "huge", "s3://models/huge/model.joblib")
    _model(s3, "corrupt", f"{web.url}/iris/model.joblib#sha256={wrong}")
    _model(s3, "silent", f"{web.url}/silent/model.joblib")
    _model(s3, "later", "s3://models/later/model.joblib")
    cache = tmp_path_factory.mktemp("cache")
    flags = ["--workers", "1", "--model-control-mode", "poll", "--no-exit-on-error"]
    # --storage-max-size: 1 MiB, for the whole repository's settings files as for a model.
    flags += ["--storage-cache-dir", str(cache), "--storage-max-size", "1"]
    flags += ["--storage-timeout", "4", "--storage-poll-interval", "0.5"]
    # The repository itself is remote too: its folders fetched once at start-up.
    env = {**s3.env, "STORAGE_EMULATOR_HOST": emulator}
    with Server("s3://models/repo", *flags, env=env) as started:
        started.wait_live()
        _settled(started)
        yield started


def _index(server: Server) -> dict[str, dict]:
    answer = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10)
    return {entry["name"]: entry for entry in answer.json()}


def _settled(server: Server, timeout: float = 90) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        index = _index(server)
        if all(e["state"] in ("READY", "FAILED") for e in index.values()) and len(index) == 7:
            return index
        assert time.monotonic() < deadline, f"{index}\n{server.output()[-3000:]}"
        time.sleep(0.2)


def _predict(server: Server, model: str) -> httpx.Response:
    X, _ = iris_data()
    rows = X[[0, 60, 120]]
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [3, 4], "data": rows.ravel().tolist()}
        ]
    }
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def test_remote_models_serve_and_each_broken_one_fails_with_its_reason(server, stores):
    _, web, _ = stores
    for model in ("s3-iris", "gs-iris", "http-iris"):
        answer = _predict(server, model)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [0, 1, 2]
    index = _settled(server)
    reasons = {name: entry.get("reason", "") for name, entry in index.items()}
    assert index["huge"]["state"] == "FAILED"
    assert reasons["huge"] == (
        "s3://models/huge/model.joblib holds 1.2 MiB, more than --storage-max-size allows "
        "(1.0 MiB): refused before it fills the disk"
    )
    assert reasons["corrupt"] == (
        f"{web.url}/iris/model.joblib: the bytes received do not match the URI's #sha256: "
        "the download was corrupted or the object changed while it was read"
    )
    assert reasons["silent"] == (
        f"{web.url}/silent/model.joblib: the store did not answer within 4s (--storage-timeout)"
    )
    assert (
        reasons["later"]
        == "s3://models/later/model.joblib was not found (no such object or bucket)"
    )
    assert "Traceback" not in server.output()
    assert re.search(r"the model repository s3://models/repo is at \S+/repo\b", server.output())
    failed = _predict(server, "huge")
    assert failed.status_code in (400, 503) and "error" in failed.json()


def test_a_changed_object_reloads_without_a_failed_request(server, stores):
    s3, _, _ = stores
    answers: list[int] = []
    outputs: list[list] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            answer = _predict(server, "s3-iris")
            answers.append(answer.status_code)
            if answer.status_code == 200:
                outputs.append(answer.json()["outputs"][0]["data"])

    asking = threading.Thread(target=keep_asking)
    asking.start()
    try:
        s3.put("iris/model.joblib", _iris_model(flipped=True))
        # An object that was missing at start-up loads once it appears.
        s3.put("later/model.joblib", _iris_model())
        deadline = time.monotonic() + 90
        while not outputs or outputs[-1] != [2, 1, 0]:
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.1)
    finally:
        stop.set()
        asking.join()
    assert set(answers) == {200}, answers
    assert [0, 1, 2] in outputs  # the first version served until the new one was ready
    server.expect_lines([r"s3://models/iris/model.joblib changed: reloading"])
    deadline = time.monotonic() + 60
    while _index(server)["later"]["state"] != "READY":
        assert time.monotonic() < deadline, server.output()[-3000:]
        time.sleep(0.2)
    assert _predict(server, "later").json()["outputs"][0]["data"] == [0, 1, 2]


def test_a_remote_repository_that_cannot_be_fetched_is_refused(stores, tmp_path):
    s3, _, _ = stores
    command = [sys.executable, "-m", "inferpool", "serve", "s3://models/no-such-repo"]
    command += ["--storage-cache-dir", str(tmp_path)]
    refused = subprocess.run(
        command, env={**os.environ, **s3.env}, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "inferpool: the model repository cannot be fetched: s3://models/no-such-repo was "
        "not found (no such object or bucket)"
    )


def test_ctrl_c_while_a_remote_repository_is_fetched_exits_at_once(tmp_path):
    """The fetch is not one of the steps that hold a Ctrl-C back (imports, settings): a
    store that never answers is left at once, 130 and no traceback, not at the timeout."""
    import signal
    import socket

    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    command = [sys.executable, "-m", "inferpool", "serve", "s3://models/repo"]
    command += ["--storage-cache-dir", str(tmp_path), "--storage-timeout", "120"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        silent.settimeout(120)
        connection, _ = silent.accept()  # the fetch has begun: it waits for an answer
        time.sleep(0.5)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130
        assert time.monotonic() - interrupted < 15
        stderr = process.stderr.read()  # type: ignore[union-attr]
        assert "Traceback" not in stderr, stderr
        connection.close()
    finally:
        process.kill()
        process.wait()
        process.stderr.close()  # type: ignore[union-attr]
        silent.close()
