"""Tiny random-weight transformers models and their tokenizers, made here from configs
and saved with save_pretrained (there is no model hub): a 2-layer BERT with each head the
tests serve, and a 2-layer GPT-2. Seeded, so the same folder answers the same everywhere.
And the comparison of answers the tests share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

_SENTENCE = (
    "the a is was on in of and to it this that good bad great awful movie film plot actor "
    "paris london city capital france england where what who lives john mary cat dog sat "
    "mat ran fast slow happy sad day night river bank money tree green blue red"
)
WORDS = _SENTENCE.split()
BERT_HEADS = {
    "text-classification": "BertForSequenceClassification",
    "token-classification": "BertForTokenClassification",
    "question-answering": "BertForQuestionAnswering",
    "feature-extraction": "BertModel",
}


def word_tokenizer(kind: str) -> object:
    """A WordLevel tokenizer over ``WORDS`` (whitespace and punctuation split), wrapped
    as a fast tokenizer; ``kind`` "bert" adds BERT's special tokens and its
    [CLS] a [SEP] b [SEP] template, "gpt2" an end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if kind == "bert" else ["<eos>"]
    vocab = {token: i for i, token in enumerate(specials + list(WORDS) + ["?", ".", ","])}
    unknown = "[UNK]" if kind == "bert" else "<eos>"
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if kind == "bert":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
            model_max_length=64,
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<eos>",
        bos_token="<eos>",
        unk_token="<eos>",
        pad_token="<eos>",
        model_max_length=64,
    )


# Two layers, hidden size 32: each model saves and loads in well under a second.
BERT_SIZES = {
    "vocab_size": len(WORDS) + 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
GPT2_SIZES = {"vocab_size": len(WORDS) + 4, "n_embd": 32, "n_layer": 2, "n_head": 2}
# Three labels for the classification heads (a question-answering head has 2 per token).
LABELS = {0: "NEGATIVE", 1: "NEUTRAL", 2: "POSITIVE"}


def save_bert(folder: Path, task: str, tokenizer: bool = True) -> Path:
    """A tiny BERT with the head of ``task``, saved into ``folder``."""
    fields: dict = dict(BERT_SIZES)
    if task != "question-answering":
        fields["id2label"] = LABELS
        fields["label2id"] = {label: i for i, label in LABELS.items()}
    return _save(folder, "BertConfig", BERT_HEADS[task], "bert" if tokenizer else "", fields)


def save_gpt2(folder: Path) -> Path:
    """A tiny GPT-2, saved into ``folder`` with its tokenizer."""
    fields = {**GPT2_SIZES, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}
    return _save(folder, "GPT2Config", "GPT2LMHeadModel", "gpt2", {**fields, "pad_token_id": 0})


def _save(folder: Path, config: str, model: str, tokenizer: str, fields: dict) -> Path:
    """A model of random (seeded) weights and, unless ``tokenizer`` is "", its tokenizer."""
    import torch
    import transformers

    torch.manual_seed(0)
    made = getattr(transformers, model)(getattr(transformers, config)(**fields)).eval()
    made.save_pretrained(folder)
    if tokenizer:
        word_tokenizer(tokenizer).save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


def assert_close(got: Any, want: Any) -> None:
    """Equal, floats within float32 rounding (thread counts and batches change the order
    of sums)."""
    if isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for key in want:
            assert_close(got[key], want[key])
    else:
        assert got == want
