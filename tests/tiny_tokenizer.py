"""Test fixture room: a small real tokenizer.json, trained here (no download) with the
tokenizers package, that splits most of soakd's prompt words into 2-5 tokens and adds a
BOS, as a model's tokenizer would count soakd's prompts."""

from __future__ import annotations

from pathlib import Path

from soakd.workload.prompts import WORDS

KINDS = ("metaspace", "bytelevel")
"""sentencepiece-style word marks (Llama 2, the vLLM tests' tiny model) and byte-level
BPE's (GPT-2, Llama 3)."""


def train(directory: Path, kind: str = "metaspace") -> Path:
    """Write ``directory/<kind>.json`` and return its path."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    alphabet: list[str] = []
    if kind == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=["<unk>", "<s>"], initial_alphabet=alphabet
    )
    corpus = [" ".join(WORDS[i : i + 16]) for i in range(0, len(WORDS), 16)]
    tok.train_from_iterator(corpus * 3, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    out = directory / f"{kind}.json"
    tok.save(str(out))
    return out
