"""The settings of a HuggingFace model, read as MLServer's ``HuggingFaceRuntime`` reads
them (``parameters.extra``: ``task``, ``pretrained_model``, ``pretrained_tokenizer``,
``model_kwargs``, ``framework``, ``device``, ``inter_op_threads``, ``intra_op_threads``),
and the local folders they name; without importing transformers or torch (the unit tests
run where neither is installed).

There is no model hub here: ``pretrained_model`` (else ``parameters.uri``, else the
model's own folder) must be a local folder written by ``save_pretrained``, and a name
that is not one fails the model with the folder looked for. Beyond MLServer:
``inference_kwargs`` (keyword arguments of every pipeline call, such as
``max_new_tokens``) and ``batch_size`` (else ``max_batch_size``, as MLServer takes it);
a missing ``task`` is read from the model's ``config.json`` (its architecture). The
environment's ``MLSERVER_MODEL_HUGGINGFACE_*`` and ``PREDICTIVE_UNIT_PARAMETERS`` are read as
MLServer reads them (huggingface_environment.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferpool.errors import ModelLoadError
from inferpool.runtimes.huggingface_environment import merged_extra
from inferpool.settings import ModelSettings

# The tasks MLServer's users use most; any other pipeline task transformers knows loads too.
COMMON_TASKS = (
    "text-classification",
    "token-classification",
    "question-answering",
    "text-generation",
    "feature-extraction",
)
# The files a saved tokenizer leaves in its folder (any one of them will do).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "tokenizer.model",
)
# A model's architecture (config.json's ``architectures``) by its class's suffix: the task
# its head answers, for settings that name none.
_TASK_BY_HEAD = (
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForCausalLM", "text-generation"),
    ("LMHeadModel", "text-generation"),
    ("Model", "feature-extraction"),
)
_KNOWN_KEYS = frozenset(
    {
        "task",
        "task_suffix",
        "pretrained_model",
        "pretrained_tokenizer",
        "model_kwargs",
        "framework",
        "device",
        "optimum_model",
        "inter_op_threads",
        "intra_op_threads",
        "inference_kwargs",
        "batch_size",
    }
)


@dataclass(frozen=True, slots=True)
class HuggingFaceSettings:
    """What the runtime needs to build its pipeline."""

    task: str
    model_folder: Path
    tokenizer_folder: Path
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    inference_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 1
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None


def read_settings(settings: ModelSettings) -> HuggingFaceSettings:
    """The model's HuggingFace settings, its folders checked; ModelLoadError (one
    sentence) for a folder that is not there, no tokenizer, or a setting of the wrong kind."""
    extra = merged_extra(settings.parameters.extra or {})
    unknown = sorted(set(extra) - _KNOWN_KEYS)
    if unknown:
        raise ModelLoadError(
            f"unknown HuggingFace setting {', '.join(map(repr, unknown))} in parameters.extra "
            f"(known: {', '.join(sorted(_KNOWN_KEYS))})"
        )
    if extra.get("optimum_model"):
        raise ModelLoadError("optimum_model is not supported: serve the model with transformers")
    if extra.get("framework") not in (None, "pt"):
        raise ModelLoadError(f"framework {extra['framework']!r} is not supported: only 'pt'")
    if extra.get("device") not in (None, "cpu", -1):
        raise ModelLoadError(f"device {extra['device']!r} is not supported: only 'cpu'")
    model_folder = _folder(settings, extra.get("pretrained_model"), "pretrained_model")
    tokenizer = extra.get("pretrained_tokenizer")
    tokenizer_folder = (
        _folder(settings, tokenizer, "pretrained_tokenizer") if tokenizer else model_folder
    )
    if not any((tokenizer_folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"no tokenizer in {tokenizer_folder} (none of {', '.join(TOKENIZER_FILES)}): "
            "save the tokenizer there with save_pretrained or name its folder in "
            "parameters.extra.pretrained_tokenizer"
        )
    task = _string(extra, "task") or task_from_config(model_folder)
    if extra.get("task") == "translation":
        task += _string(extra, "task_suffix")
    batch_size = extra.get("batch_size", settings.max_batch_size or 1)
    return HuggingFaceSettings(
        task=task,
        model_folder=model_folder,
        tokenizer_folder=tokenizer_folder,
        model_kwargs=_mapping(extra, "model_kwargs"),
        inference_kwargs=_mapping(extra, "inference_kwargs"),
        batch_size=_count(batch_size, "batch_size"),
        intra_op_threads=_optional_count(extra, "intra_op_threads"),
        inter_op_threads=_optional_count(extra, "inter_op_threads"),
    )


def _folder(settings: ModelSettings, named: Any, key: str) -> Path:
    """The local folder ``named`` (relative to the model's folder), else ``uri``'s, else
    the model's own folder; it must hold a saved model (or tokenizer)."""
    if named is not None and not isinstance(named, str):
        raise ModelLoadError(f"parameters.extra.{key} must be a folder's path, not {named!r}")
    where = named or settings.parameters.uri
    if where:
        folder = settings.resolve(where)
    elif settings.folder is not None:
        folder = settings.folder
    else:
        raise ModelLoadError(f"model '{settings.name}' names no pretrained_model, uri or folder")
    if not folder.is_dir():
        raise ModelLoadError(
            f"{key} {where or str(folder)!r}: no folder {folder} (models are read from local "
            "folders written by save_pretrained; the HuggingFace hub is never reached)"
        )
    if key == "pretrained_model" and not (folder / "config.json").is_file():
        raise ModelLoadError(f"no config.json in {folder}: not a folder written by save_pretrained")
    return folder


def task_from_config(folder: Path) -> str:
    """The task of a saved model's head (its config.json's first architecture)."""
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures")
        name = str(architectures[0])
    except (OSError, ValueError, AttributeError, TypeError, IndexError, KeyError):
        name = ""
    for suffix, task in _TASK_BY_HEAD:
        if name.endswith(suffix):
            return task
    raise ModelLoadError(
        f"parameters.extra.task is not set and {folder / 'config.json'} names no architecture "
        f"that tells it: set it (one of {', '.join(COMMON_TASKS)}, ...)"
    )


def _string(extra: dict[str, Any], key: str) -> str:
    value = extra.get(key) or ""
    if not isinstance(value, str):
        raise ModelLoadError(f"parameters.extra.{key} must be a string, not {value!r}")
    return value


def _mapping(extra: dict[str, Any], key: str) -> dict[str, Any]:
    value = extra.get(key) or {}
    if not isinstance(value, dict):
        raise ModelLoadError(f"parameters.extra.{key} must be a JSON object, not {value!r}")
    return value


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"parameters.extra.{key} must be a positive integer, not {value!r}")
    return value


def _optional_count(extra: dict[str, Any], key: str) -> int | None:
    value = extra.get(key)
    return None if value is None else _count(value, key)
