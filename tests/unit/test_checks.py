"""Checks (docs/checks.md): which requests are checks, what they ask, how their answers are
judged, what a bad checks file says, and the simulator answering them (right, then wrong)."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.checks import builtin
from soakd.checks.expect import read_checks
from soakd.checks.identity import Identities
from soakd.checks.mix import ANSWER_SHOWN, Checks, Judged
from soakd.config import ChecksConfig, ConfigError, config_from_dict
from soakd.model import Outcome, RequestSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = RequestSpec("a", "steady", 0, "a synthetic prompt", 5, 64, 0.7, 0)


def _answered(spec: RequestSpec, answer: str, identity: tuple[str, str] | None = None) -> Outcome:
    o = Outcome.planned(spec)
    o.answer, o.identity, o.end_ns = answer, identity, 1
    return o


def test_a_share_of_the_seqs_are_checks_the_same_for_every_target() -> None:
    checks = Checks(ChecksConfig(share="10%"), lambda _: None)
    picked = {t: [s for s in range(20_000) if checks.is_check(t, s, 0)] for t in ("a", "b")}
    assert picked["a"] == picked["b"]  # the same seqs: a fair A/B
    assert 1_900 < len(picked["a"]) < 2_100


def test_every_sends_one_check_per_interval_per_target() -> None:
    checks = Checks(ChecksConfig(every="1s"), lambda _: None)
    instants = range(0, 10_000_000_000, 100_000_000)  # 10 s, one request every 100 ms
    assert sum(checks.is_check("a", i, t) for i, t in enumerate(instants)) == 10
    assert checks.is_check("b", 0, 5_000_000_000)  # another target: its own clock


def test_a_check_is_sent_at_temperature_0_with_its_answer_kept() -> None:
    checks = Checks(ChecksConfig(share=1.0, kinds=["arithmetic"]), lambda _: None)
    spec = checks.spec(replace(SPEC, output_planned=True))
    assert spec.temperature == 0
    assert spec.keep_answer
    assert not spec.output_planned
    assert spec.max_tokens == 32
    assert builtin.solve(spec.prompt) is not None  # one the simulator recognises
    untouched = Checks(ChecksConfig(share=1e-9), lambda _: None)
    assert untouched.spec(SPEC) is SPEC


@pytest.mark.parametrize("kind", ["number_words", "arithmetic", "echo"])
def test_builtin_answers_judged_and_solved(kind: str) -> None:
    rng = random.Random(7)
    for _ in range(200):
        prompt, right = builtin.make(kind, rng)
        assert builtin.solve(prompt) == right
        assert builtin.judge(kind, right, f"Sure: {right}").result == "pass"
        wrong = str(int(right) + 1) if right.isdigit() else right[::-1]
        assert builtin.judge(kind, right, wrong).result == "fail"
    assert builtin.judge(kind, "12", "").result == "unparseable"
    assert builtin.solve("Tell me a story.") is None


def test_number_words() -> None:
    assert builtin.number_words(0) == "zero"
    assert builtin.number_words(42) == "forty-two"
    assert builtin.number_words(700) == "seven hundred"
    assert builtin.number_words(913) == "nine hundred thirteen"


def _judged(cfg: ChecksConfig, answers: list[str], target: str = "a") -> list[Judged]:
    got: list[Judged] = []
    checks = Checks(cfg, got.append)
    for seq, answer in enumerate(answers):
        spec = checks.spec(replace(SPEC, target=target, seq=seq))
        checks.record(_answered(spec, answer))
    return got


def test_the_users_checks_each_way(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"prompt": "p", "expect": "  tac "}\n'
        '{"prompt": "p", "expect": {"regex": "(?i)paris"}}\n'
        '{"messages": [{"role": "user", "content": "p"}], "expect": {"contains": "42"}}\n'
        '{"prompt": "p", "expect": {"json_schema": {"type": "object", "required": ["n"]}}}\n'
    )
    exact, regex, contains, schema = read_checks(path)
    assert exact.judge("tac\n").result == "pass"
    assert exact.judge("tact").result == "fail"
    assert regex.judge("It is PARIS.").result == "pass"
    assert contains.judge("forty-two").result == "fail"
    assert schema.judge('```json\n{"n": 1}\n```').result == "pass"
    assert schema.judge('{"m": 1}').result == "fail"
    assert schema.judge("no JSON here").result == "unparseable"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"prompt": "p"', "not valid JSON"),
        ('{"prompt": "p"}', '"expect" is missing'),
        ('{"prompt": "p", "expect": {"regex": "a("}}', '"expect.regex" is not a valid regular'),
        (
            '{"prompt": "p", "expect": {"json_schema": {"type": "nope"}}}',
            '"expect.json_schema" is not a valid schema',
        ),
        ('{"prompt": "p", "expect": {"fuzzy": "x"}}', "one of exact, regex, contains"),
        ('{"prompt": "", "expect": "x"}', '"prompt" must be a non-empty string'),
    ],
)
def test_a_bad_checks_line_is_one_line_naming_file_line_and_field(
    tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "checks.jsonl"
    path.write_text('{"prompt": "fine", "expect": "x"}\n\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        read_checks(path)
    text = str(err.value)
    assert text.startswith(f"checks.file: {path}:3: ")
    assert says in text
    assert "\n" not in text


def _cfg(**checks: Any) -> dict[str, Any]:
    return {
        "targets": [{"name": "a", "simulator": "fast"}],
        "phases": [{"name": "p", "duration": "1s", "load": {"mode": "closed", "concurrency": 1}}],
        "checks": checks,
    }


@pytest.mark.parametrize(
    ("checks", "says"),
    [
        ({"share": "150%"}, "checks.share: a share is at most 100 % (1), got '150%'"),
        ({"share": "1%", "every": "30s"}, "set exactly one of share"),
        ({}, "set exactly one of share"),
        (
            {"share": 0.1, "reference": {"prompts": ["x"], "target": "b"}},
            "checks.reference.target: unknown target 'b'",
        ),
    ],
)
def test_bad_checks_config(checks: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        config_from_dict(_cfg(**checks))
    assert says in str(err.value)


def test_soakd_check_exits_2_on_a_bad_checks_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "expect": {"regex": "["}}\n')
    config = tmp_path / "soak.yaml"
    config.write_text(yaml.safe_dump(_cfg(share="1%", file=str(bad))))
    proc = subprocess.run(
        [sys.executable, "-m", "soakd", "check", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f'soakd: error: checks.file: {bad}:1: "expect.regex" is not a valid regular '
        "expression: unterminated character set at position 0"
    ]


def test_the_example_checks_config_is_valid() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "soakd", "check", "examples/checks.yaml"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "checks: 5 % of each target's requests" in proc.stdout


def test_reference_first_answer_kept_later_ones_scored() -> None:
    cfg = ChecksConfig(share=1.0, kinds=[], reference={"prompts": ["one prompt"]})
    base = "the quick brown fox jumps over the lazy dog"
    got = _judged(cfg, [base, base, "the quick brown fox jumps", "nothing alike at all here"])
    assert [(j.result, j.score) for j in got] == [
        ("pass", 1.0),
        ("pass", pytest.approx(0.7143, abs=1e-3)),
        ("fail", 0.0),
    ]
    assert got[-1].answer == "nothing alike at all here"  # a failing answer, shown


def test_reference_of_another_target() -> None:
    got: list[Judged] = []
    cfg = ChecksConfig(share=1.0, kinds=[], reference={"prompts": ["p"], "target": "cloud"})
    checks = Checks(cfg, got.append)
    for seq, (target, answer) in enumerate(
        [("local", "too early"), ("cloud", "blue sky"), ("local", "blue sky"), ("local", "red")]
    ):
        spec = checks.spec(replace(SPEC, target=target, seq=seq))
        checks.record(_answered(spec, answer))
    assert [(j.target, j.result) for j in got] == [("local", "pass"), ("local", "fail")]


def test_a_failed_request_is_not_judged_and_a_long_answer_is_cut() -> None:
    got: list[Judged] = []
    checks = Checks(ChecksConfig(share=1.0, kinds=["echo"]), got.append)
    failed = _answered(checks.spec(SPEC), "")
    failed.status = 500
    failed.error = __import__("soakd.model", fromlist=["ErrorKind"]).ErrorKind.HTTP_5XX
    checks.record(failed)
    checks.record(_answered(checks.spec(replace(SPEC, seq=1)), "x" * 1000))
    assert len(got) == 1
    assert got[0].result == "fail"
    assert got[0].answer == "x" * ANSWER_SHOWN


def test_identity_changes_are_reported_once() -> None:
    seen: list[tuple[str, tuple[str, str], tuple[str, str] | None]] = []
    ids = Identities(lambda t, now, before: seen.append((t, now, before)))
    for identity in [("gpt-x-0613", "fp1"), ("gpt-x-0613", "fp1"), ("gpt-x-0613", "")]:
        ids.seen("cloud", identity)
    ids.seen("cloud", ("gpt-x-0925", "fp2"))
    ids.seen("local", ("m", ""))
    assert seen == [
        ("cloud", ("gpt-x-0613", "fp1"), None),
        ("cloud", ("gpt-x-0925", "fp2"), ("gpt-x-0613", "fp1")),
        ("local", ("m", ""), None),
    ]


@pytest.mark.parametrize("stream", [True, False])
async def test_the_simulator_answers_checks_right_then_wrong(stream: bool) -> None:
    from soakd.config import TargetConfig
    from soakd.profiles import get_profile
    from soakd.sim.server import start_sim
    from soakd.targets.openai import open_target

    right_sim = await start_sim("127.0.0.1", 0, get_profile("fast"), "m")
    wrong_sim = await start_sim(
        "127.0.0.1",
        0,
        get_profile("fast", wrong_answers_after_s=0.0, model_switch_after_s=0.0),
        "m",
    )
    judged: list[Judged] = []
    checks = Checks(ChecksConfig(share=1.0), judged.append)
    try:
        for sim in (right_sim, wrong_sim):
            target = await open_target(
                TargetConfig(name="a", base_url=sim.url, model="m", stream=stream)
            )
            try:
                for seq in range(6):
                    spec = checks.spec(replace(SPEC, seq=seq))
                    checks.record(await target.send(spec))
                greedy = replace(SPEC, temperature=0.0, keep_answer=True, max_tokens=8)
                first, again = await target.send(greedy), await target.send(greedy)
                assert first.answer == again.answer  # temperature 0: the same words
                drifted = ("soakd-sim-0925", "fp_sim0925")
                assert first.identity == (("m", "") if sim is right_sim else drifted)
            finally:
                await target.aclose()
    finally:
        await right_sim.aclose()
        await wrong_sim.aclose()
    assert [j.result for j in judged] == ["pass"] * 6 + ["fail"] * 6


async def test_the_preflight_records_what_the_target_says_it_is() -> None:
    from soakd.config import TargetConfig
    from soakd.profiles import get_profile
    from soakd.sim.server import SIM_VERSION, start_sim
    from soakd.targets.preflight import preflight

    sim = await start_sim("127.0.0.1", 0, get_profile("fast"), "m")
    try:
        cfg = TargetConfig(name="a", base_url=sim.url, model="m")
        (asked,) = await preflight([cfg], identity=True)
        (plain,) = await preflight([cfg])
    finally:
        await sim.aclose()
    assert asked.ok
    assert (asked.models, asked.version, asked.identity) == (("m",), SIM_VERSION, ("m", ""))
    assert plain.identity is None  # asked as a check only when the run has checks


async def test_a_check_is_asked_with_a_seed_and_nothing_else_is() -> None:
    import json

    from soakd.config import TargetConfig
    from soakd.targets.openai import open_target

    target = await open_target(TargetConfig(name="a", base_url="http://127.0.0.1:9", model="m"))
    try:
        check = Checks(ChecksConfig(share=1.0), lambda _: None).spec(SPEC)
        asked = json.loads(target.body(check))
        plain = json.loads(target.body(SPEC))
        greedy = json.loads(target.body(replace(SPEC, temperature=0.0)))
    finally:
        await target.aclose()
    assert (asked["seed"], asked["temperature"]) == (0, 0.0)
    assert "seed" not in plain
    assert "seed" not in greedy  # temperature 0 alone: the body as before


def test_the_reports_checks_and_the_correct_ratio_verdict() -> None:
    from soakd.config import Slo
    from soakd.journal.records import CheckJudged, Identity, Logged
    from soakd.measure.goodput import Tally
    from soakd.measure.verdicts import judge
    from soakd.report.checks import check_tables, checked, correct_ratio
    from soakd.report.model import Row

    def at(s: float, e: Any) -> Logged:
        return Logged(1, 1e9 + s, int(s * 1e9), e)

    events = [at(i, CheckJudged("a", "steady", i, "echo", "pass")) for i in range(9)]
    events += [
        at(9, CheckJudged("a", "spike", 9, "echo", "fail", None, "olleh\\nworld")),
        at(10, CheckJudged("b", "steady", 10, "reference", "pass", 0.9)),
        at(11, CheckJudged("b", "steady", 11, "reference", "fail", 0.2, "x")),
        at(0, Identity("b", "gpt-x-0613", "fp_1")),
        at(3725, Identity("b", "gpt-x-0925", "fp_2", "gpt-x-0613", "fp_1")),
    ]
    c = checked(events, {("a", "steady"): 90, ("a", "spike"): 10, ("b", "steady"): 20}, ["a", "b"])
    assert c is not None
    assert [(r.target, r.phase, r.judged, r.pass_ratio, r.share) for r in c.rows] == [
        ("a", "steady", 9, 1.0, 0.1),
        ("a", "spike", 1, 0.0, 0.1),
        ("b", "steady", 2, 0.5, 0.1),
    ]
    assert correct_ratio(c, "a", None) == 0.9
    assert c.identity == ["b: gpt-x-0613 (fp_1) → gpt-x-0925 (fp_2) at 1h02m05s"]
    assert [(s.target, s.n, s.low, s.high) for s in c.similarity] == [("b", 2, 0.2, 0.9)]
    titles = [t.title for t in check_tables(c)]
    assert titles == [
        "Checks: answers judged (pass ratio per target and phase)",
        "Checks: the first failing answers",
        "Checks: reference similarity (ROUGE-L F1)",
    ]
    assert c.failing[0].answer == "olleh\\nworld"
    verdict = judge("a", None, Slo(correct_ratio=0.95), Row("a", None, correct_ratio=0.9), Tally())
    assert [(x.name, x.measured, x.passed) for x in verdict.criteria] == [
        ("correct_ratio", 0.9, False)
    ]
    none = judge("a", None, Slo(correct_ratio=0.95), Row("a", None), Tally())
    assert none.criteria[0].passed is None
    assert none.criteria[0].note == "no check judged"
