"""Test fixture room: write the tiny random-weight Llama GGUF that llama-server serves.

    .venv/bin/python tests/make_tiny_gguf.py OUT.gguf

Nothing is downloaded. A ``llama`` architecture (2 layers, 64 wide, 2 heads of 32,
FFN 128, F32, about 1.8 MB) with a sentencepiece-style (``llama``/SPM) vocabulary:
the special tokens, the 256 byte-fallback tokens ``<0x00>``..``<0xFF>`` (llama.cpp's
SPM tokenizer needs them: a newline or any character not in the vocabulary is spelled
in bytes), ``▁`` and the printable ASCII characters, then every prefix of ``▁word`` for
the 1024 words soakd's prompts are made of, so a prompt of n words is about n tokens,
as with a real tokenizer.

The weights are random but seeded (every run writes the same bytes), with one rigged
dimension: hidden dimension 0 carries a constant through every layer (its embedding
column is constant and no layer writes to it), and the output rows of the special and
byte tokens weigh it strongly negative. So the model never generates an end of text
(every request runs to its ``max_tokens``, so token counts are exact), nor a lone byte
(no invalid UTF-8 in a response); it samples among the text pieces.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

from soakd.workload.prompts import WORDS

SEED = 1234
N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_LAYER = 2
N_FF = 128
N_CTX_TRAIN = 4096
MODEL_NAME = "soakd-tiny-llama"

SPACE = "\u2581"  # sentencepiece's word boundary
UNK, BOS, EOS = 0, 1, 2

# Plain text role markers, the same template as the vLLM tiny model's.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ content }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


N_BYTES = 256
FIRST_TEXT = 3 + N_BYTES  # ids below are special or byte tokens: never generated
CARRIER = 8.0  # the constant of hidden dimension 0, in embedding units
SUPPRESS = -40.0  # output weight on it of the tokens never generated


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types. A longer piece scores higher, so SPM's greedy
    merges build ``▁w``, ``▁wo``, ``▁wor``, ``▁word`` and stop at the whole word."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTES)]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ] + [gguf.TokenType.BYTE] * N_BYTES
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)

    add(SPACE)
    for code in range(0x21, 0x7F):
        add(chr(code))
    for word in WORDS:
        piece = SPACE + word
        for end in range(2, len(piece) + 1):
            add(piece[:end])
    scores = [0.0] * FIRST_TEXT + [float(len(t)) for t in tokens[FIRST_TEXT:]]
    return tokens, scores, [int(t) for t in types]


def write(path: Path, seed: int = SEED) -> Path:
    """Write the model to ``path`` (atomically: a temporary sibling, then a rename)."""
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int, std: float = 0.02, writes_hidden: bool = False) -> np.ndarray:
        w = (rng.standard_normal(shape) * std).astype(np.float32)
        if writes_hidden:
            w[0, :] = 0.0  # no layer writes hidden dimension 0: it stays the carrier
        return w

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(MODEL_NAME)
        w.add_context_length(N_CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(N_FF)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD_KV)
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(n_vocab)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(UNK)
        w.add_bos_token_id(BOS)
        w.add_eos_token_id(EOS)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)

        # numpy shapes are (rows, cols) = (out, in); GGUF stores them reversed
        embd = weight(n_vocab, N_EMBD)
        embd[:, 0] = CARRIER * 0.02
        w.add_tensor("token_embd.weight", embd)
        for i in range(N_LAYER):
            b = f"blk.{i}"
            w.add_tensor(f"{b}.attn_norm.weight", ones(N_EMBD))
            w.add_tensor(f"{b}.attn_q.weight", weight(N_HEAD * HEAD_DIM, N_EMBD))
            w.add_tensor(f"{b}.attn_k.weight", weight(N_HEAD_KV * HEAD_DIM, N_EMBD))
            w.add_tensor(f"{b}.attn_v.weight", weight(N_HEAD_KV * HEAD_DIM, N_EMBD))
            w.add_tensor(
                f"{b}.attn_output.weight", weight(N_EMBD, N_HEAD * HEAD_DIM, writes_hidden=True)
            )
            w.add_tensor(f"{b}.ffn_norm.weight", ones(N_EMBD))
            w.add_tensor(f"{b}.ffn_gate.weight", weight(N_FF, N_EMBD))
            w.add_tensor(f"{b}.ffn_up.weight", weight(N_FF, N_EMBD))
            w.add_tensor(f"{b}.ffn_down.weight", weight(N_EMBD, N_FF, writes_hidden=True))
        w.add_tensor("output_norm.weight", ones(N_EMBD))
        # wider than the rest: the logits spread, so sampling is not a uniform draw
        out = weight(n_vocab, N_EMBD, std=0.2)
        out[:, 0] = 0.0
        out[:FIRST_TEXT, 0] = SUPPRESS
        w.add_tensor("output.weight", out)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    path = write(args.out, args.seed)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {len(vocabulary()[0])} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
