"""alibi-detect detectors served from a per-model environment (issue 40, point 5).

alibi-detect 0.13 requires numpy<2, which the server's environment cannot hold. tox's
``environments`` environment packs one with ``inferpool env pack`` from
``alibi-requirements.txt`` (as users do, docs/runtimes/alibi-detect.md; it holds alibi
too, for test_alibi_explain.py) and names the tarball in ``INFERPOOL_TEST_ALIBI_ENV``.
The test unpacks it into the cache the server then uses (so it is unpacked once), saves
detectors with that environment's python (``save_detector``), and computes there what
the detectors answer; the server (two workers of that environment) must answer the same
over REST and gRPC, with MLServer's settings (``predict_parameters``, ``batch_size``)
and its response shape. Detectors: KSDrift, ChiSquareDrift, TabularDrift (also updating
its reference data), FETDrift, CVMDrift, ClassifierDrift (scikit-learn's backend), the
online CVMDriftOnline and FETDriftOnline, and the outlier detectors IForest,
Mahalanobis (which keeps state) and SpectralResidual (time series), none of which needs
TensorFlow or PyTorch to run (alibi_detect_detectors.py saves them). With ``--workers 0``
the detectors still run in their environment's workers (``environment_workers.py``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from inferpool.engine.environments.unpack import prepare
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.grpc_wire import response_from_message
from tests.environments import named_by, serving_settled
from tests.support import Server
from tests.support.alibi_headers import answer_with_headers, reply_with_headers
from tests.support.grpc import stub_for

# The fixture unpacks a 1.3 GB environment, fits and saves models with its python and
# starts a server whose environment workers import alibi: in ci19 (tox -e alibi-deep
# unpacking its own beside it) the explainers' setup ran past pytest's default 300 s.
pytestmark = pytest.mark.timeout(600)

IMPLEMENTATION = "mlserver_alibi_detect.AlibiDetectRuntime"

# Run by the environment's python: saves the detectors and prints their own answers.
SCRIPT = Path(__file__).with_name("alibi_detect_detectors.py")


def rows(seed: int, shift: float) -> list[list[float]]:
    generator = np.random.default_rng(seed)
    return (generator.normal(size=(50, 4)) + shift).astype(np.float32).tolist()


REQUESTS = {"same": rows(1, 0.0), "shifted": rows(2, 0.7)}


def series(seed: int, spikes: list[int]) -> list[float]:
    """200 steps of a noisy sine wave (period 50), with a jump of 3 at ``spikes``."""
    values = np.sin(2 * np.pi * np.arange(200) / 50)
    values += 0.1 * np.random.default_rng(seed).normal(size=200)
    values[spikes] += 3
    return values.astype(np.float32).tolist()


# SpectralResidual's requests: one time series each.
SERIES = {"calm": series(11, []), "spiked": series(12, [50, 120])}


def categories(seed: int, frequencies: list[float], features: int = 3) -> np.ndarray:
    generator = np.random.default_rng(seed)
    return generator.choice(len(frequencies), size=(50, features), p=frequencies)


def mixed(seed: int, frequencies: list[float], shift: float) -> list[list[float]]:
    """A category (0 to 3) beside two continuous features, as one FP32 tensor."""
    continuous = np.random.default_rng(seed).normal(size=(50, 2)) + shift
    columns = [categories(seed + 100, frequencies, 1), continuous]
    return np.column_stack(columns).astype(np.float32).tolist()


FREQUENCIES = [0.4, 0.3, 0.2, 0.1]  # the reference data's (alibi_detect_detectors.py)
# The other drift detectors' requests (one model each), with the data each tests:
# categories (ChiSquareDrift), a category beside continuous features (TabularDrift), 0s and
# 1s (FETDrift), continuous features (CVMDrift, ClassifierDrift); like the reference data,
# then not.
DRIFT = {
    "chisquare": {"datatype": "INT64", "same": categories(3, FREQUENCIES).tolist(),
                  "shifted": categories(4, FREQUENCIES[::-1]).tolist()},
    "tabular": {"datatype": "FP32", "same": mixed(5, FREQUENCIES, 0.0),
                "shifted": mixed(6, FREQUENCIES[::-1], 0.7)},
    "fet": {"datatype": "INT64", "same": categories(7, [0.7, 0.3]).tolist(),
            "shifted": categories(8, [0.4, 0.6]).tolist()},
    "cvm": {"datatype": "FP32", **REQUESTS},
    "classifier": {"datatype": "FP32", **REQUESTS},
}  # fmt: skip
# FETDriftOnline's request: six steps of two 0-or-1 features (its window: four steps).
BINARY_STREAM = categories(9, [0.3, 0.7], features=2)[:6].tolist()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("environments")


@pytest.fixture(scope="module")
def tarball() -> Path:
    return named_by("INFERPOOL_TEST_ALIBI_ENV", "tarball")


def model(
    folder: Path, tarball: Path, uri: str = "../ksdrift/detector", **settings: object
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    extra = settings.pop("extra", {})
    document = {
        "name": folder.name,
        "implementation": IMPLEMENTATION,
        "parameters": {"uri": uri, "environment_tarball": str(tarball), "extra": extra},
        **settings,
    }  # fmt: skip
    (folder / "model-settings.json").write_text(json.dumps(document))


@pytest.fixture(scope="module")
def repository(
    tmp_path_factory: pytest.TempPathFactory, tarball: Path, cache: Path
) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("repo")
    environment = prepare(tarball, cache)  # the server finds it unpacked, under the same key
    requests = {**REQUESTS, "series": SERIES, "drift": DRIFT, "binary_stream": BINARY_STREAM}
    done = subprocess.run(
        [environment.python, str(SCRIPT), str(root), json.dumps(requests)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert expected["numpy"].startswith("1."), expected["numpy"]
    model(root / "ksdrift", tarball)
    model(
        root / "ksdrift-feature", tarball, extra={"predict_parameters": {"return_distance": False}}
    )
    model(root / "ksdrift-batched", tarball, extra={"batch_size": 2}, replicas=1)
    # One replica: one detector sees the whole stream (docs/runtimes/alibi-detect.md).
    model(root / "online", tarball, "./detector", extra={"state_save_freq": 3}, replicas=1)
    model(root / "fet-online", tarball, "./detector", replicas=1)
    # Outlier detectors: IForest on every worker (two replicas, which must agree);
    # Mahalanobis, whose running mean and covariance are its replica's, on one.
    model(root / "iforest", tarball, "./detector")
    model(
        root / "iforest-no-score", tarball, "../iforest/detector", replicas=1,
        extra={"predict_parameters": {"return_instance_score": False}},
    )  # fmt: skip
    model(
        root / "iforest-outlier-type", tarball, "../iforest/detector", replicas=1,
        extra={"predict_parameters": {"outlier_type": "feature"}},
    )  # fmt: skip
    model(root / "mahalanobis", tarball, "./detector", replicas=1)
    # SpectralResidual keeps no state: two replicas, which must agree.
    model(root / "spectral", tarball, "./detector")
    model(
        root / "spectral-no-score", tarball, "../spectral/detector", replicas=1,
        extra={"predict_parameters": {"return_instance_score": False}},
    )  # fmt: skip
    # The other drift detectors; TabularDrift updating its reference data on one replica.
    for name in DRIFT:
        model(root / name, tarball, "./detector", replicas=1)
    model(root / "tabular-updated", tarball, "./detector", replicas=1)
    # Load errors: a folder save_detector did not write, and no environment at all.
    model(root / "not-a-detector", tarball)
    settings = json.loads((root / "not-a-detector" / "model-settings.json").read_text())
    settings["parameters"]["uri"] = "."
    (root / "not-a-detector" / "model-settings.json").write_text(json.dumps(settings))
    (root / "no-environment").mkdir()
    (root / "no-environment" / "model-settings.json").write_text(json.dumps({
        "name": "no-environment", "implementation": IMPLEMENTATION,
        "parameters": {"uri": "../ksdrift/detector"},
    }))  # fmt: skip
    return root, expected


@pytest.fixture(scope="module")
def server(repository: tuple[Path, dict], cache: Path) -> Iterator[Server]:
    yield from serving_settled(repository[0], cache, timeout=420)


@pytest.fixture(scope="module")
def alone(repository: tuple[Path, dict], cache: Path) -> Iterator[Server]:
    """``--workers 0``: the detectors in workers of their environment, beside a server
    process that holds no model."""
    yield from serving_settled(repository[0], cache, timeout=420, workers=0)


DTYPES = {"FP32": np.float32, "INT64": np.int64}


def body(data: list, datatype: str = "FP32") -> dict:
    values = np.asarray(data, dtype=DTYPES[datatype])
    tensor = {"name": "x", "datatype": datatype, "shape": list(values.shape)}
    return {"inputs": [{**tensor, "data": values.ravel().tolist()}]}


def infer(server: Server, name: str, data: list, datatype: str = "FP32") -> dict:
    request = body(data, datatype)
    return answer_with_headers(
        httpx.post(f"{server.url}/v2/models/{name}/infer", json=request, timeout=60)
    )


def assert_detector_data(outputs: list[dict], data: dict) -> None:
    """The outputs are the detector's ``data``: one per key (None left out), each value
    as a list of one (a number as ``[1, 1]``: MLServer's shapes), equal to the detector's
    own."""
    assert [o["name"] for o in outputs] == [k for k, v in data.items() if v is not None]
    assert_stream(outputs, [data])


def assert_stream(outputs: list[dict], steps: list[dict], simulated: tuple = ()) -> None:
    """The outputs hold one value per step (predict call), each equal to the detector's
    (a number per step: a column, ``[steps, 1]``, as MLServer answers it); those
    ``simulated`` anew by each load (an online detector's thresholds) of its shape."""
    for output in outputs:
        values = [step[output["name"]] for step in steps]
        shape = list(np.shape(values))
        shape = [*shape, 1] if len(shape) == 1 else shape
        assert output["shape"] == shape, output
        if output["name"] in simulated:
            continue
        want = np.asarray(values, dtype=np.float64).reshape(shape)
        # NaN (an online detector's statistic before its window fills) is JSON's null.
        got = np.asarray(output["data"], dtype=np.float64).reshape(shape)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_drift_detector_answers_as_it_does_in_its_environment(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    for name in ("same", "shifted"):
        # Two replicas (one per worker of the environment): each answers the same.
        for _ in range(4):
            answer = infer(server, "ksdrift", REQUESTS[name])
            assert_detector_data(answer["outputs"], expected["answers"][name])
    assert expected["answers"]["shifted"]["is_drift"] == 1  # else the test proves little
    assert expected["answers"]["same"]["is_drift"] == 0
    assert answer["parameters"]["name"] == "KSDrift"
    assert answer["parameters"]["version"] == expected["meta"]["version"]
    assert answer["alibi_headers"] == {
        "x-seldon-alibi-type": "drift",
        "x-seldon-alibi-method": "ks",
    }
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["is_drift"]["datatype"] == "INT64" and outputs["p_val"]["datatype"] == "FP32"
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["ksdrift"]["state"] == "READY"


def infer_grpc(server: Server, name: str, data: list) -> tuple[list[dict], Any, dict]:
    """The outputs (as REST's, to compare), the parameters and the alibi headers of a gRPC
    ModelInfer (FP32)."""
    rows = np.asarray(data, dtype=np.float32)
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=rows.shape)
    tensor.contents.fp32_contents.extend(rows.ravel().tolist())
    with stub_for(server) as stub:
        reply, headers = reply_with_headers(stub, request, 60)
    decoded = response_from_message(reply)
    outputs = [
        {"name": o.name, "shape": list(o.shape), "data": np.asarray(o.data).ravel().tolist()}
        for o in decoded.outputs
    ]
    return outputs, reply.parameters, headers


def test_grpc_answers_the_same(server: Server, repository: tuple[Path, dict]) -> None:
    _, expected = repository
    outputs, parameters, headers = infer_grpc(server, "ksdrift", REQUESTS["shifted"])
    assert_detector_data(outputs, expected["answers"]["shifted"])
    assert parameters["name"].string_param == "KSDrift"
    assert headers == {"x-seldon-alibi-type": "drift", "x-seldon-alibi-method": "ks"}


def test_predict_parameters_reach_the_detector(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    answer = infer(server, "ksdrift-feature", REQUESTS["shifted"])
    assert "distance" not in {o["name"] for o in answer["outputs"]}
    assert_detector_data(answer["outputs"], expected["no_distance"])


def test_batch_size_runs_the_detector_once_that_many_requests_arrived(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    first = infer(server, "ksdrift-batched", REQUESTS["same"])
    assert first["outputs"] == []  # waiting, as MLServer answers
    second = infer(server, "ksdrift-batched", REQUESTS["shifted"])
    assert_detector_data(second["outputs"], expected["joined"])


def test_rows_that_do_not_join_are_a_400_and_the_batch_starts_again(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    assert infer(server, "ksdrift-batched", [[1.0, 2.0]])["outputs"] == []  # 2 features, not 4
    url = f"{server.url}/v2/models/ksdrift-batched/infer"
    refused = httpx.post(url, json=body(REQUESTS["same"]), timeout=60)
    assert refused.status_code == 400 and set(refused.json()) == {"error"}, refused.text
    assert infer(server, "ksdrift-batched", REQUESTS["same"])["outputs"] == []
    joined = infer(server, "ksdrift-batched", REQUESTS["shifted"])
    assert_detector_data(joined["outputs"], expected["joined"])


SIMULATED = ("threshold", "is_drift")


def test_an_online_detector_keeps_its_state_between_requests(
    server: Server, repository: tuple[Path, dict]
) -> None:
    root, expected = repository
    first, second = expected["online"]
    assert not (root / "online" / "detector" / "state").exists()
    # Three rows: three steps of the detector (time 1, 2, 3), answered side by side.
    answer = infer(server, "online", [row[:2] for row in REQUESTS["same"][:3]])
    names = [k for k, v in first[0].items() if v is not None]
    assert [o["name"] for o in answer["outputs"]] == names
    # CVMDriftOnline draws its thresholds by simulation when it loads (they are not saved):
    # they, and is_drift which compares with them, are this load's.
    assert_stream(answer["outputs"], first, simulated=SIMULATED)
    assert answer["parameters"]["online"] is True
    # state_save_freq 3: the state was written at time 3, into the detector's folder.
    assert (root / "online" / "detector" / "state").is_dir()
    # Then one row: the fourth step, which the detector's state carries on to.
    answer = infer(server, "online", [REQUESTS["shifted"][0][:2]])
    assert_stream(answer["outputs"], second, simulated=SIMULATED)
    assert {o["name"]: o["data"] for o in answer["outputs"]}["time"] == [4]


def test_fet_drift_online_steps_through_a_requests_rows(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """FETDriftOnline (numba, 0s and 1s): six rows are six steps; once its window of four
    has filled, its test statistic is the detector's own."""
    _, expected = repository
    steps = expected["fet_online"]
    assert not np.isnan(steps[-1]["test_stat"]).any()  # else the test proves little
    answer = infer(server, "fet-online", BINARY_STREAM, "INT64")
    assert [o["name"] for o in answer["outputs"]] == [
        k for k, v in steps[0].items() if v is not None
    ]
    assert_stream(answer["outputs"], steps, simulated=SIMULATED)
    assert {o["name"]: o["data"] for o in answer["outputs"]}["time"] == [1, 2, 3, 4, 5, 6]
    assert answer["alibi_headers"]["x-seldon-alibi-method"] == "fet_online"


def test_an_iforest_answers_as_it_does_in_its_environment(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """IForest, saved in alibi-detect's legacy format, loads without TensorFlow; its
    answer is its ``data`` (``feature_score``, None, left out), over REST and gRPC."""
    _, expected = repository
    outliers = expected["outliers"]
    flagged = outliers["iforest"]["shifted"]["is_outlier"]
    assert 0 < sum(flagged) < len(flagged)  # else the test proves little
    for name in ("same", "shifted"):
        for _ in range(4):  # two replicas: each answers the same
            answer = infer(server, "iforest", REQUESTS[name])
            assert_detector_data(answer["outputs"], outliers["iforest"][name])
    assert [o["name"] for o in answer["outputs"]] == ["instance_score", "is_outlier"]
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["is_outlier"]["datatype"] == "INT64"
    assert outputs["instance_score"]["datatype"] == "FP64"
    assert outputs["is_outlier"]["shape"] == [1, len(REQUESTS["shifted"])]
    meta = outliers["iforest_meta"]
    assert {k: answer["parameters"][k] for k in meta} == meta
    assert answer["alibi_headers"] == {
        "x-seldon-alibi-type": "outlier",
        "x-seldon-alibi-method": "isolationforest",
    }
    outputs, parameters, headers = infer_grpc(server, "iforest", REQUESTS["shifted"])
    assert_detector_data(outputs, outliers["iforest"]["shifted"])
    assert parameters["name"].string_param == "IForest"
    assert headers["x-seldon-alibi-type"] == "outlier"


def test_outlier_predict_parameters_reach_the_detector_or_fail_its_load(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    answer = infer(server, "iforest-no-score", REQUESTS["shifted"])
    assert [o["name"] for o in answer["outputs"]] == ["is_outlier"]
    assert_detector_data(answer["outputs"], expected["outliers"]["no_score"])
    # alibi-detect 0.13's IForest.predict takes no outlier_type: every request would fail.
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["iforest-outlier-type"]["state"] == "FAILED"
    assert index["iforest-outlier-type"]["reason"] == (
        "parameters.extra.predict_parameters does not fit IForest.predict (got an "
        "unexpected keyword argument 'outlier_type'; it takes return_instance_score)"
    )


def test_mahalanobis_updates_its_state_at_each_request(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """Each predict moves Mahalanobis' mean and covariance: the second request is answered
    by the detector the first one updated, whichever protocol each came by (one replica)."""
    _, expected = repository
    first, second = expected["outliers"]["mahalanobis"]
    fresh = expected["outliers"]["mahalanobis_fresh"]
    # else the test proves little: a detector that forgot the first request answers fresh.
    assert not np.allclose(second["instance_score"], fresh["instance_score"], rtol=1e-6)
    answer = infer(server, "mahalanobis", REQUESTS["same"][:10])
    assert_detector_data(answer["outputs"], first)
    # Not online as MLServer counts it (no save_state): ten rows are one predict call.
    assert answer["outputs"][0]["shape"] == [1, 10]
    assert answer["parameters"]["online"] is True  # its meta says so
    assert answer["alibi_headers"]["x-seldon-alibi-method"] == "mahalanobis"
    outputs, _, _ = infer_grpc(server, "mahalanobis", REQUESTS["shifted"][:10])
    assert_detector_data(outputs, second)
    # Its placement says the state is its replica's (docs/runtimes/alibi-detect.md).
    assert "predicted by Mahalanobis of alibi-detect (keeps state: each replica its own)" in (
        server.output()
    )


def test_spectral_residual_scores_a_time_series_as_it_does_in_its_environment(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """SpectralResidual, saved in alibi-detect's legacy format, loads without TensorFlow;
    a request is one time series (shape [steps] or [steps, 1]), scored step by step."""
    _, expected = repository
    spectral = expected["spectral"]
    flagged = np.flatnonzero(spectral["answers"]["spiked"]["is_outlier"]).tolist()
    assert {50, 120} <= set(flagged) and len(flagged) < 10, flagged  # else it proves little
    for name in ("calm", "spiked"):
        for _ in range(4):  # two replicas: each answers the same
            answer = infer(server, "spectral", SERIES[name])
            assert_detector_data(answer["outputs"], spectral["answers"][name])
    assert [o["name"] for o in answer["outputs"]] == ["instance_score", "is_outlier"]
    assert [o["shape"] for o in answer["outputs"]] == [[1, 200], [1, 200]]
    assert {k: answer["parameters"][k] for k in spectral["meta"]} == spectral["meta"]
    assert answer["alibi_headers"] == {
        "x-seldon-alibi-type": "outlier",
        "x-seldon-alibi-method": "sr",
    }
    column = infer(server, "spectral", [[value] for value in SERIES["spiked"]])
    assert_detector_data(column["outputs"], spectral["answers"]["spiked"])
    outputs, parameters, _ = infer_grpc(server, "spectral", SERIES["spiked"])
    assert_detector_data(outputs, spectral["answers"]["spiked"])
    assert parameters["name"].string_param == "SpectralResidual"
    # Its meta says online (it scores a stream), but it keeps no state between requests.
    assert "predicted by SpectralResidual of alibi-detect" in server.output()
    assert "SpectralResidual of alibi-detect (keeps state" not in server.output()


def test_spectral_residual_takes_its_predict_parameters_and_refuses_other_series(
    server: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    answer = infer(server, "spectral-no-score", SERIES["spiked"])
    assert [o["name"] for o in answer["outputs"]] == ["is_outlier"]
    assert_detector_data(answer["outputs"], expected["spectral"]["no_score"])
    url = f"{server.url}/v2/models/spectral/infer"
    # No longer than its local window (20 steps), or several series side by side.
    short = httpx.post(url, json=body(SERIES["calm"][:20]), timeout=60)
    assert short.status_code == 400, short.text
    assert "greater than the local window" in short.json()["error"]
    two = httpx.post(url, json=body([SERIES["calm"], SERIES["spiked"]]), timeout=60)
    assert two.status_code == 400, two.text
    assert "Only uni-variate time series allowed" in two.json()["error"]


# The names their meta says (ClassifierDrift's: its backend's detector's).
METHODS = {"chisquare": "ChiSquareDrift", "tabular": "TabularDrift", "fet": "FETDrift",
           "cvm": "CVMDrift", "classifier": "ClassifierDriftSklearn"}  # fmt: skip


def test_the_other_numpy_drift_detectors_answer_as_they_do_in_their_environment(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """ChiSquareDrift, TabularDrift, FETDrift, CVMDrift and ClassifierDrift (scikit-learn's
    backend), saved as config.toml, each with its kind of data (INT64 categories and 0s and
    1s, FP32 otherwise)."""
    _, expected = repository
    for name, data in DRIFT.items():
        same, shifted = expected["drift"][name]
        assert (same["is_drift"], shifted["is_drift"]) == (0, 1), name  # else it proves little
        for step, answers in (("same", same), ("shifted", shifted)):
            answer = infer(server, name, data[step], data["datatype"])
            assert_detector_data(answer["outputs"], answers)
        assert answer["parameters"]["name"] == METHODS[name]
        assert answer["alibi_headers"] == {
            "x-seldon-alibi-type": "drift",
            "x-seldon-alibi-method": name,
        }
    # ClassifierDrift answers its out-of-fold probabilities and rows too, and its trained
    # model, which no tensor holds: left out.
    assert "model" in expected["drift"]["classifier_keys"]
    names = [o["name"] for o in answer["outputs"]]
    assert names == [key for key in expected["drift"]["classifier_keys"] if key != "model"]
    assert {o["name"]: o["shape"] for o in answer["outputs"]}["x_ref_oof"] == [1, 200, 4]


def test_a_drift_detector_updating_its_reference_data_keeps_it_in_its_replica(
    server: Server, repository: tuple[Path, dict]
) -> None:
    """TabularDrift with ``update_x_ref``: each predict adds the rows it tests to its
    reference data, so the second request is tested against the first one's rows too."""
    _, expected = repository
    first, second = expected["drift"]["tabular-updated"]
    fresh = expected["drift"]["tabular"][1]
    # else the test proves little: a detector that forgot the first request answers fresh.
    assert not np.allclose(second["p_val"], fresh["p_val"], rtol=1e-6)
    answer = infer(server, "tabular-updated", DRIFT["tabular"]["same"])
    assert_detector_data(answer["outputs"], first)
    answer = infer(server, "tabular-updated", DRIFT["tabular"]["shifted"])
    assert_detector_data(answer["outputs"], second)
    assert "predicted by TabularDrift of alibi-detect (keeps state: each replica its own)" in (
        server.output()
    )


def test_load_errors_are_one_sentence(server: Server, repository: tuple[Path, dict]) -> None:
    root, _ = repository
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["not-a-detector"]["state"] == "FAILED"
    assert index["not-a-detector"]["reason"] == (
        f"{root / 'not-a-detector'} is not an alibi-detect detector folder (no config.toml or "
        "meta.dill: write one with alibi_detect.saving.save_detector)"
    )
    assert index["no-environment"]["state"] == "FAILED"
    assert index["no-environment"]["reason"] == (
        "cannot place 1 replica of 'no-environment': 2 workers; 2 lack 'alibi_detect' (run "
        "the model in an environment holding alibi-detect: docs/runtimes/alibi-detect.md)"
    )
    answer = httpx.post(f"{server.url}/v2/models/ksdrift/infer", json=body([[1.0, 2.0]]))
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error"}


def test_data_deeper_than_numpy_1_holds_is_a_400_saying_so(server: Server) -> None:
    """The environment's workers decode requests with numpy 1, whose arrays hold 32
    dimensions (numpy 2: 64): deeper data is called what it is, not "ragged"."""
    data: object = [1.0]
    for _ in range(39):
        data = [data]
    request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": data}]}
    answer = httpx.post(f"{server.url}/v2/models/ksdrift/infer", json=request, timeout=60)
    assert answer.status_code == 400, answer.text
    assert "nested deeper than the 32 dimensions numpy 1." in answer.json()["error"]


def test_without_workers_the_detectors_answer_from_their_environments_workers(
    alone: Server, repository: tuple[Path, dict]
) -> None:
    _, expected = repository
    for name in ("same", "shifted"):
        answer = infer(alone, "ksdrift", REQUESTS[name])
        assert_detector_data(answer["outputs"], expected["answers"][name])
    assert answer["alibi_headers"]["x-seldon-alibi-method"] == "ks"
    outputs, parameters, headers = infer_grpc(alone, "iforest", REQUESTS["shifted"])
    assert_detector_data(outputs, expected["outliers"]["iforest"]["shifted"])
    assert parameters["name"].string_param == "IForest"
    assert headers["x-seldon-alibi-type"] == "outlier"
    assert "starting worker group 'env-" in alone.output()
