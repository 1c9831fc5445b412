"""The HuggingFace transformers runtime: a pipeline (text classification, token
classification, question answering, text generation, feature extraction, or another task
transformers knows) over a model saved by ``save_pretrained`` in a local folder, served as
MLServer's ``mlserver_huggingface.HuggingFaceRuntime`` serves it.

Settings (``huggingface_settings.py``) and the codec (``huggingface_codec.py``) are
MLServer's: the request's inputs become the pipeline call's arguments, its answer one
``output`` of JSON-encoded BYTES. Question answering, which transformers 5 dropped from
its pipelines, is ``huggingface_qa.py``. Text generation also streams
(``predict_stream``: ``generate_stream``, ``infer_stream``, gRPC ``ModelStreamInfer``),
a piece of text per chunk as the model produces it. MLServer's adaptive batching joins
queued one-text requests of the classification tasks into one pipeline call
(``predict_requests``).

No hub: ``HF_HUB_OFFLINE`` is set before transformers is imported, and a model is only
read from a local folder. torch starts its thread pools at its first operation and they do
not survive a fork: the registry's entry is not ``fork_safe`` and preloads nothing, so each
worker imports torch and loads the model after the fork, with torch's intra-op threads set
to the worker's share of the cores (``limit_threads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # read before transformers' hub client is imported
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no progress bars in the logs
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch
import transformers
from transformers import StoppingCriteria, TextIteratorStreamer
from transformers.pipelines import check_task

from inferpool.errors import ModelLoadError
from inferpool.protocol.types import InferenceRequest, TensorSpec
from inferpool.runtimes.base import Runtime, threads_from_environment
from inferpool.runtimes.huggingface_codec import (
    OUTPUT,
    OUTPUT_SPEC,
    call_arguments,
    encode_answer,
    task_inputs,
)
from inferpool.runtimes.huggingface_qa import QuestionAnswering
from inferpool.runtimes.huggingface_settings import COMMON_TASKS, read_settings

QUESTION_ANSWERING = "question-answering"
# Tasks whose answer for a text does not change when it is padded beside longer ones (the
# attention mask hides the padding; a generation or a per-token embedding would change):
# MLServer's adaptive batching joins their requests' texts into one pipeline call.
JOINED_TASKS = frozenset({"text-classification", "token-classification"})


class HuggingFaceRuntime(Runtime):
    platform = "huggingface"
    accepts = "request"  # MLServer's codec reads each input by its own content type
    # The pipeline refusing its arguments (a missing context, two texts where it takes one).
    input_errors = (TypeError, ValueError)

    def load(self) -> None:
        self.hf = read_settings(self.settings)
        task = self.hf.task
        if task != QUESTION_ANSWERING:
            try:
                task = check_task(task)[0]
            except KeyError:
                raise ModelLoadError(
                    f"unknown task '{task}' for transformers {transformers.__version__}: "
                    f"use one of {', '.join(COMMON_TASKS)} or another pipeline task"
                ) from None
        self.task = task
        self.threads = self.hf.intra_op_threads or threads_from_environment()
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.hf.inter_op_threads:
            _set_interop_threads(self.hf.inter_op_threads)
        try:
            self.pipeline = self._pipeline()
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            reason = " ".join(str(exc).split())[:300]
            raise ModelLoadError(
                f"transformers cannot load {task} from {self.hf.model_folder}: {reason}"
            ) from None
        # Text generation streams; the other tasks answer a streamed request with one chunk.
        self.streams = task == "text-generation"
        # MLServer's adaptive batching: on with both max_batch_size > 1 and max_batch_time > 0.
        batching = self.settings.max_batch_size > 1 and self.settings.max_batch_time > 0
        self.joins_requests = batching and task in JOINED_TASKS
        self.model_bytes = sum(
            p.numel() * p.element_size() for p in self.pipeline.model.parameters()
        )

    def _pipeline(self) -> Any:
        if self.task == QUESTION_ANSWERING:
            model = transformers.AutoModelForQuestionAnswering.from_pretrained(
                self.hf.model_folder, local_files_only=True, **self.hf.model_kwargs
            ).eval()
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                self.hf.tokenizer_folder, local_files_only=True
            )
            return QuestionAnswering(model, tokenizer)
        # Any: transformers types pipeline() per task name (Literal overloads), and the
        # task here is a setting's string.
        build: Any = transformers.pipeline
        pipeline = build(
            self.task,
            model=str(self.hf.model_folder),
            tokenizer=str(self.hf.tokenizer_folder),
            model_kwargs=self.hf.model_kwargs or None,
            batch_size=self.hf.batch_size,
            device="cpu",
        )
        tokenizer = pipeline.tokenizer
        # Batches of texts of several lengths are padded (MLServer pads with the end token).
        if self.hf.batch_size > 1 and tokenizer is not None and tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return pipeline

    def limit_threads(self, threads: int) -> None:
        if self.hf.intra_op_threads is None:
            self.threads = max(1, int(threads))
            torch.set_num_threads(self.threads)

    def predictor(self) -> str:
        threads = self.threads or torch.get_num_threads()
        return (
            f"transformers {transformers.__version__} {self.task} on torch {torch.__version__} "
            f"({threads} intra-op thread{'s' if threads != 1 else ''})"
        )

    def native_bytes(self) -> int:
        return int(self.model_bytes)  # the weights, in torch's own memory

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or task_inputs(self.task)

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [OUTPUT_SPEC]

    def predict(self, payload: InferenceRequest, outputs: Sequence[str]) -> Mapping[str, Any]:
        args, kwargs = call_arguments(payload, self.hf.inference_kwargs)
        with torch.inference_mode():
            prediction = self.pipeline(*args, **kwargs)
        return {OUTPUT: encode_answer(prediction)}

    def predict_requests(
        self, payloads: list[InferenceRequest], outputs: Sequence[str]
    ) -> list[dict[str, Any]]:
        """Several queued requests: those of one text each (``args``, no other input) in one
        pipeline call, batched by its ``batch_size``; any other request alone. Each answer
        is the one its request alone gets (a list per text, as a single text's call)."""
        calls = [call_arguments(payload, self.hf.inference_kwargs) for payload in payloads]
        single = [
            i
            for i, (args, kwargs) in enumerate(calls)
            if len(args) == 1 and isinstance(args[0], str) and kwargs == self.hf.inference_kwargs
        ]
        answers: list[Any] = [None] * len(calls)
        if len(single) > 1:
            texts = [calls[i][0][0] for i in single]
            with torch.inference_mode():
                results = self.pipeline(texts, **self.hf.inference_kwargs)
            for i, result in zip(single, results, strict=True):
                answers[i] = result if isinstance(result, list) else [result]
        for i, (args, kwargs) in enumerate(calls):
            if answers[i] is None:
                with torch.inference_mode():
                    answers[i] = self.pipeline(*args, **kwargs)
        return [{OUTPUT: encode_answer(answer)} for answer in answers]

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[Mapping[str, Any]]:
        """Each request's generated text, a piece per chunk as the model produces it (the
        prompt not repeated); a task that does not generate answers with ``predict``."""
        async for request in payloads:
            if not self.streams:
                yield self.predict(request, [OUTPUT])
                continue
            async for piece in self._generate(request):
                yield {OUTPUT: [piece]}

    async def _generate(self, request: InferenceRequest) -> AsyncIterator[str]:
        args, kwargs = call_arguments(request, self.hf.inference_kwargs)
        streamer = TextIteratorStreamer(
            self.pipeline.tokenizer, skip_prompt=True, skip_special_tokens=True
        )
        stop = _Stop()
        failure: list[BaseException] = []

        def generate() -> None:
            try:
                with torch.inference_mode():
                    self.pipeline(*args, streamer=streamer, stopping_criteria=[stop], **kwargs)
            except BaseException as exc:  # handed to the stream, which raises it
                failure.append(exc)
                streamer.end()  # type: ignore[no-untyped-call, unused-ignore]  # untyped

        thread = threading.Thread(target=generate, name=f"generate-{self.name}", daemon=True)
        thread.start()
        try:
            while (piece := await asyncio.to_thread(next, streamer, None)) is not None:
                if piece:
                    yield piece
            await asyncio.to_thread(thread.join)
            if failure:
                raise failure[0]
        finally:
            stop.set()  # a client gone: the generation stops at its next token


class _Stop(StoppingCriteria):  # type: ignore[misc, unused-ignore]  # Any without transformers
    """Stops a generation whose stream was closed."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        self.event.set()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> Any:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


def _set_interop_threads(threads: int) -> None:
    """torch takes its inter-op pool's size only before its first parallel operation (a
    second model's setting then stays unapplied)."""
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
