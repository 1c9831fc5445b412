"""Version policies (Triton's ``version_policy`` in model-settings.json): which versions
discovery keeps in both layouts, an invalid policy as a one-line error, and end to end
over REST, gRPC and tritonclient with 0 and 2 workers: the index, unversioned requests
(the latest READY version), metadata, statistics, the model configuration, and a new
version folder under ``latest 1`` through the repository API and the poll watcher (one
server in poll mode per worker count)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from inferpool.engine.repository import discover
from inferpool.engine.watcher import RepositoryWatcher
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, stub_for
from tests.support.pool import wait_for
from tests.support.runtimes import write_constant_model

ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
BODY = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP64", "data": ROWS.tolist()}]}
LATEST_1 = {"latest": {"num_versions": 1}}
LATEST_2 = {"latest": {"num_versions": 2}}
MODELS = {"tri-latest", "tri-specific", "tri-all", "ml", "pick", "bad", "api", "watched"}


def write_settings(folder: Path, **document: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(document))


def triton_model(root: Path, name: str, labels: dict[int, int], policy: object) -> None:
    """Triton's layout: numbered version folders (each answering its label), the policy
    in the model folder's settings."""
    for version, label in labels.items():
        write_constant_model(root / name / str(version), label)
    write_settings(root / name, version_policy=policy)


def mlserver_version(root: Path, name: str, version: str, label: int, policy: object) -> None:
    """MLServer's layout: one folder per version, ``parameters.version`` in its settings."""
    folder = write_constant_model(root / f"{name}-{version}", label)
    document: dict[str, object] = {"name": name, "parameters": {"version": version}}
    if policy is not None:
        document["version_policy"] = policy
    write_settings(folder, **document)


def versions_of(found: list, name: str) -> list[str | None]:
    return sorted(entry.version for entry in found if entry.name == name)


# -- discovery (no server) ----------------------------------------------------------------
def test_latest_keeps_the_newest_versions_numbers_as_numbers(tmp_path: Path) -> None:
    triton_model(tmp_path, "iris", {9: 0, 10: 1, 2: 2}, LATEST_2)
    triton_model(tmp_path, "one", {9: 0, 10: 1}, LATEST_1)
    triton_model(tmp_path, "every", {1: 0, 2: 1}, {"all": {}})
    triton_model(tmp_path, "unset", {1: 0, 2: 1}, None)
    found = discover(tmp_path)
    assert versions_of(found, "iris") == ["10", "9"]
    assert versions_of(found, "one") == ["10"]
    assert versions_of(found, "every") == ["1", "2"]
    assert versions_of(found, "unset") == ["1", "2"]


def test_specific_versions_as_numbers_or_strings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    triton_model(tmp_path, "picked", {1: 0, 2: 1, 3: 2}, {"specific": {"versions": [1, "3", 7]}})
    with caplog.at_level(logging.INFO, logger="inferpool.engine.repository"):
        found = discover(tmp_path)
    assert versions_of(found, "picked") == ["1", "3"]
    warning = "model 'picked': its version_policy names version '7', which the repository"
    assert any(warning in r.message and r.levelname == "WARNING" for r in caplog.records)
    assert "model 'picked': version '2' left out by its version_policy" in caplog.text


def test_the_latest_versions_settings_choose_in_mlservers_layout(tmp_path: Path) -> None:
    mlserver_version(tmp_path, "ml", "v1", 0, {"all": {}})  # an older version's: ignored
    mlserver_version(tmp_path, "ml", "v2", 1, None)
    mlserver_version(tmp_path, "ml", "v3", 2, LATEST_2)
    mlserver_version(tmp_path, "pick", "a", 0, None)
    mlserver_version(tmp_path, "pick", "b", 1, None)
    mlserver_version(tmp_path, "pick", "c", 2, {"specific": {"versions": ["a", "c"]}})
    found = discover(tmp_path)
    assert versions_of(found, "ml") == ["v2", "v3"]
    assert versions_of(found, "pick") == ["a", "c"]
    # Each version served carries the policy that chose it (the model config reports it).
    for entry in found:
        assert entry.settings is not None
        policy = entry.settings.version_policy
        assert policy is not None and policy.model_dump(exclude_none=True) in (
            LATEST_2,
            {"specific": {"versions": ("a", "c")}},
        )


