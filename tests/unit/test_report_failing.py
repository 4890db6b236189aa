"""The report's notes on targets that never succeeded or were paused as failing
(soakd/report/failing.py), from journal events and rows."""

from __future__ import annotations

from typing import Any

from soakd.journal.records import Logged, read_event
from soakd.report.failing import failing_notes, never_answered
from soakd.report.model import Row


def event(kind: str, at_s: float, **data: Any) -> Logged:
    """A journaled event, as the reader gives it."""
    return Logged(1, 0.0, int(at_s * 1e9), read_event(kind, data))


def test_a_target_that_never_answered_and_was_paused_till_the_end() -> None:
    dead = Row("cloud", None, requests=67, ok=0)
    dead.errors_by_kind = {"http_auth": 67}
    dead.missed_by_reason = {"failing": 398}
    fine = Row("edge", None, requests=500, ok=500)
    events = [
        event("phase", 0.0, name="steady", index=0),
        event("target_paused", 30.0, target="cloud", reason="failing", cause="http_auth",
              detail="http 401"),
        event("target_resumed", 32.5, target="cloud", reason="failing", paused_s=2.5),
        event("target_paused", 40.0, target="cloud", reason="failing", cause="http_auth",
              detail="http 401"),
        event("target_paused", 50.0, target="edge", reason="rate_limited"),  # not failing
    ]  # fmt: skip
    notes = failing_notes(events, {"cloud": dead, "edge": fine}, ["cloud", "edge"], 60.0)
    assert notes == [
        "cloud: never answered a request successfully (67 sent: http_auth 67); paused as "
        "failing (http_auth: http 401) 2 time(s), 22 s in all, until the end, one request "
        "at a time probing it; 398 planned sends not made meanwhile"
    ]


def test_nothing_to_say_of_a_target_that_answered_or_was_never_sent_to() -> None:
    some = Row("a", None, requests=10, ok=1)
    none_sent = Row("b", None)
    assert failing_notes([], {"a": some, "b": none_sent}, ["a", "b"], 10.0) == []


def test_a_target_whose_every_request_soakd_cut_at_the_stop_did_not_fail() -> None:
    """Stopped before the first answer came back: the cut requests judge nothing."""
    cut = Row("slow", None, requests=6, ok=0, not_judged=6)
    cut.errors_by_kind = {"cancelled": 6}
    assert never_answered({"slow": cut}) == {}
    assert failing_notes([], {"slow": cut}, ["slow"], 10.0) == []
    one_failed = Row("slow", None, requests=7, ok=0, not_judged=6, errors=1)
    assert list(never_answered({"slow": one_failed})) == ["slow"]
