"""alibi-detect detectors answered by MLServer itself and by inferpool, side by side
(issue 40): the same requests, the same answers, or each difference as it is (written down
in docs/runtimes/alibi-detect.md, "Beside MLServer").

MLServer 1.7.1 with mlserver-alibi-detect 1.6.1 (its newest release) and
alibi-detect[tensorflow] 0.13 runs from a virtualenv of its own
(mlserver-alibi-detect-requirements.txt; tox -e environments makes it before the tests,
else the first test does), in-process (no parallel workers), on a repository of its own
whose models load the detector folders test_alibi_detect.py's fixture saved, with the
same ``parameters.extra``; inferpool serves that fixture's repository from the packed
environment (``INFERPOOL_TEST_ALIBI_ENV``; without it these tests are skipped). The online
detectors' folders are copies: each server writes its own state into its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from inferpool.protocol.grpc_wire import response_from_message
from tests.environments import test_alibi_detect as detect
from tests.environments.side_by_side import both, mlserver_model, mlserver_python
from tests.environments.test_alibi_detect import (
    BINARY_STREAM,
    DRIFT,
    IMPLEMENTATION,
    REQUESTS,
    SERIES,
    body,
)
from tests.support import Server
from tests.support.alibi_headers import answer_with_headers, reply_with_headers
from tests.support.grpc import stub_for
from tests.support.mlserver import running_mlserver
from tests.support.same_outputs import assert_same_outputs

if not os.environ.get("INFERPOOL_TEST_ALIBI_ENV"):
    pytest.skip("INFERPOOL_TEST_ALIBI_ENV names no tarball: tox -e environments packs it",
                allow_module_level=True)  # fmt: skip

# The servers' set-up: MLServer's imports (TensorFlow) and inferpool's environment
# workers, on a loaded 2-core host.
pytestmark = pytest.mark.timeout(600)

# test_alibi_detect.py's fixtures, anew for this module: its repository of saved
# detectors (and what they answer in the environment), and inferpool serving it.
tarball, repository, server = detect.tarball, detect.repository, detect.server


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environments' cache test_alibi_explain.py's fixture uses too: an environment
    (1.3 GB) that one unpacked, in this pytest process, the other finds there."""
    return tmp_path_factory.getbasetemp() / "environments"


# Online detectors write their state into their folder: MLServer's are copies.
COPIED = ("online", "fet-online")
FAILING = ("not-a-detector",)
# Drawn anew by each load of an online detector (its thresholds, simulated), and
# is_drift, which compares with them: compared by name, datatype and shape.
SIMULATED = ("threshold", "is_drift")


@pytest.fixture(scope="module")
def mlserver(
    repository: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MLServer]:
    """MLServer on a repository of its own, holding inferpool's detectors with inferpool's
    settings (but no environment_tarball)."""
    root, _ = repository
    theirs = tmp_path_factory.mktemp("mlserver-repo")
    for settings in sorted(root.glob("*/model-settings.json")):
        document = json.loads(settings.read_text())
        parameters = document["parameters"]
        # no-environment (MLServer's virtualenv holds alibi-detect), and not-a-detector:
        # a model failing its load at start-up stops MLServer (test_load_errors).
        if "environment_tarball" not in parameters or document["name"] in FAILING:
            continue
        uri = (settings.parent / parameters["uri"]).resolve()
        if document["name"] in COPIED:
            uri = shutil.copytree(uri, theirs / "copies" / document["name"])
        mlserver_model(theirs / document["name"], IMPLEMENTATION, str(uri), parameters["extra"])
    python = mlserver_python("alibi-detect")
    with running_mlserver(theirs, python=python) as (url, address):
        yield MLServer(url, address, theirs)


class MLServer(NamedTuple):
    url: str  # REST
    address: str  # gRPC
    root: Path  # its repository


def answers(server: Server, mlserver: MLServer, name: str, data: list,
            datatype: str = "FP32") -> tuple[dict, dict]:  # fmt: skip
    """A request answered 200 by both: inferpool's answer and MLServer's, parsed."""
    ours, theirs = both(server.url, mlserver.url, name, body(data, datatype))
    assert ours.status_code == 200, ours.text
    return ours.json(), theirs.json()


def assert_as_mlserver(ours: dict, theirs: dict, skip: tuple = ()) -> None:
    """inferpool's answer against MLServer's, with the differences of
    docs/runtimes/alibi-detect.md: the same outputs, datatypes and values (NaN: MLServer's
    null) and shapes (a number per predict call: ``[1, 1]``), but MLServer also answers
    each key whose value is None (a BYTES output of nulls); the parameters are the
    detector's meta, MLServer's without the keys whose value is None (the alibi headers:
    test_the_alibi_headers_are_http_headers_of_both). ``skip``: outputs compared by
    name, datatype and shape."""
    nulls = [o for o in theirs["outputs"] if o["name"] not in {x["name"] for x in ours["outputs"]}]
    assert all(o["datatype"] == "BYTES" and set(o["data"]) == {None} for o in nulls), nulls
    kept = [o for o in theirs["outputs"] if o not in nulls]
    assert_same_outputs(ours["outputs"], kept, skip)
    meta = {k: v for k, v in ours["parameters"].items() if v is not None}
    assert meta == theirs["parameters"]
    assert ours["model_name"] == theirs["model_name"]
    assert ours.get("model_version") == theirs.get("model_version") is None


