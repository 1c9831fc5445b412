"""alibi-detect detectors served from a per-model environment (issue 40, point 5).

alibi-detect 0.13 requires numpy<2, which the server's environment cannot hold. tox's
``environments`` environment packs one with ``inferpool env pack`` from
``alibi-requirements.txt`` (as users do, docs/runtimes/alibi-detect.md; it holds alibi
too, for test_alibi_explain.py) and names the tarball in ``INFERPOOL_TEST_ALIBI_ENV``.
The test unpacks it into the cache the server then uses (so it is unpacked once), saves
detectors with that environment's python (``save_detector``), and computes there what
the detectors answer; the server (two workers of that environment) must answer the same
over REST and gRPC, with MLServer's settings (``predict_parameters``, ``batch_size``)
and its response shape. Detectors: KSDrift, the online CVMDriftOnline, and the outlier
detectors IForest and Mahalanobis (which keeps state), none of which needs TensorFlow or
PyTorch to run.
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
from tests.environments import named_by
from tests.support import Server
from tests.support.grpc import stub_for

IMPLEMENTATION = "mlserver_alibi_detect.AlibiDetectRuntime"

# Run by the environment's python: saves the detectors and prints their own answers.
SAVE = """
import json, sys
import numpy as np
from alibi_detect.cd import CVMDriftOnline, KSDrift
from alibi_detect.saving import load_detector, save_detector
root, requests = sys.argv[1], json.loads(sys.argv[2])
rng = np.random.default_rng(0)
x_ref = rng.normal(size=(200, 4)).astype(np.float32)
save_detector(KSDrift(x_ref, p_val=0.05), root + "/ksdrift/detector")
def plain(d):
    return {k: (np.asarray(v).tolist() if v is not None else None) for k, v in d.items()}
detector = load_detector(root + "/ksdrift/detector")
arrays = {name: np.asarray(rows, dtype=np.float32) for name, rows in requests.items()}
answers = {name: detector.predict(rows) for name, rows in arrays.items()}
feature = detector.predict(arrays["shifted"], return_distance=False)
joined = np.concatenate([arrays["same"], arrays["shifted"]])
# An online detector, fed as the server feeds it: a request of several rows is one
# predict per row (each of shape [features]), a request of one row one predict.
save_detector(
    CVMDriftOnline(x_ref[:100, :2], ert=50, window_sizes=[2], n_bootstraps=300, verbose=False),
    root + "/online/detector",
)
online = load_detector(root + "/online/detector")
stream = [[plain(online.predict(x)["data"]) for x in arrays["same"][:3, :2]],
          [plain(online.predict(arrays["shifted"][:1, :2])["data"])]]
print(json.dumps({
    "numpy": np.__version__,
    "online": stream,
    "answers": {name: plain(a["data"]) for name, a in answers.items()},
    "meta": answers["same"]["meta"],
    "no_distance": plain(feature["data"]),
    "joined": plain(detector.predict(joined)["data"]),
    "outliers": outliers(root, x_ref, arrays),
}))
"""

# Run by the environment's python too: the outlier detectors. alibi-detect 0.13's
# save_detector writes IForest and Mahalanobis only in its legacy format, and only with
# TensorFlow installed (which the environment lacks): the script writes that format as
# save_detector does, the detector's meta in meta.dill and the state alibi-detect keeps
# for it in <name>.dill (checked 2026-12-07 with TensorFlow 2.18.1: folders save_detector
# wrote hold these files and keys, and the runtime, without TensorFlow, loads them into
# detectors answering as alibi-detect's own load_detector's). Their answers are the saved
# detector's own, in memory.
SAVE_OUTLIERS = """
import copy, os
import dill
from alibi_detect.od import IForest, Mahalanobis
KEPT = {"IForest": ("threshold", "isolationforest"),
        "Mahalanobis": ("threshold", "n_components", "std_clip", "start_clip", "max_n",
                        "cat_vars", "ohe", "d_abs", "clip", "mean", "C", "n")}
def save_legacy(detector, folder):
    os.makedirs(folder)
    name = detector.meta["name"]
    with open(folder + "/meta.dill", "wb") as f:
        dill.dump(detector.meta, f)
    with open(folder + "/" + name + ".dill", "wb") as f:
        dill.dump({key: getattr(detector, key) for key in KEPT[name]}, f)
def outliers(root, x_ref, arrays):
    forest = IForest(n_estimators=50)
    forest.fit(x_ref)
    forest.infer_threshold(x_ref, threshold_perc=95)
    save_legacy(forest, root + "/iforest/detector")
    # Mahalanobis updates its mean and covariance at each predict (infer_threshold too).
    distance = Mahalanobis(n_components=3, start_clip=50)
    distance.infer_threshold(x_ref, threshold_perc=95)
    save_legacy(distance, root + "/mahalanobis/detector")
    fresh = copy.deepcopy(distance)
    same, shifted = arrays["same"][:10], arrays["shifted"][:10]
    return {
        "iforest": {name: plain(forest.predict(rows)["data"]) for name, rows in arrays.items()},
        "iforest_meta": forest.meta,
        "no_score": plain(forest.predict(arrays["shifted"], return_instance_score=False)["data"]),
        "mahalanobis": [plain(distance.predict(rows)["data"]) for rows in (same, shifted)],
        "mahalanobis_fresh": plain(fresh.predict(shifted)["data"]),
    }
