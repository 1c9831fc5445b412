"""``runtimes.load_errors``: one sentence per library load error, naming the file and the
library; what a file's first bytes say it holds; the listener told before each file."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpool.errors import ModelLoadError
from inferpool.runtimes import load_errors
from inferpool.runtimes.load_errors import crashed, describe, looks_like, reading


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b"\x80\x04\x95", "a pickle"),
        (b"tree\nversion=v4\n", "a LightGBM text model"),
        (b'  {"learner": 1}', "JSON"),
        (b"{L\x00\x00", "UBJSON"),
        (b"PK\x03\x04", "a zip archive"),
        (b"hello world", "text"),
        (b"\x00\x01\x02\xff", None),
    ],
)
def test_first_bytes_tell_the_format(tmp_path: Path, content: bytes, kind: str | None) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    assert looks_like(path) == kind


def test_an_empty_file_is_never_handed_to_the_library(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError) as raised, reading(path, "XGBoost"):
        raise AssertionError("the library ran")  # pragma: no cover - must not run
    assert raised.value.message == "model.json is not a valid XGBoost model (the file is empty)"


def test_a_library_error_becomes_one_sentence_without_its_backtrace(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(b'{"learner": ')
    error = RuntimeError(
        '[05:27:02] /workspace/src/common/json.cc:409: Expecting: ",", got: "EOF"\n'
        "Stack trace:\n  [bt] (0) libxgboost.so(+0x11031e)"
    )
    with pytest.raises(ModelLoadError) as raised, reading(path, "XGBoost"):
        raise error
    assert raised.value.message == (
        'model.json is not a valid XGBoost model (Expecting: ",", got: "EOF"; the file may be '
        "truncated or corrupt)"
    )


def test_a_corrupt_joblib_is_no_longer_a_bare_key_error(tmp_path: Path) -> None:
    path = tmp_path / "model.joblib"
    path.write_bytes(b"\x80\x04\x95garbage")
    assert describe(KeyError(204), path, "scikit-learn") == (
        "model.joblib is not a valid scikit-learn model (the pickle stream breaks off or is "
        "garbled (KeyError: 204); the file may be truncated or corrupt)"
    )


def test_another_format_under_the_right_name_is_said(tmp_path: Path) -> None:
    path = tmp_path / "model.txt"
    path.write_bytes(b'{"learner": {}}')
    message = describe(RuntimeError("Unknown model format"), path, "LightGBM")
    assert (
        message
        == "model.txt is not a valid LightGBM model (it holds JSON, not a LightGBM text model)"
    )


def test_a_pickle_of_a_missing_module_is_said(tmp_path: Path) -> None:
    path = tmp_path / "model.pkl"
    path.write_bytes(b"\x80\x04")
    error = ModuleNotFoundError("No module named 'gone'", name="gone")
    assert "needs the module 'gone', which is not installed" in describe(error, path, "LightGBM")


def test_the_listener_hears_each_file_before_it_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "model.txt"
    path.write_text("tree\n")
    heard: list[tuple[str, str]] = []
    load_errors.listen(lambda file, library: heard.append((file, library)))
    try:
        with reading(path, "LightGBM"):
            assert heard == [(str(path), "LightGBM")]
    finally:
        load_errors.listen(None)


def test_a_crash_sentence_names_the_file_and_the_library() -> None:
    assert crashed("/models/lgb/model.txt", "LightGBM", "aborted") == (
        "model.txt is not a valid LightGBM model (the process aborted while LightGBM parsed "
        "it; the file may be truncated or corrupt)"
    )
