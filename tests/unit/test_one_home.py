"""One home for each rule (issue 35, item 5): where two parts of soakd decided the same
thing by their own copy of the logic, each now asks one function. These tests hold every
caller to that home on the same inputs, so the copies cannot drift apart again."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from soakd.config.redact import config_doc
from soakd.config.slo import DISPATCH_LAG_S, AlertLimits, client_limited
from soakd.journal.stored import StoredConfig
from soakd.jsondiff import Difference, differences
from soakd.measure.analysis import SessionRow
from soakd.measure.fold import fold
from soakd.measure.notes import Notes, count_notes
from soakd.model import MissReason
from soakd.report import build_report, decisions
from soakd.report.failing import failing_notes, never_answered, never_succeeded
from soakd.report.fleet import first_difference
from soakd.report.model import Row
from soakd.run import live
from soakd.run.status import Status
from soakd.workload.prompts import SyntheticPrompts, describe_lengths, fixed_length
from soakd.workload.sizing import plan_lines
from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome

# --- client-limited: the live view's line and the report's note ------------------------------


@pytest.mark.parametrize(
    ("lag_ms", "late", "dispatch_lag", "limited"),
    [
        (None, 0, None, False),  # no lag measured
        (DISPATCH_LAG_S * 1e3, 0, None, False),  # at the default limit: not past it
        (DISPATCH_LAG_S * 1e3 + 0.1, 0, None, True),  # past it
        (0.4, 1, None, True),  # one planned send too late to make
        (60.0, 0, 0.05, True),  # past a configured limit
        (60.0, 0, 0.1, False),
    ],
)
def test_client_limited_is_one_rule_for_the_live_view_and_the_report(
    lag_ms: float | None, late: int, dispatch_lag: float | None, limited: bool
) -> None:
    assert AlertLimits().dispatch_lag == DISPATCH_LAG_S  # the config's default is the rule's
    assert client_limited(lag_ms, late, dispatch_lag) is limited
    missed = {"t": {MissReason.LATE: late}} if late else {}
    status = SimpleNamespace(  # what the live view reads of the published Status
        lag_limit_s=dispatch_lag, missed=missed, targets={"t": {"lag_p99_ms": lag_ms}}
    )
    assert live.client_limited(cast("Status", status)) == (["t"] if limited else [])
    row = Row("t", None, lag_p99_ms=lag_ms, missed_by_reason=dict(missed.get("t", {})))
    config = StoredConfig.model_validate(
        {"targets": [{"name": "t"}], "alert_limits": {"dispatch_lag": dispatch_lag}}
    )
    notes = decisions.client_limits({"t": row}, ["t"], config)
    assert any(n.startswith("CLIENT-LIMITED") for n in notes) is limited


# --- the prompt lengths in words: soakd check and the report's "What was tested" -------------


@pytest.mark.parametrize(
    ("lengths", "words"),
    [
        ({"dist": "fixed", "mean": 300}, "fixed 300"),
        ({"dist": "fixed", "mean": 5000, "max": 4096}, "fixed 4096"),  # clamped, as sent
        ({"dist": "uniform", "min": 64, "max": 512}, "uniform 64-512"),
        ({"dist": "normal", "mean": 200, "stddev": 50, "max": 400}, "normal 200 ± 50 (1-400)"),
    ],
)
async def test_prompt_lengths_are_worded_once_for_check_and_the_report(
    tmp_path: Path, lengths: dict[str, Any], words: str
) -> None:
    cfg = config(workload={"prompts": {"input_tokens": lengths}, "calibrate": "off"})
    configured = cfg.workload.prompts.input_tokens
    assert describe_lengths(configured) == words
    if configured.dist == "fixed":  # what is said is what every prompt is planned at
        prompts = SyntheticPrompts(configured)
        assert {prompts.length(s) for s in range(20)} == {fixed_length(configured)}
    assert (await plan_lines(cfg))[0] == f"prompts: synthetic, {words} tokens, seed 0"
    stored = StoredConfig.model_validate(config_doc(cfg)).workload.prompts.input_tokens
    assert describe_lengths(stored) == words
    open_test_journal(tmp_path, cfg, FakeClock()).close()
    tested = build_report(tmp_path).tested
    assert tested is not None
    assert {t.prompt_tokens_planned for t in tested.targets} == {words}


# --- where two documents differ: a resume's config check and a fleet's plan check ------------


def test_one_walk_finds_where_documents_differ_for_a_resume_and_a_fleet() -> None:
    a: dict[str, Any] = {
        "b": 1,
        "a": {"x": [1, 2]},
        "targets": [{"name": "alpha", "slo": {"e2e": 1}}, {"name": "beta"}],
        "run": {"workers": 2},
        "phases": [{"loads": 1}, {"loads": 2}],
    }
    b: dict[str, Any] = {
        "b": 2,
        "a": {"x": [1, 2, 3]},
        "targets": [{"name": "alpha", "slo": {"e2e": 2}}, {"name": "beta"}],
        "run": {"workers": 4},
        "phases": [{"loads": 1}, {"loads": 3}],
        "new": True,
    }
    walk = list(differences(a, b))
    paths = ["b", "a.x", "targets[alpha].slo.e2e", "run.workers", "phases[1].loads", "new"]
    assert [d.path for d in walk] == paths
    assert walk[1] == Difference("a.x", [1, 2], [1, 2, 3])  # other lengths: whole
    assert walk[-1] == Difference("new", None, True)  # absent: None
    # a resume (journal/resume.py): every path, sorted, but what sends nothing different
    resume = differences(a, b, skip={"run.workers"}, sort_keys=True)
    assert [d.path for d in resume] == sorted(set(paths) - {"run.workers"})
    # a fleet (report/fleet.py): the first, lists of other lengths by their counts
    assert first_difference(a, b) == ("b", 1, 2)
    assert first_difference(a["a"], b["a"]) == ("x (count)", 2, 3)
    assert first_difference(a, a) is None


# --- the answers' notes: the writer's fold (journal, Metrics) and the /status sink ------------


def test_notes_are_counted_once_for_the_fold_and_the_sink() -> None:
    rng, clock = random.Random(3), FakeClock(offset_s=5)
    outs = []
    for i in range(60):
        o = outcome(rng, clock, ("alpha", "beta")[i % 2], "warm", i, 5 + i * 0.01)
        if i % 5 == 0:
            o.usage_reported, o.usage_rejected = False, "negative"
        if i % 7 == 0:
            o.usage_delta = -3  # usage below the stream: a mismatch
        if i % 11 == 0:
            o.retry_after_unreadable = True
        outs.append(o)
    sink = Notes()
    for o in outs:
        sink.record(o)
    assert fold(outs).notes == sink.counts  # the same count, made by count_notes
    assert sink.counts[("alpha", "usage_rejected:negative")] == 6
    counts: dict[tuple[str, str], int] = {}
    first, again = outs[0], outs[10]  # both alpha, usage rejected (and more for the first)
    assert count_notes(first, counts) == (
        "usage_rejected:negative",
        "usage_mismatch:below",
        "retry_after_unreadable",
    )
    assert count_notes(again, counts) == ()  # counted, not new
    assert counts[("alpha", "usage_rejected:negative")] == 2
    assert count_notes(outs[1], counts) == ()  # most answers carry none


# --- never succeeded: the report's note and soakd run's exit status ---------------------------


@pytest.mark.parametrize(
    ("requests", "not_judged", "ok", "dead"),
    [
        (0, 0, 0, False),  # nothing sent
        (5, 5, 0, False),  # all cut at the stop: nothing judged
        (5, 2, 0, True),
        (5, 0, 1, False),
    ],
)
def test_never_succeeded_is_one_rule_for_the_report_and_the_exit_status(
    requests: int, not_judged: int, ok: int, dead: bool
) -> None:
    assert never_succeeded(requests, not_judged, ok) is dead
    kinds = {"http_5xx": 1, "timeout": 2} if requests > ok + not_judged else {}
    row = Row("t", None, requests=requests, not_judged=not_judged, ok=ok, errors_by_kind=kinds)
    summary = cast(
        "SessionRow",
        {"requests": requests, "not_judged": not_judged, "ok": ok, "errors_by_kind": kinds},
    )
    said = {"t": "timeout 2, http_5xx 1"} if dead else {}
    assert never_answered({"t": row}) == said  # the exit status, from the report
    assert never_answered({"t": summary}) == said  # from the session, without one
    notes = failing_notes([], {"t": row}, ["t"], 0.0)
    assert any("never answered a request successfully" in n for n in notes) is dead
