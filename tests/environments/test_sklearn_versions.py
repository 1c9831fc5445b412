"""A second virtualenv holding another scikit-learn than the server's (issue 19, item 6).

tox's ``environments`` environment makes it (scikit-learn 1.5.2, from the package index,
before the tests) and names it in ``INFERPOOL_TEST_SKLEARN_ENV``. Models pickled by that
scikit-learn are served from workers started with its interpreter, as a folder and as a
tarball; the answers are those the environment's own scikit-learn gives, over REST and
gRPC; a model requiring that version without naming the environment fails with the
scheduler's sentence.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import sklearn

from tests.environments import named_by
from tests.support import Server, iris_data
from tests.support.grpc import infer_request, stub_for
from tests.support.where import report, write_where_model

OLD = "1.5.2"

TRAIN = """
import json, sys
import joblib
import numpy as np
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
X, y = load_iris(return_X_y=True)
forest = RandomForestClassifier(n_estimators=20, max_depth=5, random_state=0).fit(X, y)
joblib.dump(forest, sys.argv[1])
print(json.dumps(forest.predict_proba(X[::10]).tolist()))
"""


@pytest.fixture(scope="module")
def old_env() -> Path:
    return named_by("INFERPOOL_TEST_SKLEARN_ENV", "virtualenv")


def env_python(env: Path) -> Path:
    return env / "bin" / "python"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, old_env: Path) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("repo")
    forest = root / "old-forest"
    forest.mkdir()
    # Trained and pickled by the environment's own scikit-learn.
    done = subprocess.run(
        [env_python(old_env), "-c", TRAIN, str(forest / "model.joblib")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    expected = json.loads(done.stdout)
    settings = {
        "name": "old-forest",
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"environment_path": str(old_env)},
        "requirements": [f"scikit-learn=={OLD}"],
    }
    (forest / "model-settings.json").write_text(json.dumps(settings))
    write_where_model(root / "where-old", parameters={"environment_path": str(old_env)})
    write_where_model(root / "where-server")
    tarball = tmp_path_factory.mktemp("packed") / "sklearn15.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        for member in old_env.iterdir():
            archive.add(member, arcname=member.name)
    write_where_model(root / "where-packed", parameters={"environment_tarball": str(tarball)})
    write_where_model(root / "wants-old", requirements=[f"scikit-learn=={OLD}"])
    return root, expected


@pytest.fixture(scope="module")
def server(repository: tuple[Path, list], tmp_path_factory) -> Iterator[Server]:
    root, _ = repository
    cache = tmp_path_factory.mktemp("cache")
    arguments = ("--workers", "2", "--environments-dir", str(cache), "--no-exit-on-error")
    with Server(root, *arguments) as running:
        running.wait_live()
        running.cache = cache
        yield running


def wait_settled(server: Server) -> dict[str, dict]:
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        if index and all(e["state"] != "LOADING" for e in index.values()):
            return index
        time.sleep(0.2)
    raise TimeoutError("models still loading")


def test_the_environment_holds_another_scikit_learn_than_the_server() -> None:
    assert sklearn.__version__ != OLD  # else this file proves nothing


def test_models_run_with_the_environments_scikit_learn(server: Server, old_env: Path) -> None:
    index = wait_settled(server)
    assert index["where-old"]["state"] == "READY", index
    old = report(server.url, "where-old")
    assert old["sklearn"] == OLD and Path(old["prefix"]) == old_env
    assert report(server.url, "where-server")["sklearn"] == sklearn.__version__
    packed = report(server.url, "where-packed")
    assert packed["sklearn"] == OLD
    # Unpacked once into the cache, under the tarball's hash.
    assert Path(packed["prefix"]).parent == server.cache


def test_a_model_pickled_by_the_old_scikit_learn_answers_as_it_does(
    server: Server, repository: tuple[Path, list]
) -> None:
    _, expected = repository
    wait_settled(server)
    X, _ = iris_data()
    rows = X[::10]
    body = {
        "inputs": [{"name": "x", "datatype": "FP64", "shape": list(rows.shape),
                    "data": rows.ravel().tolist()}],
        "outputs": [{"name": "predict_proba"}],
    }  # fmt: skip
    answer = httpx.post(f"{server.url}/v2/models/old-forest/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json()["outputs"][0]["data"]).reshape(len(rows), 3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    request = infer_request("old-forest", x=rows)
    request.outputs.add(name="predict_proba")
    with stub_for(server) as stub:
        reply = stub.ModelInfer(request)
    [proba] = [o for o in reply.outputs if o.name == "predict_proba"]
    typed = np.array(proba.contents.fp64_contents).reshape(len(rows), 3)
    np.testing.assert_allclose(typed, expected, rtol=0, atol=1e-12)


def test_a_version_requirement_the_server_does_not_meet_fails_with_the_sentence(
    server: Server,
) -> None:
    index = wait_settled(server)
    reason = index["wants-old"]["reason"]
    assert index["wants-old"]["state"] == "FAILED"
    assert reason.startswith("cannot place 1 replica of 'wants-old': ")
    assert f"2 lack 'scikit-learn=={OLD}'" in reason
