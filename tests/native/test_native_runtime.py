"""The native runtime in this process: the request's buffer handed over without a copy,
conversions only when needed, return codes as 400/500 with the library's message, calls
serialised unless the library says it is reentrant, and load errors in one sentence."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.runtimes.native import NativeRuntime
from inferpool.settings import ModelSettings
from tests.native.native_models import linear_model, source_model
from tests.native.probes import BAD_JSON, INIT_FAILS, NO_INPUT, NO_PREDICT, PROBE


def loaded(folder: Path) -> NativeRuntime:
    runtime = NativeRuntime(ModelSettings(name=folder.name, folder=folder))
    runtime.load()
    return runtime


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> NativeRuntime:
    return loaded(source_model(tmp_path_factory.mktemp("probe") / "probe", PROBE))


def test_the_request_buffer_is_handed_over_without_a_copy(probe: NativeRuntime) -> None:
    rows = np.array([[1.0, 2.0], [3.0, 4.0]])
    (answer,) = probe.predict(rows, ["address"]).values()
    assert answer.dtype == np.int64 and answer.shape == (2, 2)
    assert answer[:, 0].tolist() == [rows.ctypes.data] * 2
    assert answer[:, 1].tolist() == [2, 2]  # INFERPOOL_FP64


def test_other_layouts_and_datatypes_are_converted_once(probe: NativeRuntime) -> None:
    fortran = np.asfortranarray(np.array([[1.0, 2.0], [3.0, 4.0]]))
    single = np.array([[1.0, 2.0]], dtype=np.float32)  # the library takes FP64 only
    for rows in (fortran, single):
        (answer,) = probe.predict(rows, ["address"]).values()
        assert answer[0, 0] != rows.ctypes.data
        assert answer[0, 1] == 2


def test_a_datatype_the_library_accepts_is_not_converted(tmp_path: Path) -> None:
    runtime = loaded(linear_model(tmp_path / "linear", 0.5, np.array([1.0, -2.0, 3.0])))
    rows = np.array([[1.0, 1.0, 1.0], [0.5, 0.25, 2.0]], dtype=np.float32)
    (answer,) = runtime.predict(rows, ["predict"]).values()
    assert answer.shape == (2,)
    np.testing.assert_allclose(answer, 0.5 + rows.astype(np.float64) @ [1.0, -2.0, 3.0])
    assert runtime.rows_independent and runtime.thread_safe


def test_return_codes_are_400_and_500_with_the_library_message(probe: NativeRuntime) -> None:
    with pytest.raises(BadRequest, match=r"rejected its input: negative first value -1"):
        probe.predict(np.array([[-1.0, 0.0]]), ["address"])
    with pytest.raises(ModelError, match=r"failed: the model overflowed on 2000") as failure:
        probe.predict(np.array([[2000.0, 0.0]]), ["address"])
    assert failure.value.status == 500


def test_a_matrix_of_other_columns_is_a_400_before_the_call(probe: NativeRuntime) -> None:
    with pytest.raises(BadRequest, match="expects 2 features, got 3"):
        probe.validate(np.zeros((1, 3)))


def test_the_metadata_comes_from_the_library(probe: NativeRuntime) -> None:
    document = probe.metadata()
    assert document["platform"] == "native"
    assert document["inputs"] == [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}]
    assert document["outputs"] == [{"name": "address", "datatype": "INT64", "shape": [-1, 2]}]
    # The library's code and data count in the model's memory budget.
    assert probe.native_bytes() == probe.path.stat().st_size > 0


def most_at_once(tmp_path: Path, thread_safe: str) -> int:
    """The most calls of the probe that ran at once, from 4 threads of 3 calls each."""
    flags = [f'-DTHREAD_SAFE="{thread_safe}"', "-DSLEEP_US=30000"]
    runtime = loaded(source_model(tmp_path / f"probe-{thread_safe}", PROBE, *flags))
    start = threading.Barrier(4)

    def calls() -> None:
        start.wait()
        for _ in range(3):
            runtime.predict(np.array([[1.0, 2.0]]), ["address"])

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return int(runtime.library.probe_max_concurrency())


def test_a_library_not_declared_reentrant_is_called_once_at_a_time(tmp_path: Path) -> None:
    assert most_at_once(tmp_path, "false") == 1
    # The same library declared reentrant runs side by side (ctypes released the GIL).
    assert most_at_once(tmp_path, "true") > 1


def test_a_second_model_of_one_file_has_globals_of_its_own(tmp_path: Path) -> None:
    folder = linear_model(tmp_path / "first", 1.0, np.array([2.0]))
    first = loaded(folder)
    (folder / "coefficients.txt").write_text("10.0 3.0")  # read by the second one's init
    second = loaded(folder)
    rows = np.array([[1.0]])
    assert first.predict(rows, ["predict"])["predict"].tolist() == [3.0]
    assert second.predict(rows, ["predict"])["predict"].tolist() == [13.0]


@pytest.mark.parametrize(
    ("source", "flags", "sentence"),
    [
        (NO_PREDICT, (), r"model\.so does not export inferpool_model_predict \(the native ABI"),
        (BAD_JSON, (), r"model\.so's metadata is not valid JSON \("),
        (PROBE, ("-DABI=7",), r"model\.so was built for inferpool's native ABI 7, this server "),
        (INIT_FAILS, (), r"model\.so failed to initialise: no weights in /"),
        (NO_INPUT, (), r"model\.so's metadata does not describe one input and one output"),
    ],
    ids=["symbol-missing", "json-invalid", "abi-mismatch", "init-fails", "no-input"],
)
def test_a_broken_library_is_one_sentence(
    tmp_path: Path, source: str, flags: tuple[str, ...], sentence: str
) -> None:
    folder = source_model(tmp_path / "broken", source, *flags)
    with pytest.raises(ModelLoadError, match=sentence) as failure:
        loaded(folder)
    assert "\n" not in str(failure.value)


def test_a_file_that_is_no_library_is_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "model.so").write_text("not an ELF file")
    with pytest.raises(ModelLoadError, match=r"^model\.so cannot be loaded as a shared library: "):
        loaded(folder)
