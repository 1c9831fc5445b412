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
from tests.support.alibi_headers import answer_with_headers
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
# Explainers whose load fails in MLServer: at its start-up, that stops it (test_load_errors,
# test_an_explainer_of_a_missing_model load them later).
FAILING = ("wrong-type", "unknown-type", "lost-tree", "lost-anchor")
# MLServer's black-box explainers call their model while they load (alibi's load does):
# at MLServer's start-up the model they call, MLServer's own, is not served yet (the
# call is refused, the load fails, MLServer stops). They are loaded once it serves.
LATER = ("iris-anchor", "iris-kernel-shap", "reviews-anchor")


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
        if name not in FAILING + LATER:
            mlserver_model(theirs / name, *mlserver_settings(root, name, port))
    python = mlserver_python("alibi-explain", "mlserver-alibi-explain-protobuf.txt")
    with running_mlserver(theirs, python=python, http_port=port) as (url, address):
        for name in LATER:
            mlserver_model(theirs / name, *mlserver_settings(root, name, port))
            loaded = httpx.post(f"{url}/v2/repository/models/{name}/load", timeout=300)
            assert loaded.status_code == 200, loaded.text
        yield MLServer(url, address, theirs)


def explanations(server: Server, mlserver: MLServer, name: str, request: dict) -> list[dict]:
    """The explanation each answers 200 (inferpool's, then MLServer's), parsed, after
    checking that both answer it in one BYTES output ``explanation`` of shape [1, 1] and
    name the explainer in the same HTTP headers (neither in the JSON)."""
    ours, theirs = both(server.url, mlserver.url, name, request)
    assert ours.status_code == 200, ours.text
    parsed = []
    answers = answer_with_headers(ours), answer_with_headers(theirs)
    assert answers[0]["alibi_headers"] == answers[1]["alibi_headers"]
    assert answers[0]["alibi_headers"]["x-seldon-alibi-type"] == "explanation"
    for answer in answers:
        [output] = answer["outputs"]
        head = (output["name"], output["datatype"], output["shape"])
        assert head == ("explanation", "BYTES", [1, 1]), output
        assert output["parameters"]["content_type"] == "str"
        parsed.append(json.loads(output["data"][0]))
    return parsed


def assert_same_meta(ours: dict, theirs: dict) -> None:
    assert ours["meta"]["name"] == theirs["meta"]["name"]
    assert ours["meta"]["params"] == theirs["meta"]["params"]


def test_anchor_tabular_finds_the_anchors_mlserver_finds(
    server: Server, mlserver: MLServer
) -> None:
    """Anchors are sampled, and each server's explainer draws its own samples: the rule of
    a clear case (the setosa's short petal) is the same, the others may differ (the
    versicolor's: four conditions or two, neither reaching the threshold, a precision
    under 0.9 at times: 0.855 seen); the prediction is the same, the setosa's precision
    high on both."""
    for row in ROWS:
        ours, theirs = explanations(server, mlserver, "iris-anchor", body([row]))
        assert_same_meta(ours, theirs)
        assert ours["data"]["raw"]["prediction"] == theirs["data"]["raw"]["prediction"]
        if row == ROWS[0]:
            assert ours["data"]["anchor"] == theirs["data"]["anchor"] == ["petal_length <= 1.60"]
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


def test_partial_dependences_are_mlservers(server: Server, mlserver: MLServer) -> None:
    """TreePartialDependence (saved) and PartialDependenceVariance (built from
    init_parameters): the same values, every row asked explained on both."""
    for name, keys in (("iris-tree-pd", ("pd_values", "feature_values")),
                       ("iris-pd-variance", ("pd_values", "feature_importance"))):  # fmt: skip
        ours, theirs = explanations(server, mlserver, name, body(ROWS))
        assert_same_meta(ours, theirs)
        for key in keys:
            for mine, other in zip(ours["data"][key], theirs["data"][key], strict=True):
                np.testing.assert_allclose(mine, other, rtol=1e-9, atol=1e-12)


def test_tree_shap_from_init_parameters_is_unfitted_in_mlserver(
    server: Server, mlserver: MLServer
) -> None:
    """Built from init_parameters: inferpool fits it (path-dependent, no background data);
    MLServer does not, and every request is a 500 (alibi: "Called explain on an unfitted
    object!", the traceback as the body)."""
    ours, theirs = (
        httpx.post(f"{url}/v2/models/iris-tree-shap-init/infer", json=body(ROWS), timeout=120)
        for url in (server.url, mlserver.url)
    )
    assert ours.status_code == 200, ours.text
    assert theirs.status_code == 500
    assert "Called explain on an unfitted object!" in theirs.text


