"""Extractive question answering, which transformers 5 no longer has as a pipeline
(``pipeline("question-answering")`` raises "has been removed"): a model with a
question-answering head (``...ForQuestionAnswering``) and its tokenizer, called as
MLServer's users call the pipeline (``question=`` and ``context=``, a string or a list of
them each) and answering as that pipeline did: ``{"score", "start", "end", "answer"}`` per
question, a single dict for a single question.

The answer is the span of context tokens whose start and end probabilities (softmax over
the sequence) have the largest product, the end not before the start and at most
``max_answer_len`` tokens long (the old pipeline's default, 15); ``start`` and ``end`` are
character offsets in the context.
"""

from __future__ import annotations

from typing import Any

import torch

MAX_ANSWER_LEN = 15


class QuestionAnswering:
    """Callable like the old pipeline: ``qa(question=..., context=...)``."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def __call__(
        self,
        *args: Any,
        question: str | list[str] | None = None,
        context: str | list[str] | None = None,
        max_answer_len: int = MAX_ANSWER_LEN,
        **unused: Any,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        if args or question is None or context is None:
            raise ValueError("question answering takes the inputs 'question' and 'context'")
        questions = [question] if isinstance(question, str) else list(question)
        contexts = [context] if isinstance(context, str) else list(context)
        if len(contexts) == 1 and len(questions) > 1:
            contexts *= len(questions)
        if len(questions) != len(contexts):
            raise ValueError(
                f"{len(questions)} questions and {len(contexts)} contexts: send as many of each"
            )
        answers = [
            self._answer(q, c, max_answer_len) for q, c in zip(questions, contexts, strict=True)
        ]
        return answers[0] if len(answers) == 1 else answers

    def _answer(self, question: str, context: str, max_answer_len: int) -> dict[str, Any]:
        encoded = self.tokenizer(
            question, context, return_tensors="pt", return_offsets_mapping=True, truncation=True
        )
        offsets = encoded.pop("offset_mapping")[0].tolist()
        in_context = [sequence == 1 for sequence in encoded.sequence_ids(0)]
        with torch.inference_mode():
            output = self.model(**encoded)
        start = torch.softmax(output.start_logits[0], dim=-1)
        end = torch.softmax(output.end_logits[0], dim=-1)
        # Every (start, end) pair's score; spans that leave the context, run backwards or
        # run longer than max_answer_len score nothing.
        scores = torch.triu(start[:, None] * end[None, :])
        scores = torch.tril(scores, diagonal=max_answer_len - 1)
        mask = torch.tensor(in_context)
        scores = scores * (mask[:, None] & mask[None, :])
        best = int(torch.argmax(scores))
        first, last = divmod(best, scores.shape[1])
        begin, finish = offsets[first][0], offsets[last][1]
        return {
            "score": float(scores[first, last]),
            "start": begin,
            "end": finish,
            "answer": context[begin:finish],
        }
