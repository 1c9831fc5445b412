"""alibi explainers served as models from a per-model environment (issue 40, point 4).

alibi 0.9.6 requires numpy<2: tox's ``environments`` environment packs one environment
holding it and alibi-detect (``alibi-requirements.txt``) and names the tarball in
``INFERPOOL_TEST_ALIBI_ENV``. The test fits a scikit-learn classifier and the explainers
with that environment's python, saves them (``explainer.save``) and computes there what
they answer; the server serves the classifier (in its own environment) beside the
explainers (two workers of the alibi environment), which call it through the engine.
The explanations must be alibi's own, over REST and gRPC, with MLServer's settings
and answer: anchors are sampled, so their rules and predictions are compared and their
precision bounded; KernelShap (four features: every coalition, no sampling) and
TreeShap are compared value by value. AnchorText explains a text classifier (strings
both ways) with a blank spaCy pipeline: nothing downloaded.

With ``--workers 0`` the classifiers load in the server process and the explainers in
their environment's workers (``environment_workers.py``): the same answers.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from inferpool.engine.environments.unpack import prepare
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.environments import named_by, serving_settled
from tests.support import Server
from tests.support.alibi_headers import answer_with_headers, reply_with_headers
from tests.support.grpc import stub_for

# The fixture unpacks a 1.3 GB environment, fits and saves models with its python and
# starts a server whose environment workers import alibi: in ci19 (tox -e alibi-deep
# unpacking its own beside it) the explainers' setup ran past pytest's default 300 s.
pytestmark = pytest.mark.timeout(600)

IMPLEMENTATION = "mlserver_alibi_explain.AlibiExplainRuntime"
URL = "http://localhost:8080/v2/models/{}/infer"  # MLServer's form: host and port ignored

# Run by the environment's python: fits and saves the model and the explainers, and
# prints what alibi answers for ROWS.
SAVE = """
import json, sys
import joblib
import numpy as np
from alibi.explainers import (AnchorTabular, KernelShap, PartialDependenceVariance,
                               TreePartialDependence, TreeShap)
from alibi.saving import load_explainer
from sklearn.datasets import load_iris
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
root, rows, SENTENCE = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
X, y = load_iris(return_X_y=True)
names = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
model = LogisticRegression(max_iter=1000).fit(X, y)
joblib.dump(model, root + "/iris/model.joblib")
anchor = AnchorTabular(model.predict, feature_names=names, seed=1)
anchor.fit(X, disc_perc=(25, 50, 75))
anchor.save(root + "/iris-anchor/explainer")
shap = KernelShap(model.predict_proba, link="logit", feature_names=names, seed=0)
shap.fit(X[::10])
shap.save(root + "/iris-kernel-shap/explainer")
# A decision tree: shap 0.43's sums of a scikit-learn 1.9 random forest fail its own
# additivity check (2026-12-07), with or without background data.
single = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y)
joblib.dump(single, root + "/iris-tree-shap/tree.joblib")
tree = TreeShap(single, model_output="raw", feature_names=names)
tree.fit(X[::10])
tree.save(root + "/iris-tree-shap/explainer")
x = np.asarray(rows)
# Loaded as the server loads them, each given its predictor again.
anchor = load_explainer(root + "/iris-anchor/explainer", predictor=model.predict)
shap = load_explainer(root + "/iris-kernel-shap/explainer", predictor=model.predict_proba)
tree = load_explainer(root + "/iris-tree-shap/explainer", predictor=single)
# Path-dependent (no background data), as init_parameters build it.
fresh = TreeShap(single, model_output="raw")
fresh.fit()
# Partial dependences of a boosted model (TreePartialDependence takes gradient boosting
# and regression trees only). alibi 0.9.6 cannot save a PartialDependenceVariance (it has
# no predictor attribute): it is built from init_parameters.
boost = GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0).fit(X, y)
joblib.dump(boost, root + "/iris-tree-pd/boost.joblib")
TreePartialDependence(boost, feature_names=names).save(root + "/iris-tree-pd/explainer")
dependence = load_explainer(root + "/iris-tree-pd/explainer", predictor=boost)
variance = PartialDependenceVariance(boost, feature_names=names)
# AnchorText of a text classifier, with a blank spaCy pipeline (a tokenizer: nothing
# to download) and the "unknown" sampling strategy (words masked, no language model).
import spacy
from alibi.explainers import AnchorText
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.pipeline import make_pipeline

texts = ["a good movie", "a bad movie", "good acting", "bad plot", "really good fun",
         "really bad and boring", "good story", "bad story"]
