"""Test fixture room: build the tiny random-weight Llama that the vLLM tests serve.

Run with the vLLM venv's interpreter (it has torch, transformers, tokenizers):

    .venv-vllm/bin/python scripts/make_tiny_model.py --out .cache/tiny-llama

Nothing is downloaded. The tokenizer is a small BPE (sentencepiece-style
Metaspace pieces, like Llama's) trained here on a generated English-like corpus
in which common English words are frequent enough to become single tokens. The
weights are random but seeded, so every build is byte-for-byte the same model.

The model is written to a temporary sibling directory and renamed into place,
so a half-built model is never mistaken for a finished one. A stamp file holds
a hash of this script: editing the script rebuilds the model, rerunning it
unchanged is a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SEED = 1234
VOCAB_SIZE = 4096
STAMP_FILE = ".tiny-model-stamp"

UNK, BOS, EOS, PAD = SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, in this order

# Plain text, not special tokens: role markers are spelled out in the prompt
# and are tokenised like any other text.
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


def _words(text: str) -> list[str]:
    return text.split()


# Common English words (roughly by frequency), plus words typical of prompts.
COMMON_WORDS = _words("""
the of and to a in is it you that he was for on are with as I his they be at one
have this from or had by hot word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many
then them write would like so these her long make thing see him two has look
more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give
our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set
three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind
off need house picture try us again animal point mother world near build self
earth father head stand own page should country found answer school grow study
still learn plant cover food sun four between state keep eye never last let
thought city tree cross farm hard start might story saw far sea draw left late
run while press close night real life few north open seem together next white
children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat
room friend began idea fish mountain stop once base hear horse cut sure watch
color face wood main enough plain girl usual young ready above ever red list
though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space
heard best hour better true during hundred five remember step early hold west
ground interest reach fast verb sing listen six table travel less morning ten
simple several vowel toward war lay against pattern slow center love person
money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box
noun field rest correct able pound done beauty drive stood contain front teach
week final gave green oh quick develop ocean warm free minute strong special
mind behind clear tail produce fact street inch multiply nothing course stay
wheel full force blue object decide surface deep moon island foot system busy
test record boat common gold possible plane stead dry wonder laugh thousand ago
ran check game shape equate miss brought heat snow tire bring yes distant fill
east paint language among hello please thank thanks question answer explain
summarize describe translate write story poem model server request response
token tokens latency throughput stream streaming test soak load user assistant
system message chat completion prompt output input data compute memory cache
GPU CPU error retry timeout second seconds minute minutes hour hours day days
""")

_SYLLABLES = _words("""
ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo fu ga ge gi go gu ha
he hi ho hu ja jo ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu
pa pe pi po pu ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo wa we
wi wo ya yo za ze zi zo an en in on un ar er ir or ur al el il ol ul as es is
os us at et it ot ut ing tion ed ly er est ment ness able ful less pre pro con
""")

_PUNCT = [".", ",", "?", "!", ";", ":"]


def _corpus(rng: random.Random) -> list[str]:
    """English-like sentences: Zipf-weighted common words mixed with made-up words.

    The made-up words give BPE enough varied sub-word material to fill the
    vocabulary; the common words are frequent enough to become whole pieces.
    """
    fake = sorted({"".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(6000)})
    words = COMMON_WORDS + fake
    # Zipf weights: the common English words come first, so they rank highest.
    weights = [1.0 / (rank + 10) for rank in range(len(words))]
    lines = []
    for _ in range(20000):
        n = rng.randint(4, 18)
        sent = rng.choices(words, weights=weights, k=n)
        sent[0] = sent[0].capitalize()
        if rng.random() < 0.1:
            sent.insert(rng.randrange(len(sent)), str(rng.randint(0, 2025)))
        lines.append(" ".join(sent) + rng.choice(_PUNCT))
    # Every common word at least a few times on its own, so none is left split.
    lines.extend(" ".join([w] * 50) for w in COMMON_WORDS)
    return lines


def build_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(SEED)
    tok = Tokenizer(models.BPE(unk_token=UNK, fuse_unk=True))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t", "▁"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer=trainer)
    # Like Llama: encode(text) starts with <s>; the chat template writes its own.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 1)]
    )

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1024,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, bos: int, eos: int, pad: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the CPU attention needs >= 32
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    model = LlamaForCausalLM(config).eval()
    _never_emit(model, [int(i) for i in (0, bos, eos, pad)])
    # vLLM's CPU backend runs float32 checkpoints as bfloat16 anyway (and warns
    # once per tensor); store bfloat16 so what is served is what is saved.
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    return model


def _never_emit(model, token_ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Make ``token_ids`` (the special tokens) practically impossible to sample.

    A random model samples near-uniformly, so it would emit <unk>/<s>/</s>/<pad>
    now and then: text-less stream chunks, and EOS ending requests early. Keep
    residual dimension 0 a positive constant (every embedding has 1.0 there and
    no layer writes to it), so after the final RMSNorm h[0] > 0 always, and give
    the special tokens a large negative lm_head weight on that dimension only.
    """
    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[token_ids, 0] = -16.0


def script_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def is_current(out: Path) -> bool:
    stamp = out / STAMP_FILE
    return stamp.is_file() and stamp.read_text().strip() == script_hash()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".cache/tiny-llama"))
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()

    if is_current(out) and not args.force:
        print(f"tiny model up to date: {out}")
        return 0

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        info = _build(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"tiny model built: {out} (vocab {info['vocab_size']}, probe {info['probe_tokens']} tok)")
    return 0


def _build(tmp: Path) -> dict[str, object]:
    tokenizer = build_tokenizer()
    ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    if ids != [0, 1, 2, 3]:
        raise RuntimeError(f"special token ids {ids} != [0, 1, 2, 3]")
    model = build_model(len(tokenizer), bos=ids[1], eos=ids[2], pad=ids[3])
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not list(tmp.glob("*.safetensors")):
        raise RuntimeError(f"save_pretrained wrote no .safetensors file in {tmp}")
    # Sanity: text round-trips through the tokenizer.
    probe = "The quick brown fox said hello to the server."
    enc = tokenizer(probe, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(enc)
    if back != probe:
        raise RuntimeError(f"tokenizer does not round-trip: {probe!r} -> {back!r}")
    info: dict[str, object] = {
        "vocab_size": len(tokenizer),
        "probe": probe,
        "probe_tokens": len(enc),
        "seed": SEED,
        "script_hash": script_hash(),
    }
    (tmp / "tiny-model-info.json").write_text(json.dumps(info, indent=2) + "\n")
    (tmp / STAMP_FILE).write_text(script_hash() + "\n")
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    return info


if __name__ == "__main__":
    sys.exit(main())
