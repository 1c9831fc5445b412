"""Per-model environments placed by capability (issue 19, item 6), end to end.

A model naming an environment (``parameters.environment_path`` or MLServer's
``environment_tarball``) runs in workers started with that environment's interpreter; the
others stay on the server's. Worker groups advertise tags, models declare requirements,
and a model no worker can hold fails with one summary sentence. With ``--workers 0`` the
server process is the one worker: requirements are checked against it, and a model
naming an environment runs in a worker of that environment all the same.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, iris_data, rest_output, write_sklearn_model
from tests.support.grpc import infer_request, stub_for
from tests.support.pool import wait_for
from tests.support.where import (
    WHERE_BODY,
    make_venv,
    report,
    reports_at_once,
    write_where_model,
)

BIGBOX = {"name": "bigbox", "workers": 1, "tags": ["big"]}


def index_of(server: Server) -> dict[str, dict]:
    answer = httpx.post(f"{server.url}/v2/repository/index", timeout=30)
    return {entry["name"]: entry for entry in answer.json()}


def settled(server: Server) -> dict[str, dict]:
    def done() -> bool:
        states = {entry["state"] for entry in index_of(server).values()}
        return bool(states) and "LOADING" not in states

    wait_for(done, timeout=90, what="every model loaded or failed")
    return index_of(server)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("envs") / "venv")


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("envs") / "legacy", marker_version="4.0")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, venv: Path, legacy: Path) -> Iterator[Server]:
    """2 workers of the server's own, bigbox's 1 (tag big), legacy's 2 (slots 3 and 4: a
    configured group with an environment), and the group started for ``venv`` (slot 5)."""
    root = tmp_path_factory.mktemp("repo")
    write_where_model(root / "plain")
    write_where_model(root / "boxed", requirements=["big"])
    write_where_model(root / "isolated", parameters={"environment_path": str(venv)})
    # The same environment named by a relative path: one group for both.
    relative = os.path.relpath(venv, root / "neighbour")
    write_where_model(root / "neighbour", parameters={"environment_path": relative})
    write_where_model(root / "needs", requirements=["lightgbm>=99"])
    write_where_model(
        root / "configured", parameters={"environment_path": str(legacy)}, requirements=["legacy"]
    )
    groups = [
        BIGBOX,
        {"name": "legacy", "workers": 2, "environment": str(legacy), "tags": ["legacy"]},
    ]
    broken = tmp_path_factory.mktemp("broken") / "not-an-env"
    broken.mkdir()
    write_where_model(root / "broken", parameters={"environment_path": str(broken)})
    arguments = ("--workers", "2", "--worker-groups", json.dumps(groups), "--no-exit-on-error")
    with Server(root, *arguments) as server:
        server.wait_live()
        settled(server)
        server.repository = root
        yield server


def test_a_model_runs_in_the_interpreter_of_the_environment_it_names(
    pool: Server, venv: Path
) -> None:
    isolated = report(pool.url, "isolated")
    assert Path(isolated["prefix"]) == venv
    assert isolated["marker"] == "2.5"  # only that environment has it
    plain = report(pool.url, "plain")
    assert Path(plain["prefix"]) != venv and plain["marker"] == ""
    # The server's libraries fill in what the environment lacks (scikit-learn here).
    assert isolated["sklearn"] == plain["sklearn"]
    # Over gRPC too: the same worker, the same answer.
    with stub_for(pool) as stub:
        answer = stub.ModelInfer(infer_request("isolated", x=np.array([[1.0, 2.0]])))
    where = json.loads(answer.outputs[0].contents.bytes_contents[0])
    assert Path(where["prefix"]) == venv and where["pid"] == isolated["pid"]


def test_models_naming_one_environment_share_its_worker_group(pool: Server, venv: Path) -> None:
    output = pool.output()
    groups = re.findall(r"starting worker group 'env-\w+' \(workers \[(\d+)\], environment", output)
    assert len(groups) == 1, output
    [slot] = groups
    assert int(slot) == 5  # after the server's own 2, bigbox's 1 and legacy's 2
    isolated, neighbour = report(pool.url, "isolated"), report(pool.url, "neighbour")
    slot = started_pids(pool)[5]
    assert isolated["pid"] in slot and neighbour["pid"] in slot
    assert f"environment {venv}: Python {sys.version_info[0]}.{sys.version_info[1]}" in output


def started_pids(server: Server) -> dict[int, set[int]]:
    """Every pid each slot's workers had, from the server's log: a call slowed past the
    stall threshold by a loaded machine starts a standby in its slot (CI, 2026-12-06),
    which serves that slot's models too."""
    pids: dict[int, set[int]] = {}
    for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", server.output()):
        pids.setdefault(int(slot), set()).add(int(pid))
    return pids