reviews = make_pipeline(CountVectorizer(), LogisticRegression()).fit(texts, [1, 0] * 4)
joblib.dump(reviews, root + "/reviews/model.joblib")
words = AnchorText(reviews.predict, sampling_strategy="unknown", nlp=spacy.blank("en"), seed=0)
words.save(root + "/reviews-anchor/explainer")
words = load_explainer(root + "/reviews-anchor/explainer", predictor=reviews.predict)
print(json.dumps({
    "text": json.loads(words.explain(SENTENCE).to_json()),
    "numpy": np.__version__,
    "anchors": [json.loads(anchor.explain(row).to_json()) for row in x],
    "kernel_shap": json.loads(shap.explain(x).to_json()),
    "tree_shap": json.loads(tree.explain(x).to_json()),
    "tree_shap_fresh": json.loads(fresh.explain(x).to_json()),
    "tree_pd": json.loads(dependence.explain(x).to_json()),
    "pd_variance": json.loads(variance.explain(x).to_json()),
}))
"""

SENTENCE = "the story was good and long"
COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
# Iris rows: a setosa (one clear rule: a short petal), a versicolor, a virginica.
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.4, 3.2, 4.5, 1.5], [7.7, 3.8, 6.7, 2.2]]


@pytest.fixture(scope="module")
def tarball() -> Path:
    return named_by("INFERPOOL_TEST_ALIBI_ENV", "tarball")


def settings(folder: Path, document: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps({"name": folder.name, **document}))


def explainer(folder: Path, tarball: Path, uri: str = "./explainer", **extra: object) -> None:
    parameters = {"uri": uri, "environment_tarball": str(tarball), "extra": extra}
    settings(folder, {"implementation": IMPLEMENTATION, "parameters": parameters})


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, tarball: Path) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("repo")
    cache = root.parent / "environments"
    environment = prepare(tarball, cache)  # the server finds it unpacked, under the same key
    for name in ("iris", "iris-anchor", "iris-kernel-shap", "iris-tree-shap", "iris-tree-pd",
                 "reviews", "reviews-anchor"):  # fmt: skip
        (root / name).mkdir()
    done = subprocess.run(
        [environment.python, "-c", SAVE, str(root), json.dumps(ROWS), SENTENCE],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert expected["numpy"].startswith("1."), expected["numpy"]
    # The classifier, in the server's own environment; its explain endpoint forwards to
    # the anchor explainer (parameters.extra.explainer).
    settings(root / "iris", {
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib", "extra": {"explainer": "iris-anchor"}},
    })  # fmt: skip
    explainer(root / "iris-anchor", tarball, explainer_type="anchor_tabular",
              infer_uri=URL.format("iris"))  # fmt: skip
    explainer(root / "iris-kernel-shap", tarball, explainer_type="kernel_shap",
              infer_uri="iris", infer_output="predict_proba", explainer_batch=True)  # fmt: skip
    explainer(root / "iris-tree-shap", tarball, explainer_type="tree_shap",
              infer_uri="./tree.joblib", explainer_batch=True)  # fmt: skip
    settings(root / "reviews", {"implementation": "mlserver_sklearn.SKLearnModel",
                                "parameters": {"uri": "./model.joblib"}})  # fmt: skip
    explainer(root / "reviews-anchor", tarball, explainer_type="anchor_text",
              infer_uri=URL.format("reviews"))  # fmt: skip
    # Built from init_parameters (path-dependent: no background data); explainer_batch
    # left false: a white-box explainer explains every row all the same, as MLServer's.
    explainer(root / "iris-tree-shap-init", tarball, uri="", explainer_type="tree_shap",
              infer_uri="../iris-tree-shap/tree.joblib",
              init_parameters={"model_output": "raw"})  # fmt: skip
    # The partial dependences of a boosted model: one saved, one built (init_parameters).
    explainer(root / "iris-tree-pd", tarball, explainer_type="tree_partial_dependence",
              infer_uri="./boost.joblib")  # fmt: skip
    explainer(root / "iris-pd-variance", tarball, uri="",
              explainer_type="tree_partial_dependence_variance",
              infer_uri="../iris-tree-pd/boost.joblib",
              init_parameters={"feature_names": COLUMNS})  # fmt: skip
    # Bad settings and a missing model.
    explainer(root / "lost-anchor", tarball, uri="../iris-anchor/explainer",
              explainer_type="anchor_tabular", infer_uri=URL.format("no-such-model"))  # fmt: skip
    explainer(root / "wrong-type", tarball, uri="../iris-anchor/explainer",
              explainer_type="kernel_shap", infer_uri="iris")  # fmt: skip
    explainer(root / "unknown-type", tarball, explainer_type="counterfactual", infer_uri="iris")
    explainer(root / "lost-tree", tarball, uri="../iris-tree-shap/explainer",
              explainer_type="tree_shap", infer_uri="./nothing.joblib")  # fmt: skip
    return root, expected


@pytest.fixture(scope="module")
def server(repository: tuple[Path, dict]) -> Iterator[Server]:
    root, _ = repository
    yield from serving_settled(root, root.parent / "environments", timeout=420)


@pytest.fixture(scope="module")
def alone(repository: tuple[Path, dict]) -> Iterator[Server]:
    """``--workers 0``: the classifiers in the server process, the explainers in workers
    of their environment."""
    root, _ = repository
    yield from serving_settled(root, root.parent / "environments", timeout=420, workers=0)


def flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def body(rows: list[list[float]], **parameters: object) -> dict:
    shape = [len(rows), len(rows[0])]
    tensor = {"name": "x", "datatype": "FP64", "shape": shape, "data": flat(rows)}
    return {"inputs": [tensor], "parameters": parameters}


def explain(server: Server, name: str, rows: list[list[float]], path: str = "infer") -> dict:
    """The explanation a model answers over REST, parsed, after checking MLServer's shape."""
    answer = httpx.post(f"{server.url}/v2/models/{name}/{path}", json=body(rows), timeout=120)
    document = answer_with_headers(answer)  # /infer and /explain: HTTP headers, as MLServer
    [output] = document["outputs"]
    assert output["name"] == "explanation" and output["datatype"] == "BYTES"
    assert output["shape"] == [1, 1] and output["parameters"]["content_type"] == "str"
    assert document["alibi_headers"]["x-seldon-alibi-type"] == "explanation"
    return json.loads(output["data"][0])