"""


def rows(seed: int, shift: float) -> list[list[float]]:
    generator = np.random.default_rng(seed)
    return (generator.normal(size=(50, 4)) + shift).astype(np.float32).tolist()


REQUESTS = {"same": rows(1, 0.0), "shifted": rows(2, 0.7)}


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
    done = subprocess.run(
        [environment.python, "-c", SAVE_OUTLIERS + SAVE, str(root), json.dumps(REQUESTS)],
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
    root, _ = repository
    arguments = ("--workers", "2", "--environment-workers", "2",
                 "--environments-dir", str(cache), "--no-exit-on-error")  # fmt: skip
    with Server(root, *arguments) as running:
        running.wait_live(timeout=120)
        wait_settled(running)
        yield running


def wait_settled(server: Server) -> dict[str, dict]:
    import time

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        if index and all(e["state"] not in ("LOADING", "UNAVAILABLE") for e in index.values()):
            return index
        time.sleep(0.2)
    raise TimeoutError(f"models still loading: {index}")


def body(data: list[list[float]]) -> dict:
    shape = [len(data), len(data[0])]
    flat = np.asarray(data, dtype=np.float32).ravel().tolist()
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": flat}]}


def infer(server: Server, name: str, data: list[list[float]]) -> dict:
    answer = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body(data), timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_detector_data(outputs: list[dict], data: dict) -> None:
    """The outputs are the detector's ``data``: one per key (None left out), each value
    as a list of one (MLServer's shape), equal to the detector's own."""
    assert [o["name"] for o in outputs] == [k for k, v in data.items() if v is not None]
    assert_stream(outputs, [data])


def assert_stream(outputs: list[dict], steps: list[dict], simulated: tuple = ()) -> None:
    """The outputs hold one value per step (predict call), each equal to the detector's;
    those ``simulated`` anew by each load (an online detector's thresholds) of its shape."""
    for output in outputs:
        if output["name"] in simulated:
            assert output["shape"] == list(np.shape([step[output["name"]] for step in steps]))
            continue
        want = np.asarray([step[output["name"]] for step in steps], dtype=np.float64)
        assert output["shape"] == list(want.shape), output
        # NaN (an online detector's statistic before its window fills) is JSON's null.
        got = np.asarray(output["data"], dtype=np.float64).reshape(want.shape)
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
    assert answer["parameters"]["headers"] == {
        "x-seldon-alibi-type": "drift",
        "x-seldon-alibi-method": "ks",
    }
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["is_drift"]["datatype"] == "INT64" and outputs["p_val"]["datatype"] == "FP32"
    index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["ksdrift"]["state"] == "READY"


def infer_grpc(server: Server, name: str, data: list[list[float]]) -> tuple[list[dict], Any]:
    """The outputs (as REST's, to compare) and the parameters of a gRPC ModelInfer."""
    rows = np.asarray(data, dtype=np.float32)
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=rows.shape)
    tensor.contents.fp32_contents.extend(rows.ravel().tolist())
    with stub_for(server) as stub:
        reply = stub.ModelInfer(request, timeout=60)
    decoded = response_from_message(reply)
    outputs = [
        {"name": o.name, "shape": list(o.shape), "data": np.asarray(o.data).ravel().tolist()}
        for o in decoded.outputs
    ]
    return outputs, reply.parameters


def test_grpc_answers_the_same(server: Server, repository: tuple[Path, dict]) -> None:
    _, expected = repository
    outputs, parameters = infer_grpc(server, "ksdrift", REQUESTS["shifted"])
    assert_detector_data(outputs, expected["answers"]["shifted"])
    assert parameters["name"].string_param == "KSDrift"


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
    assert answer["parameters"]["headers"] == {
        "x-seldon-alibi-type": "outlier",
        "x-seldon-alibi-method": "isolationforest",
    }
    outputs, parameters = infer_grpc(server, "iforest", REQUESTS["shifted"])
    assert_detector_data(outputs, outliers["iforest"]["shifted"])
    assert parameters["name"].string_param == "IForest"
    assert json.loads(parameters["headers"].string_param)["x-seldon-alibi-type"] == "outlier"


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
    assert answer["parameters"]["headers"]["x-seldon-alibi-method"] == "mahalanobis"
    outputs, _ = infer_grpc(server, "mahalanobis", REQUESTS["shifted"][:10])
    assert_detector_data(outputs, second)
    # Its placement says the state is its replica's (docs/runtimes/alibi-detect.md).
    assert "predicted by Mahalanobis of alibi-detect (online: its state is this replica's)" in (
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