def test_requirements_place_a_model_on_the_group_whose_tags_meet_them(pool: Server) -> None:
    boxed = {report(pool.url, "boxed")["pid"] for _ in range(6)}
    plain = {answer["pid"] for answer in reports_at_once(pool.url, "plain", 24)}
    pids = started_pids(pool)
    assert boxed <= pids[2]  # bigbox's one worker (its standby, if one started)
    assert plain <= pids[0] | pids[1] | pids[2] and len(plain) >= 2
    assert not plain & (pids[3] | pids[4] | pids[5])  # never on an environment's worker


def test_a_configured_group_runs_its_environment_from_the_start(pool: Server, legacy: Path) -> None:
    pool.expect_lines([rf"starting worker group 'legacy' \(workers \[3, 4\], environment {legacy}"])
    answers = reports_at_once(pool.url, "configured", 16)
    pids = started_pids(pool)
    served = {answer["pid"] for answer in answers}
    assert served & pids[3] and served & pids[4]  # one replica each
    assert served <= pids[3] | pids[4]
    assert {answer["marker"] for answer in answers} == {"4.0"}


def test_each_group_and_what_it_offers_is_a_metric(pool: Server, venv: Path, legacy: Path) -> None:
    metrics = httpx.get(f"http://127.0.0.1:{pool.metrics_port}/metrics", timeout=30).text
    groups = {}
    for labels, value in re.findall(
        r"^inferpool_worker_group_workers\{(.*)\} (\S+)$", metrics, re.M
    ):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        groups[fields["group"]] = (fields, float(value))
    assert groups["default"][1] == 2 and groups["default"][0]["environment"] == ""
    assert groups["bigbox"][1] == 1 and groups["bigbox"][0]["tags"] == "big"
    assert groups["legacy"][1] == 2 and groups["legacy"][0]["environment"] == str(legacy)
    [started] = [name for name in groups if name.startswith("env-")]
    assert groups[started][0]["environment"] == str(venv)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}."
    assert all(fields["python"].startswith(python) for fields, _ in groups.values())
    assert "sklearn " in groups[started][0]["libraries"]


def test_a_model_no_worker_can_hold_fails_with_one_summary_sentence(pool: Server) -> None:
    index = index_of(pool)
    assert index["needs"]["state"] == "FAILED"
    assert re.fullmatch(
        r"cannot place 1 replica of 'needs': [56] workers; 3 lack 'lightgbm>=99', "
        r"[23] run an environment",
        index["needs"]["reason"],
    ), index["needs"]["reason"]
    answer = httpx.post(f"{pool.url}/v2/models/needs/infer", json={"inputs": []}, timeout=30)
    assert answer.status_code in (400, 503) and "lightgbm>=99" in answer.json()["error"]
    with stub_for(pool) as stub:
        ready = stub.ModelReady(pb.ModelReadyRequest(name="needs"))
    assert ready.ready is False


