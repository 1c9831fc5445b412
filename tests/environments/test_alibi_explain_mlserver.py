"""alibi explainers answered by MLServer itself and by inferpool, side by side (issue 40):
the same requests, the same explanations, or each difference as it is (written down in
docs/runtimes/alibi-explain.md, "Beside MLServer").

mlserver-alibi-explain's newest release (1.6.1) with alibi[shap,tensorflow] 0.9.6 cannot
be installed beside MLServer 1.7.1 (pip: ResolutionImpossible): MLServer 1.7.0 runs here,
from a virtualenv of its own (mlserver-alibi-explain-requirements.txt; tox -e environments
makes it before the tests, else the first test does), in-process (no parallel workers), on
a repository of its own whose models load the classifiers and explainers
test_alibi_explain.py's fixture saved (scikit-learn 1.9.1 and shap 0.43 in both). Its
black-box explainers call the classifiers it serves itself over HTTP (their infer_uri:
MLServer's own address); inferpool serves that fixture's repository from the packed
environment (``INFERPOOL_TEST_ALIBI_ENV``; without it these tests are skipped).
Explanations are compared on what they mean: the explainer's name and parameters, the
anchor, its prediction and precision, the SHAP values; seeded explainers (AnchorTabular
seed 1, KernelShap seed 0) answer the same on both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pytest

from tests.environments import test_alibi_explain as explain
from tests.environments.side_by_side import both, mlserver_model, mlserver_python
from tests.environments.test_alibi_explain import IMPLEMENTATION, ROWS, SENTENCE, body
from tests.support import Server, free_port
from tests.support.mlserver import running_mlserver

if not os.environ.get("INFERPOOL_TEST_ALIBI_ENV"):
    pytest.skip("INFERPOOL_TEST_ALIBI_ENV names no tarball: tox -e environments packs it",
                allow_module_level=True)  # fmt: skip

# The servers' set-up: MLServer's imports (TensorFlow) and inferpool's environment
# workers, on a loaded 2-core host.
pytestmark = pytest.mark.timeout(600)

# test_alibi_explain.py's fixtures, anew for this module: its repository of saved models
# and explainers (and what they answer in the environment), and inferpool serving it.
tarball, repository, server = explain.tarball, explain.repository, explain.server

SKLEARN = "mlserver_sklearn.SKLearnModel"
# Explainers whose load fails: at its start-up, that stops MLServer (test_load_errors).
FAILING = ("wrong-type", "unknown-type", "lost-tree")


class MLServer(NamedTuple):
    url: str  # REST
    address: str  # gRPC
    root: Path  # its repository


def mlserver_settings(root: Path, name: str, port: int) -> tuple[str, str, dict]:
    """MLServer's implementation, uri and extra for inferpool's model ``name``: files by
    their absolute path, infer_uri MLServer's own address (inferpool's: a model name, or
    a URL whose host and port it ignores)."""
    document = json.loads((root / name / "model-settings.json").read_text())
    parameters = document["parameters"]
    uri = str((root / name / parameters["uri"]).resolve()) if parameters["uri"] else ""
    extra = dict(parameters.get("extra", {}))
    if document["implementation"] == SKLEARN:
        return SKLEARN, uri, {}
    target = extra["infer_uri"]
    if target.endswith(".joblib"):  # a white-box explainer's model file
        extra["infer_uri"] = str((root / name / target).resolve())
    else:
        model = target.rstrip("/").removesuffix("/infer").rsplit("/", 1)[-1]
        extra["infer_uri"] = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    return IMPLEMENTATION, uri, extra


@pytest.fixture(scope="module")
def mlserver(
    repository: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MLServer]:
    root, _ = repository
    theirs = tmp_path_factory.mktemp("mlserver-repo")
    port = free_port()
    for settings in sorted(root.glob("*/model-settings.json")):
        name = settings.parent.name
        if name not in FAILING:
            mlserver_model(theirs / name, *mlserver_settings(root, name, port))
    python = mlserver_python("alibi-explain", "mlserver-alibi-explain-protobuf.txt")
    with running_mlserver(theirs, python=python, http_port=port) as (url, address):
        yield MLServer(url, address, theirs)


def explanations(server: Server, mlserver: MLServer, name: str, request: dict) -> list[dict]:
    """The explanation each answers 200 (inferpool's, then MLServer's), parsed, after
    checking that both answer it in the same output."""
    ours, theirs = both(server.url, mlserver.url, name, request)
    assert ours.status_code == 200, ours.text
    parsed = []
    for answer in (ours.json(), theirs.json()):
        [output] = answer["outputs"]
        head = (output["name"], output["datatype"], output["shape"])
        assert head == ("explanation", "BYTES", [1]), output
        assert output["parameters"]["content_type"] == "str"
        parsed.append(json.loads(output["data"][0]))
    return parsed


def assert_same_meta(ours: dict, theirs: dict) -> None:
    assert ours["meta"]["name"] == theirs["meta"]["name"]
    assert ours["meta"]["params"] == theirs["meta"]["params"]


def test_anchor_tabular_finds_the_anchors_mlserver_finds(
    server: Server, mlserver: MLServer
) -> None:
    for row in ROWS:
        ours, theirs = explanations(server, mlserver, "iris-anchor", body([row]))
        assert_same_meta(ours, theirs)
        assert ours["data"]["anchor"] == theirs["data"]["anchor"]
        assert ours["data"]["raw"]["prediction"] == theirs["data"]["raw"]["prediction"]
        assert ours["data"]["precision"] >= 0.9 and theirs["data"]["precision"] >= 0.9


def test_explain_parameters_reach_the_explainer_on_both(server: Server, mlserver: MLServer) -> None:
    asked = body([ROWS[0]], explain_parameters={"threshold": 0.8, "beam_size": 2})
    ours, theirs = explanations(server, mlserver, "iris-anchor", asked)
    assert_same_meta(ours, theirs)
    assert ours["meta"]["params"]["threshold"] == 0.8


def test_kernel_shap_values_are_mlservers(server: Server, mlserver: MLServer) -> None:
    ours, theirs = explanations(server, mlserver, "iris-kernel-shap", body(ROWS))
    assert_same_meta(ours, theirs)
    for key in ("shap_values", "expected_value"):
        np.testing.assert_allclose(ours["data"][key], theirs["data"][key], atol=1e-6)
    np.testing.assert_allclose(
        ours["data"]["raw"]["raw_prediction"], theirs["data"]["raw"]["raw_prediction"]
    )


def test_tree_shap_values_are_mlservers(server: Server, mlserver: MLServer) -> None:
    ours, theirs = explanations(server, mlserver, "iris-tree-shap", body(ROWS))
    assert_same_meta(ours, theirs)
    np.testing.assert_allclose(ours["data"]["shap_values"], theirs["data"]["shap_values"])


def test_tree_shap_from_init_parameters(server: Server, mlserver: MLServer) -> None:
    ours, theirs = both(server.url, mlserver.url, "iris-tree-shap-init", body(ROWS))
    assert ours.json() == theirs.json()


def test_anchor_text_finds_the_word_mlserver_finds(server: Server, mlserver: MLServer) -> None:
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [SENTENCE]}
    ours, theirs = explanations(server, mlserver, "reviews-anchor", {"inputs": [text]})
    assert_same_meta(ours, theirs)
    assert ours["data"]["anchor"] == theirs["data"]["anchor"] == ["good"]


def test_the_explain_endpoints(server: Server, mlserver: MLServer) -> None:
    for path in ("/v2/models/iris-kernel-shap/explain", "/explain"):
        ours = httpx.post(f"{server.url}{path}", json=body(ROWS), timeout=120)
        theirs = httpx.post(f"{mlserver.url}{path}", json=body(ROWS), timeout=120)
        assert (ours.status_code, ours.text) == (theirs.status_code, theirs.text)


def test_an_explainer_of_a_missing_model(server: Server, mlserver: MLServer) -> None:
    ours, theirs = both(server.url, mlserver.url, "lost-anchor", body([ROWS[0]]))
    assert ours.json() == theirs.json()


def test_load_errors(server: Server, mlserver: MLServer, repository: tuple[Path, dict]) -> None:
    root, _ = repository
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    for name in FAILING:
        mlserver_model(mlserver.root / name, *mlserver_settings(root, name, 0))
        url = f"{mlserver.url}/v2/repository/models/{name}/load"
        theirs = httpx.post(url, timeout=120)
        assert (theirs.status_code, theirs.text) == (0, index[name]["reason"])