def test_drift_detectors_answer_as_mlservers_runtime_does(
    server: Server, mlserver: MLServer
) -> None:
    """KSDrift (with and without predict_parameters), ChiSquareDrift, TabularDrift,
    FETDrift and CVMDrift, each with both of its requests."""
    ours, theirs = answers(server, mlserver, "ksdrift", REQUESTS["same"])
    assert_as_mlserver(ours, theirs)
    # else the comparison proves little: a number per call; and a null output of MLServer's
    assert {o["name"]: o["shape"] for o in ours["outputs"]}["is_drift"] == [1, 1]
    ours, theirs = answers(server, mlserver, "ksdrift-feature", REQUESTS["shifted"])
    assert_as_mlserver(ours, theirs)
    assert {o["name"]: o["data"] for o in theirs["outputs"]}["distance"] == [None]
    assert "distance" not in {o["name"] for o in ours["outputs"]}
    assert_as_mlserver(*answers(server, mlserver, "ksdrift", REQUESTS["shifted"]))
    for name in ("chisquare", "tabular", "fet", "cvm"):
        for step in ("same", "shifted"):
            data = DRIFT[name]
            assert_as_mlserver(*answers(server, mlserver, name, data[step], data["datatype"]))


def test_the_alibi_headers_are_http_headers_of_both(server: Server, mlserver: MLServer) -> None:
    """MLServer moves a response's ``parameters.headers`` to its HTTP headers: so does
    inferpool for the alibi runtimes (neither leaves them in the JSON)."""
    ours, theirs = both(server.url, mlserver.url, "ksdrift", body(REQUESTS["same"]))
    want = {"x-seldon-alibi-type": "drift", "x-seldon-alibi-method": "ks"}
    assert answer_with_headers(ours)["alibi_headers"] == want
    assert answer_with_headers(theirs)["alibi_headers"] == want
    # The CloudEvents headers MLServer adds to every answer: inferpool's too.
    cloudevent = ("ce-specversion", "ce-source", "ce-type", "ce-modelid", "ce-endpoint")
    assert {k: ours.headers[k] for k in cloudevent} == {k: theirs.headers[k] for k in cloudevent}


def test_classifier_drift_is_a_500_of_mlservers(server: Server, mlserver: MLServer) -> None:
    """ClassifierDrift (scikit-learn's backend) answers its trained model too, which no
    tensor holds: inferpool leaves it out; MLServer cannot encode it (a 500, its
    traceback as the body)."""
    ours, theirs = (
        httpx.post(f"{url}/v2/models/classifier/infer", json=body(DRIFT["classifier"]["same"]),
                   timeout=120)
        for url in (server.url, mlserver.url)
    )  # fmt: skip
    assert ours.status_code == 200, ours.text
    assert "model" not in {o["name"] for o in ours.json()["outputs"]}
    assert theirs.status_code == 500
    assert theirs.text.startswith("Traceback"), theirs.text[:300]


def test_stateful_detectors_answer_a_sequence_as_mlservers_runtime_does(
    server: Server, mlserver: MLServer
) -> None:
    """TabularDrift updating its reference data and Mahalanobis updating its mean and
    covariance: each request is answered by the detector the one before updated."""
    for step in ("same", "shifted"):
        data = DRIFT["tabular"][step]
        assert_as_mlserver(*answers(server, mlserver, "tabular-updated", data))
    for data in (REQUESTS["same"][:10], REQUESTS["shifted"][:10]):
        assert_as_mlserver(*answers(server, mlserver, "mahalanobis", data))


def test_batch_size_waits_and_joins_as_mlservers_runtime_does(
    server: Server, mlserver: MLServer
) -> None:
    ours, theirs = answers(server, mlserver, "ksdrift-batched", REQUESTS["same"])
    assert ours["outputs"] == theirs["outputs"] == []
    assert_as_mlserver(*answers(server, mlserver, "ksdrift-batched", REQUESTS["shifted"]))


def test_online_detectors_step_through_rows_as_mlservers_runtime_does(
    server: Server, mlserver: MLServer
) -> None:
    """CVMDriftOnline (three rows, three steps; then one) and FETDriftOnline (six rows):
    each server's detector simulated its own thresholds when it loaded."""
    rows = [row[:2] for row in REQUESTS["same"][:3]]
    for data in (rows, [REQUESTS["shifted"][0][:2]]):
        assert_as_mlserver(*answers(server, mlserver, "online", data), skip=SIMULATED)
    ours, theirs = answers(server, mlserver, "fet-online", BINARY_STREAM, "INT64")
    assert_as_mlserver(ours, theirs, skip=SIMULATED)
    # The statistic is NaN until the window fills: MLServer's null, inferpool's NaN.
    assert {o["name"]: o["data"] for o in theirs["outputs"]}["test_stat"][0] is None
    assert math.isnan({o["name"]: o["data"] for o in ours["outputs"]}["test_stat"][0])


