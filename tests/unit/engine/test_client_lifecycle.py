"""``EngineClient.start`` and ``begin_shutdown``: the one start-up and shutdown the server
and the embedded ``Engine`` share, and the readiness they drive."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.client import EngineClient, StartupFailed
from inferpool.engine.states import ModelState
from inferpool.errors import InferpoolError
from inferpool.settings import ModelSettings, ServerSettings


class RecordingClient(EngineClient):
    """Records the hooks in the order they run; a model named ``bad*`` fails to load."""

    def __init__(self, root: Path, **settings: Any) -> None:
        super().__init__(ServerSettings(model_repository=root, **settings))
        self.calls: list[str] = []

    async def _start_workers(self) -> None:
        self.calls.append("start workers")

    def _on_shutdown(self) -> None:
        self.calls.append("on shutdown")

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        self.calls.append(f"load {settings.name}")
        await asyncio.sleep(0)
        if settings.name.startswith("bad"):
            raise InferpoolError("it is bad")
        return {"name": settings.name}

    async def _unload(self, name: str) -> None:
        pass

    async def _infer(self, *args: Any) -> Any:
        raise NotImplementedError


def repository(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir()
        (root / name / "model-settings.json").write_text(json.dumps({"implementation": "m.R"}))
    return root


def test_start_runs_workers_then_models_then_turns_ready(tmp_path: Path) -> None:
    client = RecordingClient(repository(tmp_path, "a"))
    assert not client.started and client.not_ready_reason() == "server is starting up"
    statuses = asyncio.run(client.start())
    assert client.calls == ["start workers", "load a"]
    assert [(s.name, s.state) for s in statuses] == [("a", ModelState.READY)]
    assert client.started and client.not_ready_reason() is None
    with pytest.raises(AttributeError):
        client.started = False  # type: ignore[misc]


def test_begin_shutdown_turns_not_ready_once(tmp_path: Path) -> None:
    client = RecordingClient(repository(tmp_path, "a"))
    asyncio.run(client.start())
    client.begin_shutdown()
    client.begin_shutdown()
    assert client.stopping and client.not_ready_reason() == "server is shutting down"
    asyncio.run(client.close())  # close begins the shutdown too, which has begun
    assert client.calls.count("on shutdown") == 1
    with pytest.raises(AttributeError):
        client.stopping = False  # type: ignore[misc]


def test_close_without_begin_shutdown_begins_it(tmp_path: Path) -> None:
    client = RecordingClient(repository(tmp_path, "a"))
    asyncio.run(client.start())
    asyncio.run(client.close())
    assert client.stopping and client.calls[-1] == "on shutdown"


def test_failed_models_stop_the_start_up_with_exit_on_error(tmp_path: Path) -> None:
    client = RecordingClient(repository(tmp_path, "a", "bad1", "bad2"))
    with pytest.raises(StartupFailed) as caught:
        asyncio.run(client.start())
    assert sorted(caught.value.reasons) == [
        "model 'bad1' failed to load: it is bad",
        "model 'bad2' failed to load: it is bad",
    ]
    assert not client.started


def test_failed_models_leave_it_started_but_not_ready_without_exit_on_error(
    tmp_path: Path,
) -> None:
    client = RecordingClient(repository(tmp_path, "a", "bad"), exit_on_error=False)
    statuses = asyncio.run(client.start())
    assert {s.name: s.state for s in statuses} == {"a": ModelState.READY, "bad": ModelState.FAILED}
    assert client.started
    assert client.not_ready_reason() == "model 'bad' failed to load: it is bad"


def test_a_missing_repository_raises(tmp_path: Path) -> None:
    client = RecordingClient(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        asyncio.run(client.start())
    assert not client.started
