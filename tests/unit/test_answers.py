"""Planned answer lengths (issue 36): drawn per seq from the seed (the same on every target),
or a prompt file's own per line; sent as each request's max_tokens, with ``ignore_eos`` or
``min_tokens`` where the target is asked to serve them whole; served whole by the
simulator so asked; and shown planned against served in the report."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.cli import main
from soakd.config import ConfigError, TargetConfig, TokenLength, Workload, config_from_dict
from soakd.model import RequestSpec
from soakd.profiles import get_profile
from soakd.report import build_report, render_markdown
from soakd.shapes import Closed
from soakd.sim.engine import Engine
from soakd.sim.wire import ApiError, parse
from soakd.targets import open_target
from soakd.workload.answers import AnswerLengths, answer_lengths, asked_as, target_asks
from soakd.workload.prompts import FilePrompts, SyntheticPrompts, make_prompt_source
from soakd.workload.runner import Runner
from tests.fakes import FakeTarget, Prompts, Sink, plan_of
from tests.journal_fixtures import HOUR, FakeClock, config, open_test_journal, outcome

UNIFORM = TokenLength(dist="uniform", min=16, max=256)


# --- drawn per seq -------------------------------------------------------------------------


def test_every_target_gets_the_same_planned_length_for_the_same_seq() -> None:
    a, b = AnswerLengths(UNIFORM, seed=7), AnswerLengths(UNIFORM, seed=7)
    seqs = list(range(5000))
    random.Random(1).shuffle(seqs)  # in any order, as each target numbers its own
    assert [a(s) for s in seqs] == [b(s) for s in seqs]
    lengths = [a(s) for s in range(5000)]
    assert all(n is not None and 16 <= n <= 256 for n in lengths)
    assert statistics.fmean(n or 0 for n in lengths) == pytest.approx(136, rel=0.03)
    assert {a(s) for s in range(5000)} == set(range(16, 257))  # the whole range drawn
    assert [a(s) for s in range(50)] != [AnswerLengths(UNIFORM, seed=8)(s) for s in range(50)]


def test_answer_lengths_are_drawn_apart_from_prompt_lengths() -> None:
    """The same distribution for both: the answer of a seq is not its prompt's length."""
    prompts = SyntheticPrompts(UNIFORM, seed=3)
    answers = AnswerLengths(UNIFORM, seed=3)
    pairs = [(prompts.length(s), answers(s)) for s in range(2000)]
    assert sum(p == a for p, a in pairs) < 40  # ~1 in 241 by chance
    drawn = [float(a or 0) for _, a in pairs]
    assert abs(statistics.correlation([float(p) for p, _ in pairs], drawn)) < 0.1


def test_normal_and_fixed_lengths() -> None:
    normal = AnswerLengths(TokenLength(dist="normal", mean=300, stddev=50, min=1, max=4096))
    drawn = [normal(s) or 0 for s in range(4000)]
    assert statistics.fmean(drawn) == pytest.approx(300, rel=0.02)
    assert statistics.stdev(drawn) == pytest.approx(50, rel=0.06)
    fixed = AnswerLengths(TokenLength(mean=2000, max=4096))
    assert {fixed(s) for s in range(100)} == {2000}
    assert answer_lengths(None, 0) is None  # nothing planned: workload.max_tokens caps


async def test_the_planned_length_is_the_requests_max_tokens() -> None:
    """Above workload.max_tokens too: the plan is what the request asks for."""

    class Seen(FakeTarget):
        def __init__(self) -> None:
            super().__init__("a", delay_s=0.001)
            self.specs: list[RequestSpec] = []

        async def send(self, spec: RequestSpec, outcome: Any = None) -> Any:
            self.specs.append(spec)
            return await super().send(spec, outcome)

    answers = AnswerLengths(TokenLength(dist="uniform", min=600, max=900), seed=1)
    for planned in (answers, None):
        target = Seen()
        plan = plan_of(("p", 60, {"a": Closed(2)}))
        runner = Runner(
            plan,
            {"a": target},
            Prompts(),
            [Sink()],
            max_tokens=512,
            temperature=0.7,
            answers=planned,
        )
        await runner.run()
        await runner.drain(5)
        assert target.specs
        for spec in target.specs:
            if planned is None:
                assert (spec.max_tokens, spec.output_planned) == (512, False)
            else:
                assert (spec.max_tokens, spec.output_planned) == (answers(spec.seq), True)
                assert spec.max_tokens > 512