@pytest.mark.parametrize(
    ("policy", "key", "says"),
    [
        ({"latest": {"num_versions": 2}, "all": {}}, "version_policy", "exactly one"),
        ({}, "version_policy", "exactly one"),
        ({"latest": {"num_versions": 0}}, "version_policy.latest.num_versions", "greater"),
        ({"latest": {"num_versions": "2"}}, "version_policy.latest.num_versions", "integer"),
        ({"latest": {}}, "version_policy.latest.num_versions", "required"),
        ({"specific": {"versions": []}}, "version_policy.specific.versions", "at least one"),
        ({"specific": {"versions": [1.5]}}, "version_policy.specific.versions", "1.5"),
        ({"specific": {"versions": [True]}}, "version_policy.specific.versions", "True"),
        ({"newest": {}}, "version_policy.newest", "not permitted"),
        ("latest", "version_policy", "dictionary"),
    ],
)
def test_an_invalid_policy_is_a_one_line_error(
    tmp_path: Path, policy: object, key: str, says: str
) -> None:
    triton_model(tmp_path, "iris", {1: 0, 2: 1}, policy)
    [found] = discover(tmp_path)
    assert found.name == "iris" and found.settings is None
    assert found.error.startswith(f"{tmp_path / 'iris' / 'model-settings.json'}: {key}: ")
    assert says in found.error and "\n" not in found.error


def test_the_watcher_leaves_a_folder_without_served_versions_alone(tmp_path: Path) -> None:
    """A folder whose versions the policy leaves out is read once, not at every idle
    comparison of the poll watcher."""
    mlserver_version(tmp_path, "ml", "v1", 0, None)
    mlserver_version(tmp_path, "ml", "v2", 1, LATEST_1)

    async def touched_after_reading_it() -> set[str]:
        # The client is not asked: the folder holds nothing to load.
        watcher = RepositoryWatcher(None, tmp_path, 0.1)
        watcher.adopt(discover(tmp_path))
        await watcher._sync_folder("ml-v1")
        watcher._compare()
        return set(watcher._pending)

    assert asyncio.run(touched_after_reading_it()) == set()


# -- end to end ---------------------------------------------------------------------------
def build_repository(root: Path) -> Path:
    triton_model(root, "tri-latest", {1: 0, 2: 1, 3: 2}, LATEST_2)
    triton_model(root, "tri-specific", {1: 0, 2: 1, 3: 2}, {"specific": {"versions": [1, 3]}})
    # The newest version's artefact is broken: it is FAILED, version 2 answers.
    triton_model(root, "tri-all", {1: 0, 2: 1}, {"all": {}})
    (root / "tri-all" / "3").mkdir()
    (root / "tri-all" / "3" / "model.joblib").write_bytes(b"not a pickle")
    mlserver_version(root, "ml", "v1", 0, None)
    mlserver_version(root, "ml", "v2", 1, None)
    mlserver_version(root, "ml", "v3", 2, LATEST_2)
    mlserver_version(root, "pick", "a", 0, None)
    mlserver_version(root, "pick", "b", 1, None)
    mlserver_version(root, "pick", "c", 2, {"specific": {"versions": ["a", "c"]}})
    triton_model(root, "bad", {1: 0}, {"latest": {"num_versions": 0}})
    triton_model(root, "api", {1: 0}, LATEST_1)
    triton_model(root, "watched", {1: 0}, LATEST_1)
    return root