def explain_grpc(server: Server, name: str, rows: list[list[float]]) -> dict:
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[len(rows), len(rows[0])])
    tensor.contents.fp64_contents.extend(flat(rows))
    with stub_for(server) as stub:
        reply, headers = reply_with_headers(stub, request, 120)
    assert [o.name for o in reply.outputs] == ["explanation"]
    assert headers["x-seldon-alibi-type"] == "explanation"
    if reply.raw_output_contents:
        return json.loads(reply.raw_output_contents[0][4:])
    return json.loads(reply.outputs[0].contents.bytes_contents[0])


def rule_holds(condition: str, row: list[float]) -> bool:
    """Whether one of an anchor's conditions ("a < name <= b", "name <= b", "name > a")
    is true of the row it explains."""
    bounds = re.fullmatch(r"(?:([\d.]+) < )?(\w+)(?: <= ([\d.]+)| > ([\d.]+))?", condition)
    assert bounds is not None, condition
    low, name, high, above = bounds.groups()
    value = row[COLUMNS.index(name)]
    lowest = max(float(x) for x in (low, above, "-inf") if x is not None)
    return lowest < value <= float(high or "inf")


def assert_anchor(got: dict, want: dict, row: list[float]) -> None:
    """An anchor of alibi's for this row: its meta and prediction; every condition of its
    rule true of the row. Its precision is sampled: when no anchor reaches the threshold
    (0.95) alibi answers its best one, and the versicolor row's was 0.86-0.99 over 75
    seeds of alibi's own (2026-12-07; 0.863 failed ci26's bound of 0.9): the setosa's and
    the virginica's were 1.0 in every one."""
    assert got["meta"]["name"] == "AnchorTabular"
    assert got["meta"]["params"] == want["meta"]["params"]
    assert set(got["data"]) == set(want["data"])
    assert got["data"]["raw"]["prediction"] == want["data"]["raw"]["prediction"]
    assert got["data"]["anchor"] and all(rule_holds(c, row) for c in got["data"]["anchor"])
    floor = 0.8 if row == ROWS[1] else 0.9
    assert got["data"]["precision"] >= floor and 0 < got["data"]["coverage"] <= 1


