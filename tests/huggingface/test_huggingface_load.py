"""The HuggingFace runtime loaded in this process (no server): each load error is one
sentence (no folder, no tokenizer, an unknown task), torch's intra-op threads follow the
worker's share of the cores unless the settings fix them, and MLServer's max_batch_size
is the pipeline's batch size, whose answers equal one text at a time."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch

from inferpool.errors import ModelLoadError
from inferpool.protocol.types import InferenceRequest, Tensor
from inferpool.runtimes.huggingface import HuggingFaceRuntime
from inferpool.settings import ModelSettings
from tests.huggingface.models import assert_close, save_bert, save_gpt2

pytestmark = pytest.mark.huggingface


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_bert(tmp_path_factory.mktemp("hf") / "weights", "text-classification")


def runtime(folder: Path, batching: dict | None = None, **extra: object) -> HuggingFaceRuntime:
    settings = ModelSettings(
        name="m",
        runtime="huggingface",
        parameters={"extra": extra},
        folder=folder,
        **(batching or {}),
    )
    return HuggingFaceRuntime(settings)


def texts_request(name: str, *texts: str) -> InferenceRequest:
    data = np.array([text.encode() for text in texts], dtype=object)
    return InferenceRequest([Tensor(name, "BYTES", (len(texts),), data)])


def answer(outputs: dict) -> list:
    return [json.loads(item) for item in outputs["output"].data.reshape(-1)]


def load_error(model: HuggingFaceRuntime) -> str:
    with pytest.raises(ModelLoadError) as failure:
        model.load()
    message = str(failure.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_each_load_error_is_one_sentence(tmp_path: Path, weights: Path) -> None:
    message = load_error(runtime(weights, task="text-to-nothing"))
    assert message.startswith("unknown task 'text-to-nothing' for transformers ")
    assert "text-classification" in message
    message = load_error(runtime(tmp_path, task="text-classification", pretrained_model="gpt2"))
    assert str(tmp_path / "gpt2") in message and "hub is never reached" in message
    bare = save_bert(tmp_path / "bare", "text-classification", tokenizer=False)
    assert load_error(runtime(bare)).startswith(f"no tokenizer in {bare} ")


def test_torch_threads_follow_the_workers_share(weights: Path) -> None:
    model = runtime(weights)
    model.load()
    model.limit_threads(1)
    assert torch.get_num_threads() == 1
    assert "(1 intra-op thread)" in model.predictor()
    fixed = runtime(weights, intra_op_threads=2)
    fixed.load()
    assert torch.get_num_threads() == 2
    fixed.limit_threads(1)  # the settings' own count wins over the share
    assert torch.get_num_threads() == 2


def test_a_batch_answers_as_one_text_at_a_time(weights: Path) -> None:
    texts = ["the movie was good", "a bad plot", "paris is a city in france"]
    request = texts_request("array_inputs", *texts)
    answers = {}
    for batch_size in (1, 3):
        model = runtime(weights, batch_size=batch_size)
        model.load()
        assert model.pipeline._batch_size == batch_size
        output = model.predict(request, ["output"])["output"]
        answers[batch_size] = [json.loads(item) for item in output.data.reshape(-1)]
    assert [a["label"] for a in answers[3]] == [a["label"] for a in answers[1]]
    for one, batched in zip(answers[1], answers[3], strict=True):
        assert batched["score"] == pytest.approx(one["score"], rel=1e-4)


@pytest.mark.parametrize("task", ["text-classification", "token-classification"])
def test_adaptive_batching_answers_as_each_request_alone(tmp_path: Path, task: str) -> None:
    folder = save_bert(tmp_path / task, task)
    model = runtime(folder, {"max_batch_size": 4, "max_batch_time": 0.01}, task=task)
    model.load()
    assert model.joins_requests  # MLServer's adaptive batching: both settings given
    requests = [
        texts_request("args", "the movie was good"),
        texts_request("args", "john lives in paris and mary in london"),
        texts_request("array_inputs", "a bad plot", "the cat"),  # a batch of its own: alone
        texts_request("args", "the dog ran fast"),
    ]
    joined = model.predict_requests(requests, ["output"])
    alone = [answer(model.predict(request, ["output"])) for request in requests]
    assert_close([answer(outputs) for outputs in joined], alone)


def test_generation_is_never_joined(tmp_path: Path) -> None:
    model = runtime(save_gpt2(tmp_path / "gen"), {"max_batch_size": 4, "max_batch_time": 0.01})
    model.load()
    assert model.task == "text-generation" and not model.joins_requests


def test_a_closed_stream_stops_its_generation(tmp_path: Path) -> None:
    kwargs = {"max_new_tokens": 50, "min_new_tokens": 50, "do_sample": False}
    model = runtime(save_gpt2(tmp_path / "gen"), inference_kwargs=kwargs)
    model.load()
    steps: list[int] = []

    def slow_step(*_: object) -> None:  # 50 tokens take 2.5 s: the stream closes long before
        steps.append(1)
        time.sleep(0.05)

    model.pipeline.model.register_forward_hook(slow_step)

    async def first_piece() -> str:
        async def one() -> AsyncIterator[InferenceRequest]:
            yield texts_request("args", "the dog ran")

        stream = model.predict_stream(one())
        piece = await anext(stream)
        await stream.aclose()  # the client went away
        return piece["output"][0]

    assert asyncio.run(first_piece())
    generating = [t for t in threading.enumerate() if t.name == "generate-m"]
    for thread in generating:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert len(steps) < 25, len(steps)  # stopped at its next token, not after 50
