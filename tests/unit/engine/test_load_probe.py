"""The ``--workers 0`` load probe, both ends: the child's report (``worker/probe.py``, with
``worker/announce.py``), the frontend's reading of it (``engine/load_probe.py``), and a
real child that aborts, fails or loads, with runtimes defined here."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.ipc.messages import Loading
from inferpool.engine.load_probe import LoadProbe, _Ask, probed
from inferpool.engine.worker.announce import announcing
from inferpool.engine.worker.probe import probe
from inferpool.errors import ModelLoadError
from inferpool.runtimes import load_errors
from inferpool.runtimes.base import Runtime
from inferpool.settings import ModelSettings

HERE = __name__  # the children import these runtimes by this module's name
BUILT: list[str] = []  # models whose runtime went past reading its artefact (this process)


class ReadsItsFile(Runtime):
    """Reads the file its ``uri`` names, then builds from it (recorded in ``BUILT``)."""

    def load(self) -> None:
        path = Path(self.settings.parameters.uri or "")
        with load_errors.reading(path, "FakeLib"):
            path.read_bytes()
        BUILT.append(self.name)

    def predict(self, payload: Any, outputs: list[str]) -> dict[str, Any]:
        return {}


class AbortsOnItsFile(ReadsItsFile):
    """Its library aborts the process while it parses the file."""

    def load(self) -> None:
        with load_errors.reading(Path(self.settings.parameters.uri or ""), "FakeLib"):
            os.abort()


class Refuses(ReadsItsFile):
    def load(self) -> None:
        raise ValueError("no weights in here\nsecond line")


def document(name: str, runtime: str, uri: Path | None = None) -> dict[str, Any]:
    parameters = {"uri": str(uri)} if uri is not None else {}
    return {"name": name, "implementation": f"{HERE}.{runtime}", "parameters": parameters}


def settings(name: str, runtime: str, uri: Path | None = None) -> ModelSettings:
    return ModelSettings(**document(name, runtime, uri))


# -- the child's report -------------------------------------------------------------------
def test_the_probe_reports_each_load_and_stops_once_the_artefact_is_read(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    out = io.StringIO()
    BUILT.clear()
    probe(
        [
            document("reads", "ReadsItsFile", model),
            document("refuses", "Refuses"),
            {"implementation": "x.Y"},  # no name: settings the server cannot use
        ],
        out,
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records[0] == {"loading": 0, "file": "", "library": ""}
    assert records[1] == {"loading": 0, "file": str(model), "library": "FakeLib"}
    assert records[2] == {"done": 0, "error": None}
    assert BUILT == []  # stopped after reading: the server builds it, not the probe
    assert records[4] == {"done": 1, "error": "ValueError: no weights in here"}
    assert records[-1]["done"] == 2 and "ValidationError" in records[-1]["error"]
    # The listener is gone: a load outside the probe builds (and announces nothing).
    ReadsItsFile(settings("after", "ReadsItsFile", model)).load()
    assert BUILT == ["after"]


def test_announcing_stops_listening_even_when_the_load_raises(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    sent: list[Loading] = []
    with pytest.raises(RuntimeError), announcing(sent.append, "m", "2"):
        with load_errors.reading(model, "FakeLib"):
            pass
        raise RuntimeError("after reading")
    assert sent == [
        Loading(name="m", version="2"),
        Loading(name="m", version="2", file=str(model), library="FakeLib"),
    ]
    with load_errors.reading(model, "FakeLib"):  # no listener any more
        pass
    assert len(sent) == 2


# -- the frontend's reading ---------------------------------------------------------------
def test_only_built_in_runtimes_are_probed() -> None:
    assert probed(ModelSettings(name="m", runtime="sklearn"))
    assert not probed(settings("m", "ReadsItsFile"))


def follow(probe_: LoadProbe, lines: list[dict[str, Any]], eof: bool = True) -> Any:
    async def main() -> Any:
        batch = [_Ask({"name": "a"}), _Ask({"name": "b", "parameters": {"version": "3"}})]
        reader = asyncio.StreamReader()
        for line in lines:
            reader.feed_data(json.dumps(line).encode() + b"\n")
        if eof:
            reader.feed_eof()
        loading, hung = await probe_._follow(batch, reader)
        return loading, hung, [ask.done.result() if ask.done.done() else "open" for ask in batch]

    return asyncio.run(main())


def test_the_load_under_way_when_the_child_stopped_is_the_culprit() -> None:
    lines = [
        {"loading": 0, "file": "", "library": ""},
        {"done": 0, "error": None},
        {"loading": 1, "file": None, "library": None},
        {"loading": 1, "file": "/m/b.txt", "library": "LightGBM"},
    ]
    loading, hung, settled = follow(LoadProbe(timeout=0), lines)
    assert hung is None and settled == [None, "open"]
    assert loading == (1, Loading(name="b", version="3", file="/m/b.txt", library="LightGBM"))


def test_a_failure_the_child_reports_settles_its_ask_and_no_one_is_blamed() -> None:
    lines = [{"loading": 0, "file": "", "library": ""}, {"done": 0, "error": "bad file"}]
    loading, hung, settled = follow(LoadProbe(timeout=0), lines)
    assert loading is None and hung is None and settled == ["bad file", "open"]


def test_a_child_silent_past_the_timeout_hung() -> None:
    started = time.monotonic()
    loading, hung, settled = follow(
        LoadProbe(timeout=0.2), [{"loading": 0, "file": "", "library": ""}], eof=False
    )
    assert hung == 0.2 and loading[0] == 0 and settled == ["open", "open"]
    assert time.monotonic() - started < 5


def test_when_no_child_can_start_the_server_loads_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def cannot(self: LoadProbe, batch: list[_Ask]) -> list[_Ask]:
        raise OSError("no fork today")

    monkeypatch.setattr(LoadProbe, "_child", cannot)

    async def main() -> None:
        checker = LoadProbe(timeout=0)
        await asyncio.gather(
            checker.check(settings("a", "Refuses")), checker.check(settings("b", "Refuses"))
        )

    asyncio.run(main())  # no ModelLoadError: each ask settled as "not probed"


# -- a real child -------------------------------------------------------------------------
def test_a_crash_is_blamed_on_its_file_and_a_new_child_loads_the_rest(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> list[BaseException | None]:
        checker = LoadProbe(timeout=60)
        try:
            results = await asyncio.gather(
                checker.check(settings("aborts", "AbortsOnItsFile", model)),
                checker.check(settings("refuses", "Refuses")),
                checker.check(settings("reads", "ReadsItsFile", model)),
                return_exceptions=True,
            )
        finally:
            await checker.close()
        assert checker.children == 2  # the loads asked together share a child until it dies
        return results

    aborted, refused, read = asyncio.run(main())
    assert isinstance(aborted, ModelLoadError)
    assert aborted.message == (
        "model.bin is not a valid FakeLib model (the process aborted while FakeLib parsed "
        "it; the file may be truncated or corrupt)"
    )
    assert isinstance(refused, ModelLoadError)
    assert refused.message == "ValueError: no weights in here"
    assert read is None