# --- a prompt file's own lengths ---------------------------------------------------------------


def write_jsonl(tmp_path: Path, *records: Any) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_file_line_gives_its_own_answer_length(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path,
        {"prompt": "one", "output_tokens": 40},
        {"messages": [{"role": "user", "content": "two"}]},  # none of its own
        {"prompt": "three", "output_tokens": 1200},
    )
    lines = FilePrompts(path)
    only_lines = answer_lengths(None, 0, lines)
    assert only_lines is not None
    assert [only_lines(s) for s in range(6)] == [40, None, 1200, 40, None, 1200]
    # a distribution beside it plans the lines that give none
    both = answer_lengths(TokenLength(mean=64), 0, lines)
    assert both is not None
    assert [both(s) for s in range(3)] == [40, 64, 1200]
    # a file with no output_tokens plans nothing
    plain = FilePrompts(write_jsonl(tmp_path, {"prompt": "a"}, {"prompt": "b"}))
    assert answer_lengths(None, 0, plain) is None


@pytest.mark.parametrize("value", [0, -3, 2.5, "64", True, None, [64], 1 << 21])
def test_a_bad_output_tokens_names_file_line_and_field(tmp_path: Path, value: object) -> None:
    path = write_jsonl(
        tmp_path, {"prompt": "fine", "output_tokens": 8}, {"prompt": "bad", "output_tokens": value}
    )
    with pytest.raises(ConfigError) as info:
        FilePrompts(path)
    text = str(info.value)
    assert text.startswith(f"workload.prompts.file: {path}:2: ")
    assert '"output_tokens" must be a whole number of tokens from 1 to 1,048,576' in text
    assert "\n" not in text