def test_an_unusable_environment_fails_its_model_only(pool: Server) -> None:
    index = index_of(pool)
    assert index["broken"]["state"] == "FAILED"
    assert "not-an-env" in index["broken"]["reason"]
    assert index["plain"]["state"] == index["isolated"]["state"] == "READY"


def test_a_dead_environment_worker_is_replaced_from_its_environment(
    pool: Server, venv: Path
) -> None:
    before = report(pool.url, "isolated")["pid"]
    os.kill(before, signal.SIGKILL)

    def back() -> bool:
        try:
            answer = report(pool.url, "isolated")
        except AssertionError:
            return False  # 503 while it is replaced
        return answer["pid"] != before

    wait_for(back, timeout=60, what="the environment's worker replaced")
    after = report(pool.url, "isolated")
    assert Path(after["prefix"]) == venv and after["marker"] == "2.5"
    assert report(pool.url, "plain")["marker"] == ""


def test_the_repository_api_starts_an_environment_for_a_model_it_loads(
    pool: Server, tmp_path: Path
) -> None:
    other = make_venv(tmp_path / "other", marker_version="3.1")
    tarball = tmp_path / "other.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        for member in other.iterdir():
            archive.add(member, arcname=member.name)
    repository = pool.repository
    write_where_model(
        repository / "packed",
        parameters={"environment_tarball": str(tarball)},
        requirements=["envmarker>=3"],
    )
    loaded = httpx.post(f"{pool.url}/v2/repository/models/packed/load", timeout=120)
    assert loaded.status_code == 200, loaded.text
    packed = report(pool.url, "packed")
    assert packed["marker"] == "3.1" and Path(packed["prefix"]) != other  # the unpacked copy
    unloaded = httpx.post(f"{pool.url}/v2/repository/models/packed/unload", timeout=60)
    assert unloaded.status_code == 200


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory, venv: Path) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("alone")
    write_where_model(root / "tagged", requirements=["big"])
    write_where_model(root / "gpu", requirements=["gpu"])
    write_where_model(root / "isolated", parameters={"environment_path": str(venv)})
    arguments = ("--workers", "0", "--worker-tags", "big", "--no-exit-on-error")
    with Server(root, *arguments) as server:
        server.wait_live()
        settled(server)
        yield server


def test_without_workers_the_server_process_is_the_one_worker(alone: Server) -> None:
    index = index_of(alone)
    assert index["tagged"]["state"] == "READY"
    assert report(alone.url, "tagged")["pid"] == alone.process.pid
    assert index["gpu"]["reason"] == "cannot place 1 replica of 'gpu': 1 worker; 1 lacks 'gpu'"


def test_without_workers_a_model_naming_an_environment_runs_in_a_worker_of_it(
    alone: Server, venv: Path
) -> None:
    """The one exception to ``--workers 0``: its interpreter is the environment's, so it
    runs in a worker group started for it (``environment_workers``, 1), over REST and
    gRPC; the others stay in the server process."""
    assert index_of(alone)["isolated"]["state"] == "READY"
    where = report(alone.url, "isolated")
    assert where["prefix"] == str(venv) and where["marker"] == "2.5"
    assert where["pid"] != alone.process.pid
    with stub_for(alone) as stub:
        reply = stub.ModelInfer(infer_request("isolated", x=np.array([[1.0, 2.0]])))
    [answered] = reply.outputs[0].contents.bytes_contents
    assert json.loads(answered)["pid"] == where["pid"]
    assert "starting worker group 'env-" in alone.output()
    with stub_for(alone) as stub:
        assert stub.ModelReady(pb.ModelReadyRequest(name="tagged")).ready is True
        assert stub.ModelReady(pb.ModelReadyRequest(name="gpu")).ready is False
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(infer_request("gpu", x=np.array([[1.0, 2.0]])))
    assert "1 lacks 'gpu'" in (error.value.details() or "")


