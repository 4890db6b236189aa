"""Prompts: a pure function of (seed, seq), lengths from the distribution, files read strictly."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from soakd.config import ConfigError, Prompts, TokenLength, Workload
from soakd.workload.prompts import (
    FilePrompts,
    PromptSource,
    SyntheticPrompts,
    make_prompt_source,
)


def lengths(source: SyntheticPrompts, n: int = 20_000) -> list[int]:
    return [source.spec_fields(seq)[1] for seq in range(n)]


def test_fixed_length_is_the_word_count() -> None:
    source = SyntheticPrompts(TokenLength(mean=256))
    for seq in range(500):
        text, tokens = source.spec_fields(seq)
        assert tokens == 256
        assert len(text.split(" ")) == 256  # single spaces, no empty words


def test_fixed_length_is_clipped_to_the_bounds() -> None:
    source = SyntheticPrompts(TokenLength(mean=500, min=1, max=300))
    assert {source.spec_fields(s)[1] for s in range(50)} == {300}


def test_uniform_lengths_cover_the_range_evenly() -> None:
    got = lengths(SyntheticPrompts(TokenLength(dist="uniform", min=10, max=29)))
    assert min(got) == 10
    assert max(got) == 29
    counts = [got.count(n) for n in range(10, 30)]
    assert max(counts) < 1.15 * min(counts)  # 1000 expected each


def test_normal_lengths_have_the_mean_and_stddev() -> None:
    got = lengths(SyntheticPrompts(TokenLength(dist="normal", mean=300, stddev=50, max=4096)))
    assert statistics.fmean(got) == pytest.approx(300, abs=2)
    assert statistics.pstdev(got) == pytest.approx(50, rel=0.03)


def test_normal_lengths_are_clipped() -> None:
    got = lengths(
        SyntheticPrompts(TokenLength(dist="normal", mean=100, stddev=100, min=50, max=150))
    )
    assert min(got) == 50
    assert max(got) == 150
    # about 31% of a normal lies below mean - 0.5 sd: all of it lands on min
    assert got.count(50) / len(got) == pytest.approx(0.31, abs=0.02)


def test_same_seq_same_prompt_even_in_another_source() -> None:
    lengths_cfg = TokenLength(dist="uniform", min=1, max=600)
    a, b = SyntheticPrompts(lengths_cfg, seed=3), SyntheticPrompts(lengths_cfg, seed=3)
    for seq in [0, 1, 2, 77, 10**6, 2**40 + 5]:
        assert a.spec_fields(seq) == a.spec_fields(seq) == b.spec_fields(seq)
    # order of asking does not matter: no hidden iterator
    forward = [a.spec_fields(s) for s in range(100)]
    backward = [b.spec_fields(s) for s in reversed(range(100))][::-1]
    assert forward == backward


def test_every_prompt_opens_differently() -> None:
    # distinct first words defeat prefix caching (its blocks chain from the start)
    source = SyntheticPrompts(TokenLength(mean=64))
    openings = {tuple(source.spec_fields(seq)[0].split()[:4]) for seq in range(50_000)}
    assert len(openings) == 50_000
    # neighbours differ in the very first word, not only further in
    first = [source.spec_fields(seq)[0].split()[0] for seq in range(1024)]
    assert all(x != y for x, y in itertools.pairwise(first))


def test_seed_changes_the_prompts() -> None:
    a = SyntheticPrompts(TokenLength(mean=32), seed=1)
    b = SyntheticPrompts(TokenLength(mean=32), seed=2)
    assert all(a.spec_fields(s)[0] != b.spec_fields(s)[0] for s in range(100))


def test_short_prompts() -> None:
    source = SyntheticPrompts(TokenLength(dist="uniform", min=1, max=5))
    for seq in range(200):
        text, tokens = source.spec_fields(seq)
        assert len(text.split(" ")) == tokens


# --- files ----------------------------------------------------------------------------


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_file_prompts_cycle_in_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        json.dumps({"prompt": "Tell me about the sea."}),
        "",
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]},
                ]
            }
        ),
        json.dumps({"prompt": "x" * 400}),
    )
    source = FilePrompts(path)
    assert len(source) == 3
    texts = [source.spec_fields(seq)[0] for seq in range(7)]
    assert texts[0] == "Tell me about the sea."
    assert texts[1] == "Be brief.\nWhy is the sky blue?"
    assert texts[3:6] == texts[0:3]
    assert source.spec_fields(2)[1] == 100  # ~4 characters per token


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected an object"),
        ('{"text": "hi"}', 'expected a "prompt" or a "messages" key'),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": 5}', '"prompt" must be a non-empty string'),
        ('{"messages": []}', '"messages" must be a non-empty list'),
        ('{"messages": [{"role": "user"}]}', 'messages[0] must be an object with "content"'),
        ('{"messages": [{"content": 3}]}', "messages[0].content must be a string"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, '{"prompt": "fine"}', "", line)
    with pytest.raises(ConfigError) as info:
        FilePrompts(path)
    text = str(info.value)
    assert f"{path}:3: " in text
    assert message in text
    assert text.startswith("workload.prompts.file: ")
    assert "\n" not in text


def test_bad_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: not valid UTF-8"):
        FilePrompts(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        FilePrompts(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="holds no prompts"):
        FilePrompts(write(tmp_path, "", "  "))


def test_factory_follows_the_config(tmp_path: Path) -> None:
    synthetic: PromptSource = make_prompt_source(Workload(seed=9))
    assert isinstance(synthetic, SyntheticPrompts)
    assert synthetic.seed == 9
    path = write(tmp_path, '{"prompt": "hello"}')
    from_file = make_prompt_source(Workload(prompts=Prompts(source="file", file=path)))
    assert from_file.spec_fields(41) == ("hello", 1)