def test_check_says_the_plan_and_stops_at_a_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_jsonl(tmp_path, {"prompt": "a", "output_tokens": 8})
    doc: dict[str, Any] = {
        "targets": [
            {"name": "sim", "simulator": "fast"},
            {"name": "cloud", "base_url": "https://api.example.com", "model": "m"},
        ],
        "workload": {
            "seed": 4,
            "prompts": {
                "source": "file",
                "file": str(good),
                "output_tokens": {"dist": "uniform", "min": 16, "max": 64},
            },
        },
        "phases": [{"name": "p", "duration": "1m"}],
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    assert main(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert (
        "answers: planned, the prompt file's lines', else uniform 16-64 tokens, seed 4: "
        "each request's max_tokens" in out
    )
    assert "  sim: asked with ignore_eos" in out
    assert "  cloud: asked with max_tokens alone: an answer may end early" in out

    good.write_text('{"prompt": "a"}\n{"prompt": "b", "output_tokens": "many"}\n')
    assert main(["check", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f'soakd: error: workload.prompts.file: {good}:2: "output_tokens" must be a whole '
        'number of tokens from 1 to 1,048,576, got "many"'
    )


# --- how a target is asked -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "asked"),
    [
        ({"base_url": "http://127.0.0.1:8000"}, "ignore_eos"),  # vLLM, llama.cpp on the box
        ({"base_url": "http://10.1.2.3:8000/v1"}, "ignore_eos"),  # on the LAN
        ({"simulator": "fast"}, "ignore_eos"),
        ({"base_url": "https://api.openai.com/v1"}, "none"),  # refuses unknown keys
        ({"base_url": "https://x.openai.azure.com", "kind": "azure", "api_version": "1"}, "none"),
        ({"base_url": "https://vllm.example.com", "planned_output": "ignore_eos"}, "ignore_eos"),
        ({"base_url": "http://127.0.0.1:8000", "planned_output": "min_tokens"}, "min_tokens"),
        ({"base_url": "http://127.0.0.1:8000", "planned_output": "none"}, "none"),
    ],
)
def test_how_a_target_is_asked(target: dict[str, Any], asked: str) -> None:
    cfg = TargetConfig(name="t", model="m", **target)
    assert target_asks(cfg) == asked
    stored = json.loads(cfg.model_dump_json())  # as the report reads a journal's config
    assert (
        asked_as(stored["planned_output"], stored["base_url"], stored["simulator"], stored["kind"])
        == asked
    )


def spec(max_tokens: int, planned: bool) -> RequestSpec:
    return RequestSpec("t", "p", 3, "hello", 1, max_tokens, 0.7, 0, 0, planned)


@pytest.mark.parametrize(
    ("setting", "extra"),
    [
        ("ignore_eos", {"ignore_eos": True}),
        ("min_tokens", {"min_tokens": 77}),
        ("none", {}),
    ],
)
async def test_the_body_asks_for_the_planned_length(setting: str, extra: dict[str, Any]) -> None:
    target = await open_target(
        TargetConfig(name="t", base_url="http://127.0.0.1:9", model="m", planned_output=setting)
    )
    try:
        body = json.loads(target.body(spec(77, True)))
        asked = {k: body[k] for k in ("ignore_eos", "min_tokens") if k in body}
        assert (body["max_tokens"], asked) == (77, extra)
        unplanned = json.loads(target.body(spec(512, False)))  # max_tokens caps it, no more
        assert unplanned["max_tokens"] == 512
        assert "ignore_eos" not in unplanned
        assert "min_tokens" not in unplanned
    finally:
        await target.aclose()


async def test_extra_body_still_wins() -> None:
    cfg = TargetConfig(
        name="t", base_url="http://127.0.0.1:9", model="m", extra_body={"ignore_eos": False}
    )
    target = await open_target(cfg)
    try:
        assert json.loads(target.body(spec(77, True)))["ignore_eos"] is False
    finally:
        await target.aclose()


# --- the simulator serves them -----------------------------------------------------------------


def lengths_served(engine: Engine) -> dict[int, int]:
    served: dict[int, int] = {}
    while engine.has_work():
        for ev in engine.step().tokens:
            served[ev.seq_id] = served.get(ev.seq_id, 0) + 1
    return served


def test_the_simulator_honours_ignore_eos_and_min_tokens() -> None:
    engine = Engine(get_profile("fast-eos", seed=5))
    plain = [engine.submit(10, 300) for _ in range(30)]
    ignored = [engine.submit(10, 300, ignore_eos=True) for _ in range(10)]
    at_least = [engine.submit(10, 300, min_tokens=300) for _ in range(10)]
    some = [engine.submit(10, 300, min_tokens=120) for _ in range(30)]
    served = lengths_served(engine)
    assert statistics.fmean(served[i] for i in plain) < 100  # ~50 at 2 % a token
    assert {served[i] for i in ignored + at_least} == {300}
    assert min(served[i] for i in some) > 120  # no EOS before min_tokens: the next may be
    always = Engine(get_profile("fast", eos_probability=1.0))
    first = always.submit(10, 50)
    later = always.submit(10, 50, min_tokens=20)
    assert lengths_served(always) == {first: 1, later: 21}


def test_the_simulator_checks_min_tokens_as_vllm_does() -> None:
    profile = get_profile("fast")
    body = {"model": "m", "prompt": "a b c", "max_tokens": 10}
    assert parse({**body, "min_tokens": 10}, False, profile, "m").min_tokens == 10
    assert parse(body, False, profile, "m").min_tokens == 0
    for bad, said in (
        (11, "min_tokens must be less than or equal to max_tokens=10, got 11."),
        (-1, "min_tokens must be greater than or equal to 0, got -1."),
    ):
        with pytest.raises(ApiError) as info:
            parse({**body, "min_tokens": bad}, False, profile, "m")
        assert (info.value.status, info.value.param, info.value.message) == (
            400,
            "min_tokens",
            said,
        )


# --- the report ----------------------------------------------------------------------------


def test_the_report_shows_planned_against_served_and_notes_a_short_target(
    tmp_path: Path,
) -> None:
    """alpha (local: ignore_eos by default) serves its plan; beta, asked with max_tokens
    alone, stops at about half: a row each, and a note for beta only."""
    clock = FakeClock(offset_s=HOUR + 1)
    lengths = {"dist": "uniform", "min": 16, "max": 256}
    cfg = config(
        targets=[
            {"name": "alpha", "base_url": "http://127.0.0.1:1"},
            {"name": "beta", "base_url": "http://127.0.0.1:2", "planned_output": "none"},
        ],
        workload={"seed": 5, "prompts": {"output_tokens": lengths}},
    )
    planned = AnswerLengths(TokenLength(**lengths), seed=5)
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(2)
    want: dict[str, list[int]] = {"alpha": [], "beta": []}
    for i in range(200):
        for target in ("alpha", "beta"):
            o = outcome(rng, clock, target, "warm", i, 60 + i * 10)
            p = planned(i) or 0
            o.output_tokens = p if target == "alpha" else p // 2
            want[target].append(p)
            j.record(o)
    j.close(completed=True)

    rep = build_report(tmp_path)
    rows = {r.target: r for r in rep.output_tokens}
    assert rows["alpha"].planned == pytest.approx(statistics.fmean(want["alpha"]))
    assert rows["alpha"].served == rows["alpha"].planned
    assert rows["alpha"].off == 0.0
    assert rows["beta"].off == pytest.approx(-0.5, abs=0.01)
    assert (rows["alpha"].asked_with, rows["beta"].asked_with) == ("ignore_eos", "none")
    notes = [n for n in rep.notes if "output tokens an answer" in n]
    assert len(notes) == 1
    assert notes[0].startswith("beta: ")
    assert "asked with max_tokens alone (targets[].planned_output: none)" in notes[0]
    text = render_markdown(rep)
    assert "## Output tokens: planned against served" in text
    assert "| beta | 200 |" in text
    assert "max_tokens alone (may end early)" in text
    assert "planned uniform 16-256 (ignore_eos) / " in text  # what was tested
    assert "planned uniform 16-256 (max_tokens alone) / " in text


def test_no_plan_no_table(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=HOUR + 1)
    j = open_test_journal(tmp_path, config(), clock)
    rng = random.Random(2)
    for i in range(20):
        j.record(outcome(rng, clock, "alpha", "warm", i, 60 + i * 10))
    j.close(completed=True)
    rep = build_report(tmp_path)
    assert rep.output_tokens == []
    assert "Output tokens: planned" not in render_markdown(rep)


def test_the_config_reads_both_sources(tmp_path: Path) -> None:
    raw = {
        "targets": [{"name": "s", "simulator": "fast"}],
        "workload": {"prompts": {"output_tokens": {"dist": "uniform", "min": 1, "max": 9}}},
        "phases": [{"name": "p", "duration": "1m"}],
    }
    wl: Workload = config_from_dict(raw).workload
    assert wl.longest_answer == 9  # what the sender sizing counts
    assert Workload().longest_answer == 512
    source = make_prompt_source(wl)
    assert isinstance(source, SyntheticPrompts)
    with pytest.raises(ConfigError, match=r"output_tokens.*min \(10\) is above max \(9\)"):
        config_from_dict({**raw, "workload": {"prompts": {"output_tokens": {"min": 10, "max": 9}}}})
