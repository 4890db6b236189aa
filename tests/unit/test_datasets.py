"""Prompt sources from dataset files (sharegpt, mooncake, burstgpt) and shared prefixes:
what each record plans, the same on every target, every malformed file one line naming the
field, the file and the line (exit 2 at ``soakd check``), and the index held in place of
the file."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from soakd.cli import main
from soakd.config import ConfigError, Workload
from soakd.workload.answers import workload_answers
from soakd.workload.datasets import (
    BurstGPTPrompts,
    MooncakePrompts,
    ShareGPTPrompts,
    Turn,
    stored_source,
)
from soakd.workload.prompts import FilePrompts, SyntheticPrompts, make_prompt_source
from tests import dataset_files


def workload(source: str, path: Path, **prompts: Any) -> Workload:
    return Workload.model_validate({"prompts": {"source": source, "file": str(path), **prompts}})


def problem(source: str, path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        make_prompt_source(workload(source, path))
    (line,) = exc.value.problems
    return line


# --- ShareGPT ------------------------------------------------------------------------------


def test_sharegpt_first_human_turn_and_its_answer(tmp_path: Path) -> None:
    path = dataset_files.sharegpt(tmp_path / "s.json")
    items = json.loads(path.read_text())
    src = make_prompt_source(workload("sharegpt", path))
    assert isinstance(src, ShareGPTPrompts)
    assert len(src) == 12
    for seq in (0, 5, 12 + 5):  # cycled
        i = seq % 12
        text, planned = src.spec_fields(seq)
        question = items[i]["conversations"][1]["value"]
        assert text == question
        assert planned == round(len(question) / 4)
        assert src.output_tokens(seq) == 10 + 3 * i  # the gpt answer: 4 (10 + 3 i) characters
        assert src.record_of(seq) == i
    lines = path.read_text().splitlines()
    label = src.label(5)
    line = int(label.split(":")[1].split()[0])
    assert label == f"s.json:{line} (item 5)"
    assert lines[line - 1].strip() == "{"
    assert '"c5"' in lines[line]
    # the planned answers reach each request's max_tokens
    answers = workload_answers(workload("sharegpt", path), src)
    assert answers is not None
    assert answers(3) == 19


def test_sharegpt_conversations_for_multi_turn(tmp_path: Path) -> None:
    src = make_prompt_source(workload("sharegpt", dataset_files.sharegpt(tmp_path / "s.json")))
    assert isinstance(src, ShareGPTPrompts)
    turns = src.turns(2)
    assert [t.user_tokens for t in turns] == [turns[0].user_tokens, 2]
    assert turns[1] == Turn("and then?", 2, 7)
    assert turns[0].answer_tokens == 16
    assert src.system(2) == "You answer briefly."


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("", 1, "expected a JSON array of conversations"),
        ('{"conversations": []}', 1, "expected a JSON array of conversations"),
        ("[\n", 2, "the array is not closed (a cut file?)"),
        ('[\n {"conversations": [{"from": "human", "value": "hi"}]}\n', 3, "the array is not "),
        ("[\n 3\n]", 2, 'item 0: expected an object with "conversations", got int'),
        ('[\n {"id": 1}\n]', 2, 'item 0: "conversations" must be a list of turns'),
        (
            '[\n {"conversations": [{"from": "human", "value": "a"}]},\n'
            ' {"conversations": [{"from": "gpt", "value": "b"}]}\n]',
            3,
            'item 1: "conversations" hold no human turn with text',
        ),
        (
            '[\n {"conversations": [{"from": "robot", "value": "a"}]}\n]',
            2,
            'item 0: conversations[0].from must be "human", "gpt" or "system", got "robot"',
        ),
        (
            '[\n {"conversations": [{"from": "human", "value": 7}]}\n]',
            2,
            "item 0: conversations[0].value must be a string",
        ),
        ('[\n {"conversations": [}\n]', 2, "not valid JSON (Expecting value)"),
        (
            '[\n {"conversations": [{"from": "human", "value": "a"}]}\n {"x": 1}]',
            3,
            "expected ',' or ']' after an item",
        ),
        ('[{"conversations": [{"from": "human", "value": "a"}]}] x', 1, "text after the array"),
        ("[]", 0, "holds no records"),
        ('[\n {"conversations": [{"from": "human", "value": "a\udcff"}]}\n]', 2, "not valid UTF-8"),
    ],
)
def test_sharegpt_bad_input(tmp_path: Path, text: str, line: int, why: str) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # \udcff: the byte 0xff
    where = f"{path}:{line}: " if line else f"{path} "
    assert problem("sharegpt", path).startswith(f"workload.prompts.file: {where}{why}")


def test_sharegpt_items_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Items cut by the chunk boundary, and multi-byte characters across it, index alike."""
    from soakd.workload import records

    monkeypatch.setattr(records, "CHUNK", 64)
    items = [
        {"conversations": [{"from": "human", "value": f"ü€ {i} " + "x" * (i * 7)}]}
        for i in range(40)
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(items, indent=2, ensure_ascii=False), encoding="utf-8")
    src = make_prompt_source(workload("sharegpt", path))
    assert [src.spec_fields(i)[0] for i in range(40)] == [
        it["conversations"][0]["value"] for it in items
    ]


