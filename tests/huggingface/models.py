"""Tiny random-weight transformers models and their tokenizers, made here from configs
and saved with save_pretrained (there is no model hub): a 2-layer BERT with each head the
tests serve, and a 2-layer GPT-2. Seeded, so the same folder answers the same everywhere.
"""

from __future__ import annotations

from pathlib import Path

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


def save_bert(folder: Path, task: str, tokenizer: bool = True) -> Path:
    """A 2-layer BERT (hidden size 32) with the head of ``task``, saved into ``folder``."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(WORDS) + 8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    if task != "question-answering":  # its head answers 2 values per token: start, end
        config.num_labels = 3
        config.id2label = {0: "NEGATIVE", 1: "NEUTRAL", 2: "POSITIVE"}
        config.label2id = {"NEGATIVE": 0, "NEUTRAL": 1, "POSITIVE": 2}
    model = getattr(transformers, BERT_HEADS[task])(config).eval()
    model.save_pretrained(folder)
    if tokenizer:
        word_tokenizer("bert").save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


def save_gpt2(folder: Path) -> Path:
    """A 2-layer GPT-2 (hidden size 32), saved into ``folder`` with its tokenizer."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(WORDS) + 4,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    word_tokenizer("gpt2").save_pretrained(folder)  # type: ignore[attr-defined]
    return folder
