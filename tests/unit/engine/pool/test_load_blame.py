"""``engine/pool/load_blame.py``: the sentence for a load that killed its process, and the
verdicts that keep the same files from being loaded again."""

from __future__ import annotations

import signal

from inferpool.engine.ipc.messages import Loading
from inferpool.engine.pool.load_blame import Verdicts, blame, how_it_ended


def test_how_the_process_ended_in_words() -> None:
    assert how_it_ended(signal.SIGABRT) == "aborted"
    assert how_it_ended(signal.SIGSEGV) == "crashed (SIGSEGV)"
    assert how_it_ended(signal.SIGKILL) == "killed by signal SIGKILL"
    assert how_it_ended(3 << 8) == "exited with code 3"
    assert how_it_ended(signal.SIGKILL, hung=30.0) == "hung for 30 s and was killed"


def test_blame_names_the_file_its_runtime_opened() -> None:
    loading = Loading(name="lgb", version=None, file="/m/lgb/model.txt", library="LightGBM")
    assert blame(loading, signal.SIGABRT) == (
        "model.txt is not a valid LightGBM model (the process aborted while LightGBM parsed "
        "it; the file may be truncated or corrupt)"
    )
    before = Loading(name="custom", version=None)
    assert blame(before, signal.SIGSEGV) == (
        "the process loading it crashed (SIGSEGV) while its runtime's load() ran "
        "(no model file opened yet)"
    )


def test_a_verdict_holds_until_the_files_change() -> None:
    verdicts = Verdicts()
    verdicts.record("lgb", b"files-1", "model.txt is not a valid LightGBM model (...)")
    assert verdicts.reason("lgb", b"files-1") == "model.txt is not a valid LightGBM model (...)"
    assert verdicts.reason("other", b"files-1") is None
    assert verdicts.reason("lgb", b"files-2") is None  # fixed: loaded again
    assert verdicts.reason("lgb", b"files-1") is None  # the verdict is gone