def test_outlier_detectors_answer_as_mlservers_runtime_does(
    server: Server, mlserver: MLServer
) -> None:
    """IForest (with and without its instance scores) and SpectralResidual."""
    for name in ("iforest", "iforest-no-score"):
        for data in REQUESTS.values():
            assert_as_mlserver(*answers(server, mlserver, name, data))
    for name in ("spectral", "spectral-no-score"):
        for data in SERIES.values():
            assert_as_mlserver(*answers(server, mlserver, name, data))


def test_predict_parameters_the_detector_does_not_take(server: Server, mlserver: MLServer) -> None:
    """IForest.predict takes no outlier_type: inferpool fails the load saying so (a 503 at
    each request); MLServer loads it and fails each request (a 500, its traceback)."""
    ours, theirs = (
        httpx.post(f"{url}/v2/models/iforest-outlier-type/infer", json=body(REQUESTS["same"]),
                   timeout=120)
        for url in (server.url, mlserver.url)
    )  # fmt: skip
    assert ours.status_code == 503
    assert "does not fit IForest.predict" in ours.json()["error"]
    assert theirs.status_code == 500
    assert "unexpected keyword argument 'outlier_type'" in theirs.text


def grpc_answer(stub: GRPCInferenceServiceStub, name: str, data: list) -> dict:
    """A ModelInfer's answer as REST's JSON, to compare."""
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[len(data), len(data[0])])
    tensor.contents.fp32_contents.extend(value for row in data for value in row)
    reply, headers = reply_with_headers(stub, request, 60)
    decoded = response_from_message(reply)
    outputs = [
        {"name": o.name, "datatype": o.datatype, "shape": list(o.shape),
         "data": np.asarray(o.data).ravel().tolist()}
        for o in decoded.outputs
    ]  # fmt: skip
    parameters = dict(decoded.parameters or {})
    return {"model_name": name, "model_version": None, "outputs": outputs,
            "parameters": parameters,
            "alibi_headers": headers}  # fmt: skip


def test_grpc_answers_as_mlservers_does_or_where_mlservers_fails(
    server: Server, mlserver: MLServer
) -> None:
    """Over gRPC the same answers, the alibi headers as trailing metadata of both;
    MLServer cannot send an output of nulls there: a detector answering a None
    (IForest's feature_score) is an INTERNAL error of MLServer's ("expected bytes,
    NoneType found"), inferpool leaves the key out."""
    with stub_for(server) as ours, grpc.insecure_channel(mlserver.address) as channel:
        theirs = GRPCInferenceServiceStub(channel)
        one = grpc_answer(ours, "ksdrift", REQUESTS["shifted"])
        other = grpc_answer(theirs, "ksdrift", REQUESTS["shifted"])
        assert (
            one.pop("alibi_headers")
            == other.pop("alibi_headers")
            == {
                "x-seldon-alibi-type": "drift",
                "x-seldon-alibi-method": "ks",
            }
        )
        assert_as_mlserver(one, other)
        answer = grpc_answer(ours, "iforest", REQUESTS["shifted"])
        assert [o["name"] for o in answer["outputs"]] == ["instance_score", "is_outlier"]
        with pytest.raises(grpc.RpcError) as failed:
            grpc_answer(theirs, "iforest", REQUESTS["shifted"])
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert failed.value.details() == "expected bytes, NoneType found"


def test_rows_of_another_width_are_a_400_of_both(server: Server, mlserver: MLServer) -> None:
    """Rows of two features against a detector of four: alibi-detect's message, each
    server's words around it."""
    ours, theirs = both(server.url, mlserver.url, "ksdrift", body([[1.0, 2.0]]))
    reason = "index 2 is out of bounds for axis 1 with size 2"
    assert ours.status_code == 400
    assert ours.json() == {"error": f"model 'ksdrift' rejected input 'x': {reason}"}
    assert theirs.json() == {"error": f"Invalid predict parameters for model ksdrift: {reason}"}


def test_a_folder_that_holds_no_detector(
    server: Server, mlserver: MLServer, repository: tuple[Path, dict]
) -> None:
    """Loaded by the repository API once MLServer runs (at its start-up, a model failing
    its load stops it): inferpool's FAILED model beside MLServer's 400."""
    root, _ = repository
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["not-a-detector"]["state"] == "FAILED"
    assert "is not an alibi-detect detector folder" in index["not-a-detector"]["reason"]
    folder = mlserver.root / "not-a-detector"
    mlserver_model(folder, IMPLEMENTATION, str(root / "not-a-detector"), {})
    theirs = httpx.post(f"{mlserver.url}/v2/repository/models/not-a-detector/load", timeout=120)
    reason = (
        "Invalid configuration for model not-a-detector: Neither meta.dill, meta.pickle or "
        f"config.toml exist in {root / 'not-a-detector'}."
    )
    assert (theirs.status_code, theirs.json()) == (400, {"error": reason})