def test_an_index_not_the_file_is_held(tmp_path: Path) -> None:
    """A dataset of ~15 MB is indexed in chunks of 1 MiB: the memory the pass allocates
    at its peak is a few chunks, not the file, and what stays is the index (16 bytes a
    record)."""
    path = tmp_path / "big.json"
    item = {
        "conversations": [
            {"from": "human", "value": "word " * 400},
            {"from": "gpt", "value": "ok " * 300},
        ]
    }
    with path.open("w") as f:
        f.write("[" + ",\n".join(json.dumps(item) for _ in range(5000)) + "]")
    size = path.stat().st_size
    assert size > 14_000_000
    tracemalloc.start()
    try:
        src = make_prompt_source(workload("sharegpt", path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(src, ShareGPTPrompts)
    assert len(src) == 5000
    assert peak < 8_000_000
    assert src.index_bytes <= 5000 * 16 * 1.2
    assert src.spec_fields(4999)[0] == "word " * 400


# --- Mooncake ------------------------------------------------------------------------------


def test_mooncake_blocks_shared_text_and_planned_lengths(tmp_path: Path) -> None:
    path = dataset_files.mooncake(tmp_path / "m.jsonl")
    records = [json.loads(x) for x in path.read_text().splitlines()]
    src = make_prompt_source(workload("mooncake", path))
    assert isinstance(src, MooncakePrompts)
    texts = []
    for seq, rec in enumerate(records):
        text, planned = src.spec_fields(seq)
        assert planned == rec["input_length"]
        assert len(text.split()) == rec["input_length"]  # uncalibrated: a word a token
        assert src.output_tokens(seq) == rec["output_length"]
        assert src.label(src.record_of(seq)) == f"m.jsonl:{seq + 1}"
        texts.append(text.split())
    # blocks 0 and 1 open every request: up to 1024 tokens, the same text in all
    longest = max(texts, key=len)
    assert len(longest) > 1024
    assert all(t[:1024] == longest[: min(1024, len(t))] for t in texts)
    longer = [t for t in texts if len(t) > 1040]
    assert len({tuple(t[1024:1040]) for t in longer}) == len(longer)  # then their own
    # the same trace, another instance (another target, a worker): the same text
    again = make_prompt_source(workload("mooncake", path))
    assert again.spec_fields(7) == src.spec_fields(7)
    reused, total = src.reuse()
    assert reused == sum(min(1024, r["input_length"]) for r in records[1:])
    assert total == sum(r["input_length"] for r in records)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("not json", "not valid JSON (Expecting value)"),
        ("[1]", "expected an object with input_length, output_length and hash_ids, got list"),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}',
            '"input_length" 600 is more than its 1 hash_ids hold (512 tokens each)',
        ),
        (
            '{"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": []}',
            '"hash_ids" must be a non-empty list of whole numbers from 0 on',
        ),
        (
            '{"timestamp": 0, "input_length": 6, "output_length": "5", "hash_ids": [1]}',
            '"output_length" must be a whole number of tokens from 1 to 1,048,576, got "5"',
        ),
        (
            '{"timestamp": -3, "input_length": 6, "output_length": 5, "hash_ids": [1]}',
            '"timestamp" must be milliseconds from 0 on, got -3',
        ),
    ],
)
def test_mooncake_bad_input(tmp_path: Path, line: str, why: str) -> None:
    path = dataset_files.mooncake(tmp_path / "m.jsonl", n=3)
    path.write_text(path.read_text() + "\n" + line + "\n")  # a blank line 4: line 5
    assert problem("mooncake", path) == f"workload.prompts.file: {path}:5: {why}"