@pytest.fixture(scope="module", params=WORKER_COUNTS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    repository = build_repository(tmp_path_factory.mktemp("policies"))
    # Poll mode: the watcher follows the folders, the repository API works beside it.
    flags = ("--workers", str(request.param), "--no-exit-on-error")
    flags += ("--model-control-mode", "poll", "--repository-debounce", "0.2")
    with Server(repository, *flags) as server:
        server.repository = repository
        server.wait_live()
        # Not ready by design (the FAILED models): wait until every model has loaded.
        wait_for(lambda: settled(server), timeout=60, what="every model loaded")
        yield server


def index(server: Server) -> dict[str, dict[str | None, tuple[str, str]]]:
    """name -> version -> (state, reason), from the REST index."""
    models: dict[str, dict[str | None, tuple[str, str]]] = {}
    for entry in httpx.post(f"{server.url}/v2/repository/index", json={}).json():
        versions = models.setdefault(entry["name"], {})
        versions[entry.get("version")] = (entry["state"], entry["reason"])
    return models


def settled(server: Server) -> bool:
    """Every model of ``build_repository`` listed, none of them loading."""
    try:
        listed = index(server)
    except httpx.HTTPError:
        return False
    ended = all(
        state in ("READY", "FAILED")
        for versions in listed.values()
        for state, _ in versions.values()
    )
    return ended and listed.keys() == MODELS


def states(server: Server, name: str) -> dict[str | None, str]:
    return {version: state for version, (state, _) in index(server).get(name, {}).items()}


def infer(server: Server, path: str) -> tuple[int, list[int], str | None]:
    response = httpx.post(f"{server.url}/v2/models/{path}/infer", json=BODY)
    if response.status_code != 200:
        return response.status_code, [], None
    answer = response.json()
    return 200, answer["outputs"][0]["data"], answer.get("model_version")


def test_the_index_lists_the_versions_each_policy_serves(server: Server) -> None:
    assert states(server, "tri-latest") == {"2": "READY", "3": "READY"}
    assert states(server, "tri-specific") == {"1": "READY", "3": "READY"}
    assert states(server, "tri-all") == {"1": "READY", "2": "READY", "3": "FAILED"}
    assert states(server, "ml") == {"v2": "READY", "v3": "READY"}
    assert states(server, "pick") == {"a": "READY", "c": "READY"}
    [(state, reason)] = index(server)["bad"].values()
    settings_file = server.repository / "bad" / "model-settings.json"
    assert state == "FAILED"
    assert reason.startswith(f"{settings_file}: version_policy.latest.num_versions: ")
    # gRPC's index: the same versions.
    with stub_for(server) as stub:
        answer = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
    listed = {(m.name, m.version): m.state for m in answer.models if m.name == "tri-latest"}
    assert listed == {("tri-latest", "2"): "READY", ("tri-latest", "3"): "READY"}


def test_unversioned_requests_go_to_the_latest_ready_version(server: Server) -> None:
    assert infer(server, "tri-latest") == (200, [2, 2], "3")
    assert infer(server, "tri-latest/versions/1")[0] == 404  # left out by the policy
    assert infer(server, "tri-specific") == (200, [2, 2], "3")
    assert infer(server, "tri-specific/versions/2")[0] == 404
    assert infer(server, "tri-all") == (200, [1, 1], "2")  # version 3 FAILED
    assert infer(server, "tri-all/versions/3")[0] == 503
    assert infer(server, "ml") == (200, [2, 2], "v3")
    assert infer(server, "ml/versions/v1")[0] == 404
    assert infer(server, "pick") == (200, [2, 2], "c")
    assert infer(server, "pick/versions/a") == (200, [0, 0], "a")

    http_client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
    for module, client in ((triton_http, http_client), (triton_grpc, grpc_client)):
        x = module.InferInput("x", list(ROWS.shape), "FP64")
        x.set_data_from_numpy(ROWS)
        assert client.infer("tri-all", [x]).as_numpy("predict").tolist() == [1, 1]
        result = client.infer("tri-specific", [x], model_version="1")
        assert result.as_numpy("predict").tolist() == [0, 0]
        with pytest.raises(InferenceServerException, match="no version '2'"):
            client.infer("tri-specific", [x], model_version="2")
    http_client.close()
    grpc_client.close()


def test_metadata_and_statistics_list_the_served_versions(server: Server) -> None:
    url = f"{server.url}/v2/models"
    assert infer(server, "ml/versions/v2")[0] == 200
    assert sorted(httpx.get(f"{url}/tri-latest").json()["versions"]) == ["2", "3"]
    assert sorted(httpx.get(f"{url}/ml/versions/v2").json()["versions"]) == ["v2", "v3"]
    stats = httpx.get(f"{url}/tri-latest/stats").json()["model_stats"]
    assert sorted(s["version"] for s in stats) == ["2", "3"]
    with stub_for(server) as stub:
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="tri-all"), timeout=30)
        assert sorted(metadata.versions) == ["1", "2", "3"]
        request = pb.ModelStatisticsRequest(name="ml")
        answer = stub.ModelStatistics(request, timeout=30)
    counts = {s.version: s.inference_stats.success.count for s in answer.model_stats}
    assert counts.keys() == {"v2", "v3"} and counts["v2"] >= 1


