"""A target failing every request in a way the next one cannot fix: the streak, the pause,
one probing request at a time, the back-off and the resume (soakd/workload/failing.py)."""

from __future__ import annotations

import pytest

from soakd.config import Failing
from soakd.model import ErrorKind, Outcome
from soakd.workload.failing import FailingWatch, failing_cause


def outcome(error: ErrorKind | None = None, status: int = 0, detail: str = "") -> Outcome:
    return Outcome("t", "p", 0, 0, status=status, error=error, error_detail=detail)


REFUSED = outcome(ErrorKind.CONNECT_REFUSED, detail="connection refused")
NOT_FOUND = outcome(ErrorKind.HTTP_4XX, 404, "http 404 NotFoundError")
OK = outcome(status=200)


@pytest.mark.parametrize(
    ("o", "cause"),
    [
        (REFUSED, "connect_refused"),
        (outcome(ErrorKind.CONNECT_ERROR, detail="dns lookup failed"), "connect_error"),
        (outcome(ErrorKind.TIMEOUT_CONNECT), "timeout_connect"),
        (outcome(ErrorKind.HTTP_AUTH, 401), "http_auth"),
        (outcome(ErrorKind.HTTP_AUTH, 403), "http_auth"),
        (NOT_FOUND, "http_404"),
        # the server's answers about one request, or its own trouble: a soak measures them
        (outcome(ErrorKind.HTTP_4XX, 400), None),
        (outcome(ErrorKind.HTTP_429, 429), None),
        (outcome(ErrorKind.HTTP_5XX, 503), None),
        (outcome(ErrorKind.TIMEOUT_TTFT), None),
        (outcome(ErrorKind.STREAM_TRUNCATED), None),
        (outcome(ErrorKind.BAD_RESPONSE, 200), None),
        (OK, None),
    ],
)
def test_only_failures_no_next_request_can_fix_count(o: Outcome, cause: str | None) -> None:
    assert failing_cause(o) == cause


def streak(w: FailingWatch, o: Outcome, start: float, until: float, step: float = 0.5) -> float:
    t = start
    while t <= until:
        change = w.record(o, t)
        if change is not None:
            return t
        t += step
    return t


def test_a_streak_pauses_after_the_configured_time_and_not_before() -> None:
    w = FailingWatch(Failing(after=10.0, max_pause=30.0))
    for t in range(10):  # 0..9 s: still a streak shorter than 10 s
        assert w.record(REFUSED, float(t)) is None
        assert w.delay_s(float(t)) == 0
    change = w.record(REFUSED, 10.0)
    assert change is not None
    assert change.paused
    assert (change.cause, change.detail, change.failures) == (
        "connect_refused",
        "connection refused",
        11,
    )
    assert change.seconds == 10.0
    assert w.delay_s(10.0) == 2.0  # the first pause
    assert w.next_probe_s(11.5) == 0.5


def test_any_other_outcome_breaks_the_streak() -> None:
    w = FailingWatch(Failing(after=10.0))
    for t in range(9):
        w.record(NOT_FOUND, float(t))
    w.record(outcome(ErrorKind.HTTP_5XX, 500), 9.0)  # the server is there: it answered
    for t in range(10, 19):
        assert w.record(NOT_FOUND, float(t)) is None  # a new streak, 9 s long
    assert not w.paused


def test_one_probe_after_each_pause_backs_off_to_the_cap_then_resumes() -> None:
    w = FailingWatch(Failing(after=0.0, max_pause=5.0))
    now = 100.0
    assert w.record(NOT_FOUND, now) is not None  # after 0: the first such failure pauses
    waits = []
    for _ in range(5):
        wait = w.delay_s(now)
        waits.append(wait)
        now += wait
        assert w.delay_s(now) == 0  # the probe's turn: exactly one send goes
        w.sent(now)
        assert w.delay_s(now) > 0  # the others wait for its answer
        assert w.next_probe_s(now) == 0
        assert w.record(NOT_FOUND, now + 0.1) is None  # it failed too: a longer pause
        now += 0.1
    assert waits == pytest.approx([2.0, 4.0, 5.0, 5.0, 5.0])  # doubling, capped
    now += w.delay_s(now)
    w.sent(now)
    back = w.record(OK, now + 0.2)
    assert back is not None
    assert not back.paused
    assert back.seconds == pytest.approx(now + 0.2 - 100.0)
    assert w.delay_s(now + 0.2) == 0
    assert w.next_probe_s(now + 0.2) is None
    assert w.pauses == 1


def test_a_failure_sent_before_the_pause_is_not_the_probes() -> None:
    w = FailingWatch(Failing(after=0.0, max_pause=30.0))
    w.record(REFUSED, 0.0)
    assert w.record(REFUSED, 0.5) is None  # in flight when the pause began
    assert w.delay_s(0.5) == pytest.approx(1.5)  # the pause is as it was: 2 s from 0


def test_a_success_in_flight_from_before_the_pause_resumes_at_once() -> None:
    w = FailingWatch(Failing(after=0.0))
    w.record(outcome(ErrorKind.HTTP_AUTH, 401), 0.0)
    change = w.record(OK, 0.3)
    assert change is not None
    assert not change.paused
    assert w.delay_s(0.3) == 0


def test_after_none_never_pauses() -> None:
    w = FailingWatch(Failing(after=None))
    assert streak(w, REFUSED, 0.0, 3600.0, step=10.0) > 3600.0
    assert not w.paused
