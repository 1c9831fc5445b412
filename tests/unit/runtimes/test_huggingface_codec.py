"""The HuggingFace runtime's settings and codec, without transformers or torch: MLServer's
``parameters.extra`` read and its folders checked (each failure one sentence naming the
folder), a request's inputs as the pipeline call's arguments by content type, answers as
MLServer's JSON-list output, and the registry's entry (MLServer's name, never preloaded)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from inferpool.errors import BadRequest, ModelLoadError, RuntimeNotFound
from inferpool.protocol.types import InferenceRequest, Tensor
from inferpool.runtimes.huggingface_codec import call_arguments, encode_answer, task_inputs
from inferpool.runtimes.huggingface_settings import read_settings
from inferpool.runtimes.registry import RUNTIMES, runtime_class, runtime_name_for
from inferpool.settings import ModelSettings


def saved_model(folder: Path, architecture: str = "BertForSequenceClassification") -> Path:
    """What save_pretrained leaves that the settings check: config.json and a tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def settings(folder: Path, **extra: object) -> ModelSettings:
    return ModelSettings(
        name="m",
        implementation="mlserver_huggingface.HuggingFaceRuntime",
        parameters={"extra": extra},
        folder=folder,
    )


def text(name: str, *values: str, content_type: str | None = None) -> Tensor:
    data = np.array([value.encode() for value in values], dtype=object)
    parameters = {"content_type": content_type} if content_type else {}
    return Tensor(name, "BYTES", (len(values),), data, parameters)


def test_mlserver_settings_name_the_runtime_and_its_folders(tmp_path: Path) -> None:
    saved_model(tmp_path / "weights")
    saved_model(tmp_path / "tok")
    model = settings(
        tmp_path,
        task="text-generation",
        pretrained_model="./weights",
        pretrained_tokenizer="./tok",
        inference_kwargs={"max_new_tokens": 4},
    )
    model = model.model_copy(update={"max_batch_size": 8})
    assert runtime_name_for(model) == "huggingface"
    hf = read_settings(model)
    assert (hf.task, hf.model_folder, hf.tokenizer_folder) == (
        "text-generation",
        tmp_path / "weights",
        tmp_path / "tok",
    )
    assert hf.inference_kwargs == {"max_new_tokens": 4}
    assert hf.batch_size == 8  # MLServer's max_batch_size is the pipeline's batch size


def test_a_plain_folder_reads_its_task_from_config(tmp_path: Path) -> None:
    for architecture, task in (
        ("BertForTokenClassification", "token-classification"),
        ("GPT2LMHeadModel", "text-generation"),
        ("BertModel", "feature-extraction"),
    ):
        folder = saved_model(tmp_path / architecture, architecture)
        plain = ModelSettings(name="m", runtime="huggingface", folder=folder)
        assert read_settings(plain).task == task
        assert read_settings(plain).model_folder == folder


def test_a_missing_folder_is_one_sentence_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as failure:
        read_settings(settings(tmp_path, task="text-classification", pretrained_model="bert-base"))
    message = str(failure.value)
    assert str(tmp_path / "bert-base") in message and "hub is never reached" in message
    assert "\n" not in message


def test_a_missing_tokenizer_is_one_sentence_naming_the_folder(tmp_path: Path) -> None:
    folder = saved_model(tmp_path / "weights")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError) as failure:
        read_settings(settings(tmp_path, task="text-classification", pretrained_model="weights"))
    assert str(failure.value).startswith(f"no tokenizer in {folder} ")
    assert "pretrained_tokenizer" in str(failure.value)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"optimum_model": True}, "optimum_model is not supported"),
        ({"device": "cuda:0"}, "only 'cpu'"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"inference_kwargs": [1]}, "inference_kwargs must be a JSON object"),
        ({"tasks": "x"}, "unknown HuggingFace setting 'tasks'"),
    ],
)
def test_bad_settings_are_one_sentence(tmp_path: Path, extra: dict, words: str) -> None:
    saved_model(tmp_path)
    with pytest.raises(ModelLoadError, match=words):
        read_settings(settings(tmp_path, task="text-classification", **extra))


def test_args_are_positional_and_other_inputs_keywords() -> None:
    request = InferenceRequest([text("args", "hello"), text("context", "a", "b")])
    assert call_arguments(request, {"top_k": 2}) == (["hello"], {"top_k": 2, "context": ["a", "b"]})
    # array_inputs: one list argument, a batch (MLServer's name for it).
    request = InferenceRequest([text("array_inputs", "one", "two")])
    assert call_arguments(request, {}) == ([["one", "two"]], {})


def test_inputs_decode_by_their_content_type() -> None:
    number = Tensor("max_new_tokens", "INT64", (1,), np.array([5]))
    request = InferenceRequest(
        [
            text("args", '{"text": "hi"}', content_type="hg_json"),
            text("items", '{"a": 1}', '{"b": 2}', content_type="hg_jsonlist"),
            number,
        ]
    )
    args, kwargs = call_arguments(request, {})
    assert args == [{"text": "hi"}]
    assert kwargs == {"items": [{"a": 1}, {"b": 2}], "max_new_tokens": 5}


