"""Warm-up samples: their schema in model-settings.json, the requests ``warm_up`` builds
(generated inputs, explicit values, a request file) and runs through the worker path, and
the load errors a bad sample gives."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool import Runtime
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.warmup import warm_up
from inferpool.errors import ModelLoadError
from inferpool.protocol import limits
from inferpool.protocol.datatypes import DATATYPES, NUMPY_BY_DATATYPE
from inferpool.settings import ModelSettings, read_model_settings

X = {"name": "x", "datatype": "FP32", "shape": [-1, 3]}


class Recorder(Runtime):
    """Records the payload of every predict (a dict of decoded inputs); refuses a row
    whose first value is negative as a library would (``input_errors``: a 400)."""

    accepts = "dict"
    input_errors = (ValueError,)

    def load(self) -> None:
        self.payloads: list[dict[str, np.ndarray]] = []
        self.metrics.counter("warmup_test_loads", "a custom metric of the model")

    def predict(self, payload: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        recorded = {name: np.array(value) for name, value in payload.items()}
        self.payloads.append(recorded)
        first = next(iter(recorded.values()))
        if first.dtype.kind in "iuf" and (first.reshape(len(first), -1)[:, 0] < 0).any():
            raise ValueError("negative first value")
        return {outputs[0]: np.zeros(len(first))}


_MADE: list[LoadedModel] = []


@pytest.fixture(autouse=True)
def _close_metrics() -> Iterator[None]:
    """Each model's custom metrics leave this process's registry after its test."""
    yield
    for model in _MADE:
        model.runtime.metrics.close()
    _MADE.clear()


def recorder(folder: Path | None = None, **settings: Any) -> LoadedModel:
    settings.setdefault("inputs", [X])
    model = ModelSettings(
        name="rec",
        outputs=[{"name": "y", "datatype": "FP64", "shape": [-1]}],
        folder=folder,
        **settings,
    )
    runtime = Recorder(model)
    runtime.load()
    _MADE.append(LoadedModel(model, runtime))
    return _MADE[-1]


def payloads(model: LoadedModel) -> list[dict[str, np.ndarray]]:
    assert isinstance(model.runtime, Recorder)
    return model.runtime.payloads


def settings_error(tmp_path: Path, warmup: Any) -> str:
    """The one-line error of a model-settings.json with that ``warmup``."""
    (tmp_path / "model-settings.json").write_text(
        json.dumps({"name": "m", "inputs": [X], "warmup": warmup})
    )
    with pytest.raises(ValueError) as caught:
        read_model_settings(tmp_path, "m")
    return str(caught.value)


# -- schema ---------------------------------------------------------------------------------
def test_a_sample_has_defaults_and_reads_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    document = {"name": "m", "inputs": [X], "warmup": [{"name": "plain"}]}
    (tmp_path / "model-settings.json").write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING):
        settings = read_model_settings(tmp_path, "m")
    sample = settings.warmup[0]
    assert (sample.name, sample.count, sample.batch_size) == ("plain", 1, 1)
    assert sample.inputs is None and sample.request_file is None
    assert not caplog.records  # "warmup" is a key of ours, not an unknown one
    # The worker gets the settings as JSON: they read back the same.
    assert ModelSettings(**settings.model_dump(mode="json")) == settings


@pytest.mark.parametrize(
    ("warmup", "error"),
    [
        ([{"name": "a", "count": 1001}], r"warmup\.0\.count: .*less than or equal to 1000"),
        ([{"name": "a", "count": 0}], r"warmup\.0\.count: .*greater than or equal to 1"),
        ([{"name": "a", "count": True}], r"warmup\.0\.count: .*valid integer"),
        ([{"name": "a", "batch_size": 65537}], r"warmup\.0\.batch_size: .*65536"),
        ([{"name": "a", "bacth_size": 2}], r"warmup\.0\.bacth_size: Extra inputs"),
        ([{"count": 2}], r"warmup\.0\.name: Field required"),
        ([{"name": "a"}, {"name": "a"}], r"warmup: .*names must differ: a repeated"),
        (
            [{"name": "a", "request_file": "r.json", "inputs": [{**X, "data": "zero"}]}],
            "give inputs or a request_file, not both",
        ),
        ([{"name": "a", "request_file": "/etc/passwd"}], "must be a path inside the model"),
        ([{"name": "a", "request_file": "../r.json"}], "must be a path inside the model"),
        ([{"name": "a", "request_file": "r.json", "batch_size": 8}], "a request file holds"),
        ([{"name": "a", "inputs": []}], r"warmup\.0\.inputs: .*at least 1 item"),
        (
            [{"name": "a", "inputs": [{**X, "datatype": "FP128", "data": "zero"}]}],
            "unknown datatype 'FP128'",
        ),
        ([{"name": "a", "inputs": [{**X, "data": "ones"}]}], r"warmup\.0\.inputs\.0\.data"),
        (
            [{"name": "a", "inputs": [{**X, "shape": [2, -2], "data": "zero"}]}],
            "dimension below -1",
        ),
        # A lying sample: its shape says more values than it gives.
        (
            [{"name": "a", "inputs": [{**X, "shape": [1000000, 3], "data": [[1, 2, 3]]}]}],
            r"shape \[1000000, 3\] holds 3000000 values, data has 3",
        ),
        (
            [{"name": "a", "inputs": [{**X, "data": [[1, 2, 3]]}]}],
            r"explicit data needs a shape without -1",
        ),
    ],
)
def test_a_bad_sample_is_a_settings_error(tmp_path: Path, warmup: Any, error: str) -> None:
    message = settings_error(tmp_path, warmup)
    assert message.startswith(str(tmp_path / "model-settings.json") + ": warmup")
    assert re.search(error, message), message


# -- generated inputs -----------------------------------------------------------------------
def test_without_inputs_a_sample_sends_zeros_of_the_declared_inputs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inputs = [X, {"name": "flags", "datatype": "BOOL", "shape": [-1, 2, -1]}]
    model = recorder(inputs=inputs, warmup=[{"name": "z", "count": 3, "batch_size": 5}])
    with caplog.at_level(logging.INFO, logger="inferpool.engine.worker.warmup"):
        warm_up(model, "in a test")
    seen = payloads(model)
    assert len(seen) == 3  # count requests, each predicted alone
    for payload in seen:
        # -1 first: the batch size; any other -1: 1.
        assert payload["x"].shape == (5, 3) and payload["x"].dtype == np.float32
        assert payload["flags"].shape == (5, 2, 1) and payload["flags"].dtype == np.bool_
        assert not payload["x"].any() and not payload["flags"].any()
    [record] = caplog.records
    assert model.runtime.metrics.instance != 0  # a warmed replica keeps its custom metrics
    assert re.fullmatch(
        r"model 'rec': warm-up in a test: 1 samples, 3 requests in [\d.]+ ms "
        r"\(first [\d.]+ ms, slowest [\d.]+ ms, median [\d.]+ ms\)",
        record.getMessage(),
    )


def test_random_inputs_are_the_same_on_every_replica() -> None:
    inputs = [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3], "data": "random"},
        {"name": "n", "datatype": "INT8", "shape": [4], "data": "random"},
        {"name": "s", "datatype": "BYTES", "shape": [-1], "data": "random"},
    ]
    samples = [{"name": "r", "batch_size": 64, "inputs": inputs}]
    first, second = recorder(warmup=samples), recorder(warmup=samples)
    warm_up(first, "in one")
    warm_up(second, "in another")
    [a], [b] = payloads(first), payloads(second)
    for name in ("x", "n", "s"):
        np.testing.assert_array_equal(a[name], b[name])
    assert a["x"].shape == (64, 3) and len(np.unique(a["x"])) > 100
    assert a["n"].dtype == np.int8 and a["s"].shape == (64,)
    assert a["x"].min() >= 0 and a["x"].max() < 1


@pytest.mark.parametrize("data", ["zero", "random"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_is_generated_and_decoded(datatype: str, data: str) -> None:
    inputs = [{"name": "x", "datatype": datatype, "shape": [-1, 2], "data": data}]
    model = recorder(inputs=[], warmup=[{"name": "g", "batch_size": 3, "inputs": inputs}])
    warm_up(model, "in a test")
    [payload] = payloads(model)
    assert payload["x"].shape == (3, 2)
    if datatype != "BYTES":
        assert payload["x"].dtype == NUMPY_BY_DATATYPE[datatype]


def test_explicit_values_reach_the_model_as_given() -> None:
    inputs = [{**X, "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}]
    model = recorder(warmup=[{"name": "e", "count": 2, "inputs": inputs}])
    warm_up(model, "in a test")
    assert len(payloads(model)) == 2
    np.testing.assert_array_equal(payloads(model)[0]["x"], [[1, 2, 3], [4, 5, 6]])


def test_every_sample_runs_its_count_in_order() -> None:
    samples = [
        {"name": "one", "count": 2, "batch_size": 1},
        {"name": "two", "count": 3, "batch_size": 7},
    ]
    model = recorder(warmup=samples)
    warm_up(model, "in a test")
    assert [len(p["x"]) for p in payloads(model)] == [1, 1, 7, 7, 7]


def test_a_model_without_samples_sees_no_request(caplog: pytest.LogCaptureFixture) -> None:
    model = recorder()
    with caplog.at_level(logging.INFO):
        warm_up(model, "in a test")
    assert payloads(model) == [] and not caplog.records


# -- request files --------------------------------------------------------------------------
def request_document(rows: list[list[float]]) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(rows), 3], "data": rows}]}


def test_a_request_file_is_sent_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    document = request_document([[7, 8, 9]])
    (tmp_path / "warmup" / "r.json").write_text(json.dumps(document))
    model = recorder(tmp_path, warmup=[{"name": "f", "request_file": "warmup/r.json"}])
    warm_up(model, "in a test")
    [payload] = payloads(model)
    np.testing.assert_array_equal(payload["x"], [[7, 8, 9]])


@pytest.fixture
def small_body_limit() -> Iterator[int]:
    before = limits.current()
    limits.configure(limits.DecodeLimits(max_body_bytes=100))
    yield 100
    limits.configure(before)


def test_a_request_file_over_the_body_limit_fails_the_load(
    tmp_path: Path, small_body_limit: int
) -> None:
    (tmp_path / "r.json").write_text(json.dumps(request_document([[1, 2, 3]] * 20)))
    model = recorder(tmp_path, warmup=[{"name": "big", "request_file": "r.json"}])
    with pytest.raises(ModelLoadError) as caught:
        warm_up(model, "in a test")
    assert caught.value.message == (
        "warm-up 'big' failed: request_file 'r.json' is over the limit of 100 bytes "
        "(max_body_bytes)"
    )
    assert payloads(model) == []


def test_a_request_file_must_stay_in_the_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.json").write_text(json.dumps(request_document([[1, 2, 3]])))
    os.symlink(tmp_path / "secret.json", folder / "link.json")
    model = recorder(folder, warmup=[{"name": "s", "request_file": "link.json"}])
    with pytest.raises(ModelLoadError, match=r"request_file 'link\.json' is outside the model"):
        warm_up(model, "in a test")
    missing = recorder(folder, warmup=[{"name": "m", "request_file": "nowhere.json"}])
    not_found = r"^warm-up 'm' failed: request_file 'nowhere\.json' is not a file"
    with pytest.raises(ModelLoadError, match=not_found):
        warm_up(missing, "in a test")
    assert payloads(model) == payloads(missing) == []


def test_a_request_file_that_is_no_request_fails_the_load(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text('{"inputs": [')
    model = recorder(tmp_path, warmup=[{"name": "broken", "request_file": "r.json"}])
    with pytest.raises(ModelLoadError, match=r"^warm-up 'broken' failed: .*JSON"):
        warm_up(model, "in a test")


# -- failures -------------------------------------------------------------------------------
def test_a_refused_sample_fails_the_load_with_the_model_reason() -> None:
    inputs = [{**X, "shape": [1, 3], "data": [-1, 0, 0]}]
    samples = [{"name": "ok", "count": 2}, {"name": "negative", "inputs": inputs}]
    model = recorder(warmup=samples)
    with pytest.raises(ModelLoadError) as caught:
        warm_up(model, "in a test")
    assert caught.value.message == (
        "warm-up 'negative' failed: model 'rec' rejected input 'x': negative first value"
    )
    assert len(payloads(model)) == 3  # the samples before it ran
    # The replica is discarded: its custom metrics are reported no more.
    assert model.runtime.metrics.instance == 0


def test_a_model_that_declares_no_inputs_needs_the_sample_inputs() -> None:
    model = recorder(inputs=[], warmup=[{"name": "blind"}])
    with pytest.raises(ModelLoadError) as caught:
        warm_up(model, "in a test")
    assert caught.value.message == (
        "warm-up 'blind' failed: model 'rec' declares no inputs: give the sample's inputs "
        "or a request_file"
    )


def test_generated_inputs_over_the_server_limits_fail_before_they_are_made() -> None:
    big = [{"name": "x", "datatype": "FP64", "shape": [-1, 4096], "data": "zero"}]
    model = recorder(warmup=[{"name": "huge", "batch_size": 65536, "inputs": big}])
    with pytest.raises(ModelLoadError) as caught:
        warm_up(model, "in a test")
    assert caught.value.message.startswith(
        "warm-up 'huge' failed: input 'x': shape [65536, 4096] declares 268435456 elements, "
        "over the limit of 67108864 (max_tensor_elements)"
    )
    assert payloads(model) == []