def test_an_anchor_explains_the_model_it_calls(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    setosa = expected["anchors"][0]
    assert setosa["data"]["anchor"] == ["petal_length <= 1.60"]  # else the test proves little
    for _ in range(2):  # two replicas: each builds its explainer on its first request
        got = explain(server, "iris-anchor", [ROWS[0]])
        assert_anchor(got, setosa, ROWS[0])
        assert got["data"]["anchor"] == setosa["data"]["anchor"]
    for row, want in zip(ROWS[1:], expected["anchors"][1:], strict=True):
        assert_anchor(explain(server, "iris-anchor", [row]), want, row)
    # explainer_batch false (MLServer's default): the first row alone is explained.
    assert_anchor(explain(server, "iris-anchor", ROWS), setosa, ROWS[0])
    got = explain_grpc(server, "iris-anchor", [ROWS[0]])
    assert_anchor(got, setosa, ROWS[0])
    assert got["data"]["anchor"] == setosa["data"]["anchor"]


def test_an_anchor_text_explains_a_text_classifier(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """Strings to the explainer (BYTES) and from it to the model it calls (BYTES, content
    type str), as MLServer sends them; the anchor is the one word deciding the class."""
    _, expected = repository
    want = expected["text"]
    assert want["data"]["anchor"] == ["good"]  # else the test proves little
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [SENTENCE]}
    answer = httpx.post(f"{server.url}/v2/models/reviews-anchor/infer",
                        json={"inputs": [text]}, timeout=120)  # fmt: skip
    assert answer.status_code == 200, answer.text
    got = json.loads(answer.json()["outputs"][0]["data"][0])
    assert got["meta"]["name"] == "AnchorText"
    assert got["meta"]["params"] == want["meta"]["params"]
    assert got["data"]["anchor"] == want["data"]["anchor"]
    assert got["data"]["raw"]["prediction"] == want["data"]["raw"]["prediction"]
    assert got["data"]["precision"] >= 0.95


def test_a_requests_explain_parameters_reach_the_explainer(server: Server) -> None:
    """MLServer's place for them: the request's ``parameters.explain_parameters``."""
    asked = body([ROWS[0]], explain_parameters={"threshold": 0.8, "beam_size": 2})
    answer = httpx.post(f"{server.url}/v2/models/iris-anchor/infer", json=asked, timeout=120)
    assert answer.status_code == 200, answer.text
    got = json.loads(answer.json()["outputs"][0]["data"][0])
    assert got["meta"]["params"]["threshold"] == 0.8
    assert got["meta"]["params"]["beam_size"] == 2
    assert explain(server, "iris-anchor", [ROWS[0]])["meta"]["params"]["threshold"] == 0.95


def test_kernel_shap_values_are_alibis(server: Server, repository: tuple[Path, dict]) -> None:
    _, expected = repository
    want = expected["kernel_shap"]
    for got in (explain(server, "iris-kernel-shap", ROWS),
                explain_grpc(server, "iris-kernel-shap", ROWS)):  # fmt: skip
        assert got["meta"]["name"] == "KernelShap"
        np.testing.assert_allclose(got["data"]["shap_values"], want["data"]["shap_values"],
                                   atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(got["data"]["expected_value"], want["data"]["expected_value"])
        np.testing.assert_allclose(got["data"]["raw"]["raw_prediction"],
                                   want["data"]["raw"]["raw_prediction"], rtol=1e-9)  # fmt: skip


def test_tree_shap_holds_its_own_model(server: Server, repository: tuple[Path, dict]) -> None:
    _, expected = repository
    for name, want in (("iris-tree-shap", expected["tree_shap"]),
                       ("iris-tree-shap-init", expected["tree_shap_fresh"])):  # fmt: skip
        for got in (explain(server, name, ROWS), explain_grpc(server, name, ROWS)):
            assert got["meta"]["name"] == "TreeShap"
            np.testing.assert_allclose(got["data"]["shap_values"], want["data"]["shap_values"],
                                       rtol=1e-9, atol=1e-12)  # fmt: skip


def test_the_partial_dependences_hold_their_own_model(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """TreePartialDependence (saved) and PartialDependenceVariance (built from
    init_parameters) of a boosted model: alibi's values, over REST and gRPC; every row
    asked is their data (white-box explainers, whatever explainer_batch says)."""
    _, expected = repository
    for name, want, keys in (
        ("iris-tree-pd", expected["tree_pd"], ("pd_values", "feature_values")),
        ("iris-pd-variance", expected["pd_variance"], ("pd_values", "feature_importance")),
    ):
        for got in (explain(server, name, ROWS), explain_grpc(server, name, ROWS)):
            assert got["meta"]["name"] == want["meta"]["name"]
            assert got["data"]["feature_names"] == COLUMNS
            for key in keys:
                for mine, theirs in zip(got["data"][key], want["data"][key], strict=True):
                    np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-12)


def test_a_models_explain_endpoint_forwards_to_its_explainer(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    got = explain(server, "iris", [ROWS[0]], path="explain")
    assert_anchor(got, expected["anchors"][0], ROWS[0])
    assert got["data"]["anchor"] == expected["anchors"][0]["data"]["anchor"]


def test_the_explainers_own_explain_endpoint_answers_plain_json(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """MLServer's ``/explain`` of an explainer: the explanation's JSON, no V2 encoding;
    at the root only while one explainer is loaded (here several: 409 naming them)."""
    _, expected = repository
    url = f"{server.url}/v2/models/iris-kernel-shap/explain"
    answer = httpx.post(url, json=body(ROWS), timeout=120)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["meta"]["name"] == "KernelShap"
    want = expected["kernel_shap"]["data"]["shap_values"]
    np.testing.assert_allclose(got["data"]["shap_values"], want, atol=1e-6)
    bare = httpx.post(f"{server.url}/explain", json=body(ROWS), timeout=60)
    assert bare.status_code == 409 and "'iris-anchor' and " in bare.json()["error"], bare.text


def test_an_explainer_of_a_missing_model_answers_503_saying_so(server: Server) -> None:
    answer = httpx.post(
        f"{server.url}/v2/models/lost-anchor/infer", json=body([ROWS[0]]), timeout=60
    )
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert "explainer 'lost-anchor' explains model 'no-such-model' (its infer_uri)" in error
    # The server goes on: the same worker group explains the next request.
    assert explain(server, "iris-anchor", [ROWS[0]])["data"]["anchor"]


def test_bad_settings_fail_the_load_in_one_sentence(
    server: Server, repository: tuple[Path, dict]
) -> None:
    root, _ = repository
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["wrong-type"]["state"] == "FAILED"
    assert index["wrong-type"]["reason"] == (
        f"{root / 'wrong-type' / '..' / 'iris-anchor' / 'explainer'} holds a saved "
        "AnchorTabular, not the KernelShap parameters.extra.explainer_type 'kernel_shap' names"
    )
    assert index["unknown-type"]["state"] == "FAILED"
    assert index["unknown-type"]["reason"].startswith(
        "parameters.extra.explainer_type must be one of anchor_tabular, anchor_text"
    )
    assert index["lost-tree"]["state"] == "FAILED"
    assert index["lost-tree"]["reason"] == (
        f"parameters.extra.infer_uri './nothing.joblib': no model file "
        f"{root / 'lost-tree' / 'nothing.joblib'} (a white-box explainer holds its model: "
        "a joblib or pickle file)"
    )
    # Rows of two features, not four: the explainer's data has four (a 400 saying so).
    answer = httpx.post(f"{server.url}/v2/models/iris-kernel-shap/infer",
                        json=body([[1.0, 2.0]]), timeout=60)  # fmt: skip
    assert answer.status_code == 400 and set(answer.json()) == {"error"}, answer.text
    assert "model 'iris-kernel-shap' rejected input 'x'" in answer.json()["error"]
    # explain_parameters of a bad type: a 400 saying so.
    asked = body([ROWS[0]], explain_parameters=[0.8])
    answer = httpx.post(f"{server.url}/v2/models/iris-anchor/infer", json=asked, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].endswith("explain_parameters must be an object, not [0.8]")


def test_without_workers_the_explainers_call_the_classifier_in_the_server_process(
    alone: Server, repository: tuple[Path, dict]
) -> None:
    """An anchor (black-box: its calls reach 'iris' through the engine, in the server
    process), KernelShap over gRPC and TreeShap (white-box), and the classifier's own
    /explain: alibi's answers, as with workers."""
    _, expected = repository
    setosa = expected["anchors"][0]
    got = explain(alone, "iris-anchor", [ROWS[0]])
    assert_anchor(got, setosa, ROWS[0])
    assert got["data"]["anchor"] == setosa["data"]["anchor"]
    got = explain(alone, "iris", [ROWS[0]], path="explain")
    assert got["data"]["anchor"] == setosa["data"]["anchor"]
    shap = explain_grpc(alone, "iris-kernel-shap", ROWS)["data"]["shap_values"]
    np.testing.assert_allclose(shap, expected["kernel_shap"]["data"]["shap_values"], atol=1e-6)
    tree = explain(alone, "iris-tree-shap", ROWS)["data"]["shap_values"]
    np.testing.assert_allclose(tree, expected["tree_shap"]["data"]["shap_values"])
    index = {e["name"]: e for e in httpx.post(f"{alone.url}/v2/repository/index").json()}
    assert index["iris-anchor"]["state"] == index["iris"]["state"] == "READY"
    assert "starting worker group 'env-" in alone.output()