def test_the_model_config_reports_the_policy(server: Server) -> None:
    def config(path: str) -> dict:
        response = httpx.get(f"{server.url}/v2/models/{path}/config")
        assert response.status_code == 200, response.text
        return response.json()["version_policy"]

    assert config("tri-latest") == LATEST_2
    assert config("tri-specific/versions/1") == {"specific": {"versions": [1, 3]}}
    assert config("tri-all") == {"all": {}}
    assert config("ml/versions/v2") == LATEST_2  # the latest version's policy
    assert config("pick") == {"specific": {"versions": ["a", "c"]}}

    http_client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    assert http_client.get_model_config("tri-latest")["version_policy"] == LATEST_2
    http_client.close()
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
    policy = grpc_client.get_model_config("tri-specific").config.version_policy
    assert list(policy.specific.versions) == [1, 3]
    policy = grpc_client.get_model_config("ml").config.version_policy
    assert policy.latest.num_versions == 2
    # Triton's ModelConfig holds version numbers: MLServer's "a" and "c" cannot travel.
    policy = grpc_client.get_model_config("pick").config.version_policy
    assert policy.WhichOneof("policy_choice") == "specific" and not policy.specific.versions
    grpc_client.close()


def test_the_api_loads_a_new_version_and_unloads_the_old_under_latest_1(server: Server) -> None:
    repository: Path = server.repository
    assert infer(server, "api") == (200, [0, 0], "1")
    write_constant_model(repository / "api" / "2", 1)
    assert httpx.post(f"{server.url}/v2/repository/models/api/load", timeout=120).status_code == 200
    assert states(server, "api") == {"2": "READY"}
    assert infer(server, "api") == (200, [1, 1], "2")
    assert infer(server, "api/versions/1")[0] == 404
    # MLServer's layout: a new folder naming the model, with the policy (latest 2).
    mlserver_version(repository, "ml", "v4", 0, LATEST_2)
    assert httpx.post(f"{server.url}/v2/repository/models/ml/load", timeout=120).status_code == 200
    assert states(server, "ml") == {"v3": "READY", "v4": "READY"}
    assert infer(server, "ml") == (200, [0, 0], "v4")


def test_the_watcher_loads_a_new_version_and_unloads_the_old_under_latest_1(
    server: Server, tmp_path: Path
) -> None:
    repository: Path = server.repository
    assert infer(server, "watched") == (200, [0, 0], "1")
    # Written beside the repository, then moved in whole.
    write_constant_model(tmp_path / "2", 1).rename(repository / "watched" / "2")
    wait_for(lambda: states(server, "watched") == {"2": "READY"}, what="only version 2")
    assert infer(server, "watched") == (200, [1, 1], "2")
    assert infer(server, "watched/versions/1")[0] == 404


def test_the_watcher_applies_the_latest_policy_across_mlservers_folders(
    server: Server, tmp_path: Path
) -> None:
    repository: Path = server.repository
    # A new version's folder, whose policy (the latest version's) keeps only it: the
    # versions other folders hold are unloaded (and dropped: the policy leaves them out).
    mlserver_version(tmp_path, "ml", "v5", 2, LATEST_1)
    (tmp_path / "ml-v5").rename(repository / "ml-v5")
    wait_for(lambda: states(server, "ml") == {"v5": "READY"}, what="only ml v5")
    assert infer(server, "ml") == (200, [2, 2], "v5")
    # Widened to the latest two: the next newest version, in its own folder, loads again.
    write_settings(repository / "ml-v5", name="ml", parameters={"version": "v5"},
                   version_policy=LATEST_2)  # fmt: skip
    previous = "v4" if (repository / "ml-v4").is_dir() else "v3"
    wanted = {previous: "READY", "v5": "READY"}
    wait_for(lambda: states(server, "ml") == wanted, what=f"ml {previous} and v5")
    assert infer(server, f"ml/versions/{previous}")[0] == 200