def test_without_workers_the_metrics_count_the_environments_worker(alone: Server) -> None:
    """Its replica and its process, as the pool's metrics count them with workers."""
    from prometheus_client.parser import text_string_to_metric_families

    scraped = httpx.get(f"http://127.0.0.1:{alone.metrics_port}/metrics", timeout=30).text
    samples = [s for f in text_string_to_metric_families(scraped) for s in f.samples]
    replicas = {(s.labels["model"], s.labels["state"]): s.value for s in samples
                if s.name == "inferpool_model_replicas"}  # fmt: skip
    assert replicas[("isolated", "ready")] == 1 and replicas[("tagged", "ready")] == 1
    processes = {s.labels["process"] for s in samples
                 if s.name == "inferpool_process_resident_memory_bytes"}  # fmt: skip
    assert processes == {"server", "worker-0"}
    restarts = [s for s in samples if s.name == "inferpool_worker_restarts_total"]
    assert [s.labels["worker"] for s in restarts] == ["0"]


def test_without_workers_a_reload_moves_a_model_to_its_environment_and_back(
    tmp_path: Path, venv: Path
) -> None:
    write_where_model(tmp_path / "moving")
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_live()
        settled(server)
        assert report(server.url, "moving")["pid"] == server.process.pid
        for parameters, here in (({"environment_path": str(venv)}, False), ({}, True)):
            write_where_model(tmp_path / "moving", parameters=parameters)
            load = httpx.post(f"{server.url}/v2/repository/models/moving/load", timeout=60)
            assert load.status_code == 200, load.text
            where = report(server.url, "moving")
            assert (where["pid"] == server.process.pid) is here
            assert (where["prefix"] == str(venv)) is not here
        unload = httpx.post(f"{server.url}/v2/repository/models/moving/unload", timeout=60)
        assert unload.status_code == 200, unload.text
        gone = httpx.post(f"{server.url}/v2/models/moving/infer", json=WHERE_BODY, timeout=30)
        assert gone.status_code in (400, 404, 503) and "unloaded" in gone.json()["error"]


def test_the_embedded_engine_without_workers_runs_an_environments_model_in_its_worker(
    tmp_path: Path, venv: Path
) -> None:
    """``inferpool.Engine(workers=0)``: the typed path for the model in this process, the
    raw path for the one in its environment's worker."""
    import inferpool

    write_where_model(tmp_path / "isolated", parameters={"environment_path": str(venv)})
    write_where_model(tmp_path / "plain")
    x = np.array([[1.0, 2.0]])
    with inferpool.Engine(tmp_path, workers=0) as engine:
        isolated = json.loads(engine.infer_sync("isolated", x)["where"][0])
        plain = json.loads(engine.infer_sync("plain", x)["where"][0])
    assert isolated["prefix"] == str(venv) and isolated["pid"] != os.getpid()
    assert plain["pid"] == os.getpid()


def test_a_new_generation_of_the_servers_workers_leaves_the_environments_alone(
    pool: Server,
) -> None:
    """A scikit-learn model loaded now is shared through the server's template: its workers
    are replaced by a new generation; the environments' workers keep their replicas."""
    before = {name: report(pool.url, name)["pid"] for name in ("isolated", "configured")}
    estimator = LogisticRegression(max_iter=500).fit(*iris_data())
    write_sklearn_model(pool.repository / "late", estimator)
    loaded = httpx.post(f"{pool.url}/v2/repository/models/late/load", timeout=120)
    assert loaded.status_code == 200, loaded.text
    pool.expect_lines([r"a new generation of workers took over"])
    rows = np.array([[5.1, 3.5, 1.4, 0.2]])
    assert rest_output(pool.url, "late", rows, "predict").tolist() == [0]
    assert report(pool.url, "isolated")["pid"] == before["isolated"]
    after = {report(pool.url, "configured")["pid"] for _ in range(8)}
    assert before["configured"] in after and report(pool.url, "isolated")["marker"] == "2.5"