# --- BurstGPT ------------------------------------------------------------------------------


def test_burstgpt_rows_plan_lengths_and_failed_rows_are_skipped(tmp_path: Path) -> None:
    path = dataset_files.burstgpt(tmp_path / "b.csv", n=10, failed=2)
    rows = [r.split(",") for r in path.read_text().splitlines()[1:]]
    src = make_prompt_source(workload("burstgpt", path))
    assert isinstance(src, BurstGPTPrompts)
    assert len(src) == 10
    assert dict(src.skipped) == {"no response tokens (a failed request)": 2}
    for seq in range(10):
        row = rows[seq + 2]
        text, planned = src.spec_fields(seq)
        assert planned == int(row[2]) == len(text.split())
        assert src.output_tokens(seq) == int(row[3])
        assert src.label(seq) == f"b.csv:{seq + 4}"
    assert src.describe()[1] == "  skipped rows: 2 no response tokens (a failed request)"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Timestamp,Model,Tokens\n1,a,2\n", ":1: the header has no 'Request tokens' or "),
        (
            "Request tokens,Response tokens\n5,5\n6,x\n",
            ':3: "Response tokens" must be a whole number of tokens from 0 to 1,048,576, got "x"',
        ),
        ("Request tokens,Response tokens\n5,5\n6\n", ":3: 1 fields, the header has 2"),
        ("Request tokens,Response tokens\n5,0\n", " holds no records (skipped: 1 no response"),
        ("", " holds no records"),
    ],
)
def test_burstgpt_bad_input(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "b.csv"
    path.write_text(text)
    assert problem("burstgpt", path).startswith(f"workload.prompts.file: {path}{why}")


# --- soakd check ---------------------------------------------------------------------------


def check(tmp_path: Path, prompts: dict[str, Any]) -> Path:
    cfg = tmp_path / "c.yaml"
    doc = {
        "targets": [{"name": "sim", "simulator": "fast"}],
        "workload": {"prompts": prompts, "calibrate": "off"},
        "phases": [{"name": "p", "duration": "1m"}],
    }
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def test_check_describes_each_source_and_stops_at_a_bad_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    burst = dataset_files.burstgpt(tmp_path / "b.csv", n=4, failed=1)
    assert main(["check", str(check(tmp_path, {"source": "burstgpt", "file": str(burst)}))]) == 0
    out = capsys.readouterr().out
    assert f"prompts: burstgpt {burst}, 4 requests" in out
    assert "  skipped rows: 1 no response tokens (a failed request)" in out
    assert "answers: planned, the burstgpt file's records': each request's max_tokens" in out

    moon = dataset_files.mooncake(tmp_path / "m.jsonl", n=4)
    assert main(["check", str(check(tmp_path, {"source": "mooncake", "file": str(moon)}))]) == 0
    assert "blocks of 512 tokens sent before: " in capsys.readouterr().out

    bad = tmp_path / "s.json"
    bad.write_text('[\n {"conversations": [{"from": "gpt", "value": "b"}]}\n]')
    assert main(["check", str(check(tmp_path, {"source": "sharegpt", "file": str(bad)}))]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'soakd: error: workload.prompts.file: {bad}:2: item 0: "conversations" hold no '
        "human turn with text"
    )


def test_the_report_reads_the_planned_lengths_again(tmp_path: Path) -> None:
    from soakd.journal.stored import StoredPrompts

    path = dataset_files.burstgpt(tmp_path / "b.csv")
    src = stored_source(StoredPrompts(source="burstgpt", file=str(path)), 0, None)
    assert src is not None
    assert src.length(3) == make_prompt_source(workload("burstgpt", path)).spec_fields(3)[1]
    path.unlink()
    assert stored_source(StoredPrompts(source="burstgpt", file=str(path)), 0, None) is None
    # a prompt file with shared prefixes: their tokens in the planned lengths read again
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "abcdefgh"}\n')
    prefix = {"share": 1, "count": 2, "tokens": 20}
    stored = StoredPrompts.model_validate({"source": "file", "file": str(lines), "prefix": prefix})
    again = stored_source(stored, 7, None)
    assert again is not None
    made = make_prompt_source(
        Workload.model_validate(
            {"seed": 7, "prompts": {"source": "file", "file": str(lines), "prefix": prefix}}
        )
    )
    assert (
        [again.length(s) for s in range(5)]
        == [made.spec_fields(s)[1] for s in range(5)]
        == [22] * 5
    )


