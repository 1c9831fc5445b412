"""The protocol-neutral data plane over a fake engine client: every answer it gives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import inferpool
from inferpool.engine.admin import AdminPolicy
from inferpool.engine.pipelines.manager import Pipelines
from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.errors import Forbidden, ModelNotFound, Unauthorized
from inferpool.frontends.dataplane import EXTENSIONS, DataPlane

IRIS_METADATA = {
    "name": "iris",
    "versions": ["2"],
    "platform": "sklearn",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "predict", "datatype": "INT64", "shape": [-1]}],
}


class FakeClient:
    """The part of EngineClient the data plane reads, with answers set by the test."""

    def __init__(self, admin: AdminPolicy | None = None) -> None:
        self.table = ModelTable()
        self.admin = admin or AdminPolicy()
        self.wedged: str | None = None
        self.not_ready: str | None = None
        self.calls: list[tuple[str, Any]] = []
        self.pipelines = Pipelines(self)  # type: ignore[arg-type]  # none loaded: syncs nothing

    def live_reason(self) -> str | None:
        return self.wedged

    def not_ready_reason(self) -> str | None:
        return self.not_ready

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        self.calls.append(("statistics", (name, version)))
        return {"model_stats": [{"name": name or "all"}]}

    async def load_model(self, name: str) -> None:
        self.calls.append(("load", name))

    async def unload_model(self, name: str) -> None:
        self.calls.append(("unload", name))

    async def infer(self, *args: Any) -> str:
        self.calls.append(("infer", args))
        return "reply"


def plane_with_models(**kwargs: Any) -> tuple[DataPlane, FakeClient]:
    client = FakeClient(**kwargs)
    client.table.set(
        ModelStatus("iris", "2", ModelState.READY, metadata=dict(IRIS_METADATA), required=True)
    )
    client.table.set(ModelStatus("broken", None, ModelState.FAILED, "no such file"))
    client.table.set(ModelStatus("later", "1", ModelState.LOADING))
    return DataPlane(client), client  # type: ignore[arg-type]


def test_live_and_ready_carry_the_reason_when_false():
    plane, client = plane_with_models()
    assert plane.live() == {"live": True}
    assert plane.ready() == {"ready": True}
    client.wedged = "worker 0 stopped answering heartbeats"
    client.not_ready = "server is starting up"
    assert plane.live() == {"live": False, "error": "worker 0 stopped answering heartbeats"}
    assert plane.ready() == {"ready": False, "error": "server is starting up"}


def test_model_ready_says_why_not_and_refuses_an_unknown_model_or_version():
    plane, _ = plane_with_models()
    assert plane.model_ready("iris", None) == {"name": "iris", "ready": True}
    assert plane.model_ready("iris", "2") == {"name": "iris", "ready": True}
    assert plane.model_ready("broken", None) == {
        "name": "broken",
        "ready": False,
        "error": "model 'broken' failed to load: no such file",
    }
    with pytest.raises(ModelNotFound, match="model 'nope' not found"):
        plane.model_ready("nope", None)
    with pytest.raises(ModelNotFound, match="has no version '3'"):
        plane.model_ready("iris", "3")


def test_server_metadata_names_the_extensions():
    plane, _ = plane_with_models()
    assert plane.server_metadata() == {
        "name": "inferpool",
        "version": inferpool.__version__,
        "extensions": EXTENSIONS,
    }
    assert {"model_repository", "statistics", "binary_tensor_data"} <= set(EXTENSIONS)
    assert {"custom_endpoints", "feedback"} <= set(EXTENSIONS)


def test_model_metadata_of_a_loaded_model_is_its_own_plus_its_state():
    plane, client = plane_with_models()
    assert plane.model_metadata("iris", None) == {**IRIS_METADATA, "state": "READY"}
    assert plane.model_metadata("iris", "2") == {**IRIS_METADATA, "state": "READY"}
    # The table's copy is not touched by the answer.
    assert client.table.find("iris").metadata == IRIS_METADATA


def test_model_metadata_of_a_model_that_never_loaded_names_it_and_its_reason():
    plane, _ = plane_with_models()
    assert plane.model_metadata("broken", None) == {
        "name": "broken",
        "versions": [],
        "platform": "",
        "inputs": [],
        "outputs": [],
        "state": "FAILED",
        "reason": "no such file",
    }
    assert plane.model_metadata("later", None)["versions"] == ["1"]
    with pytest.raises(ModelNotFound):
        plane.model_metadata("nope", None)


def test_the_repository_index_lists_every_model_or_only_the_ready_ones():
    plane, _ = plane_with_models()
    everything = [
        {"name": "iris", "version": "2", "state": "READY", "reason": ""},
        {"name": "broken", "state": "FAILED", "reason": "no such file"},
        {"name": "later", "version": "1", "state": "LOADING", "reason": ""},
    ]
    assert plane.repository_index() == everything
    assert plane.repository_index(ready_only=False) == everything
    assert plane.repository_index(ready_only=True) == [everything[0]]


def test_statistics_pass_the_name_and_version_through():
    plane, client = plane_with_models()
    assert plane.statistics() == {"model_stats": [{"name": "all"}]}
    assert plane.statistics("iris", "2") == {"model_stats": [{"name": "iris"}]}
    assert client.calls == [("statistics", (None, None)), ("statistics", ("iris", "2"))]


def test_load_and_unload_reach_the_engine_when_the_admin_policy_allows():
    plane, client = plane_with_models(admin=AdminPolicy(token="s3cret"))
    asyncio.run(plane.load("iris", "Bearer s3cret"))
    asyncio.run(plane.unload("iris", "bearer s3cret"))
    assert client.calls == [("load", "iris"), ("unload", "iris")]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "s3cret"])
def test_load_and_unload_without_the_token_are_unauthorized_and_do_nothing(authorization):
    plane, client = plane_with_models(admin=AdminPolicy(token="s3cret"))
    with pytest.raises(Unauthorized):
        asyncio.run(plane.load("iris", authorization))
    with pytest.raises(Unauthorized):
        asyncio.run(plane.unload("iris", authorization))
    assert client.calls == []


def test_load_and_unload_are_forbidden_when_the_repository_api_is_off():
    plane, client = plane_with_models(admin=AdminPolicy(control_mode="none"))
    with pytest.raises(Forbidden):
        asyncio.run(plane.load("iris", None))
    with pytest.raises(Forbidden):
        asyncio.run(plane.unload("iris", None))
    assert client.calls == []


def test_infer_is_the_clients_own_call():
    plane, client = plane_with_models()
    assert asyncio.run(plane.infer("iris", None, 0, b"{}", None, None)) == "reply"
    assert client.calls == [("infer", ("iris", None, 0, b"{}", None, None))]