def test_unreadable_inputs_are_400s() -> None:
    with pytest.raises(BadRequest, match="content type 'pillow_image' is not one"):
        call_arguments(InferenceRequest([text("args", "x", content_type="pillow_image")]), {})
    with pytest.raises(BadRequest, match="not valid hg_json"):
        call_arguments(InferenceRequest([text("args", "{", content_type="hg_json")]), {})
    with pytest.raises(BadRequest, match="no input"):
        call_arguments(InferenceRequest([]), {})


def test_answers_are_mlserver_json_lists() -> None:
    answer = [{"label": "POSITIVE", "score": np.float32(0.5)}, {"label": "NEGATIVE", "score": 0.25}]
    tensor = encode_answer(answer)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("output", "BYTES", (2, 1))
    assert tensor.parameters == {"content_type": "hg_jsonlist"}
    assert tensor.data.reshape(-1).tolist() == [
        b'{"label": "POSITIVE", "score": 0.5}',
        b'{"label": "NEGATIVE", "score": 0.25}',
    ]
    # One answer (a dict) is a list of one; arrays are lists.
    single = encode_answer({"answer": "paris", "vector": np.array([1.5, 2.0])})
    assert single.shape == (1, 1)
    assert json.loads(single.data[0, 0]) == {"answer": "paris", "vector": [1.5, 2.0]}


def test_metadata_inputs_per_task() -> None:
    assert [spec.name for spec in task_inputs("question-answering")] == ["question", "context"]
    assert [spec.name for spec in task_inputs("text-classification")] == ["args"]


def test_the_registry_entry_is_mlservers_and_never_preloaded() -> None:
    entry = RUNTIMES["huggingface"]
    assert entry.mlserver == "mlserver_huggingface.HuggingFaceRuntime"
    # torch's thread pools do not survive a fork: each worker loads after it.
    assert (entry.fork_safe, entry.preload, entry.extra) == (False, (), "huggingface")


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is not None, reason="transformers is installed"
)
def test_without_transformers_the_model_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(RuntimeNotFound, match=r"pip install inferpool\[huggingface\]"):
        runtime_class(settings(saved_model(tmp_path), task="text-classification"))


def test_mlservers_environment_variables_fill_what_the_settings_leave_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = saved_model(tmp_path / "weights", "GPT2LMHeadModel")
    monkeypatch.setenv("MLSERVER_MODEL_HUGGINGFACE_TASK", "text-classification")
    monkeypatch.setenv("mlserver_model_huggingface_pretrained_model", str(folder))
    monkeypatch.setenv("MLSERVER_MODEL_HUGGINGFACE_MODEL_KWARGS", '{"torch_dtype": "float32"}')
    monkeypatch.setenv("MLSERVER_MODEL_HUGGINGFACE_INTRA_OP_THREADS", "3")
    monkeypatch.setenv("MLSERVER_MODEL_HUGGINGFACE_NOT_A_FIELD", "ignored")
    read = read_settings(settings(tmp_path))
    assert (read.task, read.model_folder) == ("text-classification", folder)
    assert read.model_kwargs == {"torch_dtype": "float32"}
    assert read.intra_op_threads == 3
    # The file's own value wins over the variable.
    assert read_settings(settings(tmp_path, task="feature-extraction")).task == "feature-extraction"


def test_seldons_parameters_override_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved_model(tmp_path / "weights")
    parameters = [
        {"name": "task", "value": "token-classification", "type": "STRING"},
        {"name": "inter_op_threads", "value": "2", "type": "INT"},
        {"name": "model_uri", "value": "gs://elsewhere", "type": "STRING"},  # no setting
    ]
    monkeypatch.setenv("PREDICTIVE_UNIT_PARAMETERS", json.dumps(parameters))
    read = read_settings(settings(tmp_path, task="text-classification", pretrained_model="weights"))
    assert (read.task, read.inter_op_threads) == ("token-classification", 2)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("MLSERVER_MODEL_HUGGINGFACE_INTRA_OP_THREADS", "many", "not a valid intra_op_threads"),
        ("MLSERVER_MODEL_HUGGINGFACE_MODEL_KWARGS", "[1]", "not a valid model_kwargs"),
        ("PREDICTIVE_UNIT_PARAMETERS", '{"task": "text-classification"}', "is not a JSON list"),
        ("PREDICTIVE_UNIT_PARAMETERS", '[{"name": "task", "type": "STRING"}]', "is not a JSON"),
        ("PREDICTIVE_UNIT_PARAMETERS", '[{"name": "a", "value": "1", "type": "X"}]', "type 'X'"),
    ],
)
def test_unreadable_variables_are_one_sentence_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
) -> None:
    saved_model(tmp_path / "weights")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ModelLoadError, match=words) as failed:
        read_settings(settings(tmp_path, pretrained_model="weights"))
    assert "\n" not in str(failed.value)
