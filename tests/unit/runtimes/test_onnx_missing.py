"""Without onnxruntime (the default environment), a ``model.onnx`` folder is recognised
as an ONNX model and fails with one sentence naming the extra to install."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inferpool.errors import RuntimeNotFound
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from tests.support.runtimes import load

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is not None,
    reason="onnxruntime is installed here: tests/runtimes/ serves ONNX models",
)


def test_a_model_onnx_folder_names_the_extra(tmp_path: Path) -> None:
    folder = tmp_path / "graph"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"\x08\x07")  # never read: the import fails first

    with pytest.raises(RuntimeNotFound) as failure:
        load(folder)

    message = str(failure.value)
    assert message == "the 'onnx' runtime needs onnxruntime: pip install inferpool[onnx]"
    assert "\n" not in message


def test_any_onnx_file_named_by_uri_chooses_the_runtime(tmp_path: Path) -> None:
    from inferpool.settings import ModelSettings

    (tmp_path / "classifier.onnx").write_bytes(b"")
    settings = ModelSettings(name="m", parameters={"uri": "./classifier.onnx"}, folder=tmp_path)

    assert runtime_name_for(settings) == "onnx"
    # Sessions start thread pools and importing onnxruntime starts a thread: the template
    # that forks the workers neither loads ONNX models nor imports the library.
    assert RUNTIMES["onnx"].fork_safe is False
    assert RUNTIMES["onnx"].preload == ()
