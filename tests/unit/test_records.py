"""The journal's events, typed (soakd/journal/records.py): every kind written through the
journal's writer, read back as the same record, and seen by the report; an older or newer
soakd's data read as far as it can be."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from soakd.journal import JournalReader, records
from soakd.journal.records import EVENTS, EventKind, Unreadable, read_event
from soakd.model import ErrorKind, PauseReason, SpendCap
from soakd.report import build_report
from tests.journal_fixtures import HOUR, FakeClock, config, open_test_journal, outcome

ONE_OF_EACH: list[records.Event] = [
    records.RunStarted("1.0", "box-a"),
    records.RunResumed("1.0", 2, "box-b"),
    records.RunStopped(completed=True),
    records.Downtime(12.5, 100.0, 112.5),
    records.WriterRestarted(2),
    records.Preflight("alpha", True, "alpha: ok", 0.25, unreached=False, warning=True),
    records.PromptCalibration(
        records.CalibrationStage.START,
        source="tokenize",
        reference="alpha",
        costs=(1, 2, 1),
        scale=1.25,
        overhead=7.0,
        from_seq=0,
        planned=120.0,
        served={"alpha": 150.0},
        failed={"beta": "HTTP 404"},
        requests=8,
        seconds=0.2,
    ),
    records.ConfigChanged(("slo.jitter", "targets[alpha].slo")),
    records.JournalLoss(3, 4, 2000 * 10**9, 1990 * 10**9),
    records.Phase("hot", 1),
    records.GatewayModes("beta", vram_breaker=True, adaptive=False),
    records.NoReuse("beta", 200, closes=True),
    records.TargetPaused(
        "alpha", PauseReason.FAILING, cause="http_auth", detail="401", failures=9, failing_for_s=4.0
    ),
    records.TargetResumed("alpha", PauseReason.FAILING, 40.0),
    records.AuthFailed("beta", 401, "api_key_env KEY"),
    records.RowsStopped(1_900_000_000, 2_000_000_000),
    records.Retention(requests=12),
    records.JournalWriteErrors("disk I/O error", 2500 * 10**9, 3, 2510 * 10**9, True, 7),
    records.CheckJudged("alpha", "steady", 41, "echo", "fail", None, "Sure! here it is"),
    records.CheckJudged("alpha", "steady", 42, "reference", "pass", 0.83),
    records.Identity("cloud", "gpt-x-0925", "fp_2", "gpt-x-0613", "fp_1"),
]


def test_every_kind_has_one_record_class() -> None:
    assert set(EVENTS) == set(EventKind)
    assert {e.kind for e in ONE_OF_EACH} == set(EventKind)
    assert all(EVENTS[kind].kind is kind for kind in EventKind)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: str(e.kind))
def test_an_event_round_trips_through_its_json(event: records.Event) -> None:
    data = json.loads(json.dumps(event.to_data()))
    assert read_event(event.kind, data) == event


def test_what_a_pause_writes_depends_on_its_reason() -> None:
    """The keys a pause carries, as the guard always wrote them."""
    cap = records.TargetPaused("t", PauseReason.SPEND_CAP, None, SpendCap.TOKENS, 100, 120.0)
    assert list(cap.to_data()) == ["target", "reason", "resume_in_s", "cap", "limit", "used"]
    rate = records.TargetPaused("t", PauseReason.RATE_LIMITED, 5.0)
    assert rate.to_data() == {"target": "t", "reason": "rate_limited", "resume_in_s": 5.0}
    failing = ONE_OF_EACH[12].to_data()
    assert list(failing) == ["target", "reason", "cause", "detail", "failures", "failing_for_s"]


def test_the_prompts_sizing_writes_each_stage_as_it_always_did() -> None:
    """A start writes the calibration (only its source when none could be made) and the
    measurement; a check the calibration and what the answers said: the keys, in the
    order sizing.py wrote them as documents; ``served`` per target at start, a sum at a
    check."""
    start = records.PromptCalibration(
        records.CalibrationStage.START, planned=256.0, served={}, failed={"a": "HTTP 404"}
    )
    assert list(start.to_data()) == [
        *("stage", "source", "planned", "served", "failed", "requests", "seconds")
    ]
    check = records.PromptCalibration(
        records.CalibrationStage.CHECK, "usage", "a", None, 1.5, 3.0, 40, changed=True
    )
    check = replace(check, target=None, answers=16, estimated=1600.0, served=1650, off_pct=3.1)
    data = json.loads(json.dumps(check.to_data()))
    assert list(data) == [
        *("stage", "source", "reference", "costs", "scale", "overhead", "from_seq"),
        *("changed", "target", "answers", "estimated", "served", "off_pct"),
    ]
    assert (data["costs"], data["target"]) == (None, None)  # written as null, as before
    assert read_event("prompt_calibration", data) == check
    for bad in ({"stage": "later"}, {"costs": "1,2"}, {"served": {"a": "many"}}):
        assert isinstance(read_event("prompt_calibration", data | bad), Unreadable), bad


def test_other_soakds_data_is_read_as_far_as_it_can_be() -> None:
    # an older soakd: a key it did not write takes the field's default; a newer one's
    # extra key is left; a float where an int was is not an int
    assert read_event("run_started", {"version": "0.9"}) == records.RunStarted("0.9", "")
    assert read_event("no_reuse", {"target": "b", "status": 200, "closes": True, "new": 1}) == (
        records.NoReuse("b", 200, True)
    )
    assert read_event("downtime", {"seconds": 3}) == records.Downtime(3.0)
    for kind, data in (
        ("a_kind_from_the_future", {"x": 1}),
        ("phase", {"name": "warm"}),  # no index
        ("no_reuse", {"target": "b", "status": 200.5}),
        ("target_paused", {"target": "t", "reason": "a_new_reason"}),
        ("phase", ["not", "an", "object"]),
    ):
        got = read_event(kind, data)
        assert isinstance(got, Unreadable), (kind, got)
        assert got.kind == kind


def test_every_kind_goes_from_the_writer_to_the_reader_to_the_report(tmp_path: Path) -> None:
    """Each record journaled through the writer process comes back from the reader as
    itself, and the report reads the ones it reads from the same records."""
    clock = FakeClock(offset_s=HOUR + 1)
    cfg = config(slo={"error_ratio": 0.5})
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(3)
    for i in range(40):
        target = ("alpha", "beta")[i % 2]
        error = ErrorKind.HTTP_AUTH if target == "alpha" else None
        phase = "warm" if i < 20 else "hot"
        j.record(outcome(rng, clock, target, phase, i, 60 + i * 80, error=error))
    for event in ONE_OF_EACH:
        j.event(event)
    j.close(completed=True)
    with JournalReader(tmp_path) as r:
        logged = r.events()
    got = [e.event for e in logged]
    assert isinstance(got[0], records.RunStarted)
    assert got[0].host
    assert got[1:-1] == ONE_OF_EACH
    assert got[-1] == records.RunStopped(completed=True)
    assert {e.session for e in logged} == {1}

    rep = build_report(tmp_path)
    assert rep.completed
    assert [d["seconds"] for d in rep.downtimes] == [12.5]
    assert rep.tested is not None
    assert rep.tested.hosts[-1] == "box-b"
    notes = "\n".join(rep.notes)
    assert "alpha: never answered a request successfully" in notes
    assert "paused as failing (http_auth: 401) 1 time(s)" in notes
    assert "beta: the server closed its connections after 200 answers" in notes
    assert "stopped writing per-request rows" in notes
    assert "retention deleted old rows" in notes
    warnings = "\n".join(rep.warnings)
    assert "the journal lost 3 request row(s)" in warnings
    assert "(3 failed writes: disk I/O error)" in warnings
    assert rep.prompt_tokens[0].at_start == 150.0