def test_anchor_text_fails_in_mlserver(server: Server, mlserver: MLServer) -> None:
    """MLServer hands AnchorText the request's first string as numpy's (``numpy.str_``),
    which spaCy's tokenizer refuses: a 500; inferpool's explanation is alibi's (the test
    of test_alibi_explain.py)."""
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [SENTENCE]}
    ours, theirs = (
        httpx.post(f"{url}/v2/models/reviews-anchor/infer", json={"inputs": [text]}, timeout=120)
        for url in (server.url, mlserver.url)
    )
    assert ours.status_code == 200, ours.text
    assert json.loads(ours.json()["outputs"][0]["data"][0])["data"]["anchor"] == ["good"]
    assert theirs.status_code == 500
    assert "expected str, got numpy.str_" in theirs.text


def test_the_explain_endpoints(server: Server, mlserver: MLServer) -> None:
    """MLServer's plain ``/explain`` is one route for the whole server (its custom
    handler's path), answered by one of the explainers loaded; it has no
    ``/v2/models/{name}/explain``. inferpool answers the latter, and the former while one
    explainer only is loaded (here several: a 409 naming them)."""
    url = f"{server.url}/v2/models/iris-kernel-shap/explain"
    ours = httpx.post(url, json=body(ROWS), timeout=120)
    assert ours.status_code == 200 and ours.json()["meta"]["name"] == "KernelShap"
    theirs = httpx.post(f"{mlserver.url}/v2/models/iris-kernel-shap/explain", json=body(ROWS))
    assert theirs.status_code == 404
    ours = httpx.post(f"{server.url}/explain", json=body(ROWS), timeout=120)
    assert ours.status_code == 409 and "call /v2/models/{name}/explain" in ours.json()["error"]
    theirs = httpx.post(f"{mlserver.url}/explain", json=body(ROWS), timeout=120)
    assert theirs.status_code == 200 and set(theirs.json()) == {"meta", "data"}


def mlserver_load(mlserver: MLServer, root: Path, name: str) -> httpx.Response:
    """MLServer's answer to loading inferpool's model ``name`` through its repository API."""
    port = int(mlserver.url.rsplit(":", 1)[1])
    mlserver_model(mlserver.root / name, *mlserver_settings(root, name, port))
    return httpx.post(f"{mlserver.url}/v2/repository/models/{name}/load", timeout=120)


def test_an_explainer_of_a_missing_model(
    server: Server, mlserver: MLServer, repository: tuple[Path, dict]
) -> None:
    """alibi's AnchorTabular calls its model while it loads: MLServer's load fails (a 500,
    alibi's PredictorCallError); inferpool's explainer is built at its first request,
    which is a 503 naming the missing model."""
    root, _ = repository
    ours = httpx.post(f"{server.url}/v2/models/lost-anchor/infer", json=body([ROWS[0]]))
    assert ours.status_code == 503
    assert "explains model 'no-such-model'" in ours.json()["error"]
    theirs = mlserver_load(mlserver, root, "lost-anchor")
    assert theirs.status_code == 500 and "PredictorCallError" in theirs.text


def test_load_errors(server: Server, mlserver: MLServer, repository: tuple[Path, dict]) -> None:
    """Settings inferpool refuses at load (FAILED, one sentence each: test_alibi_explain.py)
    and MLServer's answers to loading them."""
    root, _ = repository
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    refused = ("wrong-type", "unknown-type", "lost-tree")
    assert {index[name]["state"] for name in refused} == {"FAILED"}
    # A saved AnchorTabular under explainer_type kernel_shap: MLServer loads it.
    assert mlserver_load(mlserver, root, "wrong-type").status_code == 200
    # An unknown explainer_type: a 500, the traceback of a KeyError.
    theirs = mlserver_load(mlserver, root, "unknown-type")
    assert theirs.status_code == 500 and "KeyError: 'counterfactual'" in theirs.text
    # A white-box explainer's missing model file: a 422 saying so.
    theirs = mlserver_load(mlserver, root, "lost-tree")
    missing = root / "lost-tree" / "nothing.joblib"
    assert (theirs.status_code, theirs.json()) == (
        422, {"error": f"Invalid URI specified for model lost-tree ({missing})"}
    )  # fmt: skip