# --- shared prefixes -----------------------------------------------------------------------


def test_shared_prefixes_planned_alike_on_every_target() -> None:
    wl = Workload.model_validate(
        {
            "seed": 3,
            "prompts": {
                "input_tokens": {"dist": "uniform", "min": 80, "max": 160},
                "prefix": {"share": 0.4, "count": 3, "tokens": 50},
            },
        }
    )
    a, b = make_prompt_source(wl), make_prompt_source(wl)
    assert isinstance(a, SyntheticPrompts)
    seqs = range(2000)
    drawn = [a.prefix_of(s) for s in seqs]
    assert 0.36 < sum(k is not None for k in drawn) / len(drawn) < 0.44
    assert {k for k in drawn if k is not None} == {0, 1, 2}
    prefixes = {k: a.prefix_text(k)[0] for k in range(3)}
    assert all(len(p.split()) == 50 for p in prefixes.values())
    assert len(set(prefixes.values())) == 3
    for s in range(200):
        text, planned = a.spec_fields(s)
        assert (text, planned) == b.spec_fields(s)  # every target: the same
        assert len(text.split()) == planned == a.length(s)  # the prefix is part of it
        k = drawn[s]
        opens = [p for p in prefixes.values() if text.startswith(p + " ")]
        assert opens == ([] if k is None else [prefixes[k]])
    # no prefix planned: the prompts are those of before
    plain = Workload.model_validate(
        {"seed": 3, "prompts": {"input_tokens": {"dist": "uniform", "min": 80, "max": 160}}}
    )
    c = make_prompt_source(plain)
    assert c.spec_fields(drawn.index(None)) == a.spec_fields(drawn.index(None))


def test_file_prompts_with_shared_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "abcdefgh"}\n{"prompt": "ijklmnop"}\n')
    src = make_prompt_source(workload("file", path, prefix={"share": 1, "count": 1, "tokens": 30}))
    assert isinstance(src, FilePrompts)
    (t0, n0), (t1, n1) = src.spec_fields(0), src.spec_fields(1)
    assert t0.endswith("\nabcdefgh")
    assert t1.endswith("\nijklmnop")
    assert t0.split("\n")[0] == t1.split("\n")[0]
    assert len(t0.split("\n")[0].split()) == 30
    assert (n0, n1) == (2 + 30, 2 + 30)
    assert src.label(src.record_of(3)) == "p.jsonl:2"


@pytest.mark.parametrize(
    ("prompts", "why"),
    [
        (
            {"input_tokens": {"mean": 40}, "prefix": {"share": 0.5, "tokens": 40}},
            "prefix.tokens (40) must be below the shortest planned prompt (40 tokens",
        ),
        (
            {"source": "mooncake", "file": "m.jsonl", "prefix": {"share": 0.5}},
            "prefix is for the synthetic and file sources, not 'mooncake'",
        ),
        ({"source": "sharegpt"}, "source is 'sharegpt' but no file is given"),
        ({"prefix": {"share": 1.5}}, "less than or equal to 1"),
    ],
)
def test_prefix_and_source_config_errors(prompts: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Workload.model_validate({"prompts": prompts})
    assert why in str(exc.value)


# --- examples ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sharegpt", "mooncake", "burstgpt", "shared-prefix"])
def test_every_source_example_passes_check(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the examples name their data as run from the repository
    assert main(["check", f"examples/{name}.yaml"]) == 0
    out = capsys.readouterr().out
    shown = "shared prefixes: 60%" if name == "shared-prefix" else f"prompts: {name} examples/"
    assert shown in out


def test_the_file_checked_is_the_file_read(tmp_path: Path) -> None:
    """The file is held open from its check: removed afterwards, its records still read."""
    path = dataset_files.mooncake(tmp_path / "m.jsonl")
    src = make_prompt_source(workload("mooncake", path))
    first = src.spec_fields(3)
    path.unlink()
    assert src.spec_fields(3) == first
