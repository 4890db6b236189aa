"""Send guards: spend caps, Retry-After pauses and auth-failure lines, on a fake clock."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.config import Failing, RateLimit, SpendGuard
from soakd.measure.sliding import SlidingCount
from soakd.metrics.run import GuardMetrics
from soakd.model import ErrorKind, Outcome, SpendCap
from soakd.workload.failing import FailingNow
from soakd.workload.guard import TargetGuard


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def outcome(
    *, status: int = 200, error: ErrorKind | None = None, prompt: int = 0, output: int = 0,
    retry_after: float | None = None, detail: str = "",
) -> Outcome:  # fmt: skip
    o = Outcome("cloud", "p", 0, 0, status=status, error=error, error_detail=detail)
    o.prompt_tokens = prompt or None
    o.output_tokens = output
    o.retry_after_s = retry_after
    return o


def guard(
    spend: SpendGuard | None = None, rate: RateLimit | None = None, **kw: Any
) -> tuple[TargetGuard, Clock, list[tuple[str, dict[str, Any]]], CollectorRegistry]:
    clock = Clock()
    events: list[tuple[str, dict[str, Any]]] = []
    spend = spend or SpendGuard()
    registry = CollectorRegistry()
    limits = {cap: spend.limit(cap) for cap in SpendCap}
    metrics = GuardMetrics(registry)
    g = TargetGuard(
        "cloud",
        spend,
        rate or RateLimit(),
        clock=clock,
        gauges=metrics.add_target("cloud", limits),
        on_event=lambda e: events.append((e.kind, e.to_data())),
        **kw,
    )
    PUBLISH[id(registry)] = lambda: metrics.show_used({"cloud": g.used()})
    return g, clock, events, registry


PUBLISH: dict[int, Callable[[], None]] = {}
"""Per registry, what the run loop does when it publishes (soakd/run/app.py): the spend
used, set on the gauges."""


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """A series as a scrape after the run loop's next publish reads it."""
    PUBLISH[id(registry)]()
    return registry.get_sample_value(name, {"target": "cloud", **labels})


def test_total_request_cap_is_exact_and_final() -> None:
    g, clock, events, registry = guard(SpendGuard(max_requests=3))
    sent = 0
    with capture_logs() as logs:
        for _ in range(10):
            if g.delay_s() == 0:
                g.sent()
                sent += 1
            clock.t += 1
    assert sent == 3
    assert g.delay_s() == math.inf
    paused = [e for e in logs if e["event"] == "target_paused"]
    assert len(paused) == 1  # logged once, not per refused send
    assert paused[0]["cap"] == "requests"
    assert paused[0]["limit"] == 3
    assert paused[0]["note"] == "until the end of the run"
    assert events[0][0] == "target_paused"
    assert events[0][1]["cap"] == "requests"
    assert value(registry, "soakd_target_paused", reason="spend_cap") == 1
    assert value(registry, "soakd_spend_cap_hits_total", cap="requests") == 1
    assert value(registry, "soakd_spend_used", cap="requests") == 3
    assert value(registry, "soakd_spend_limit", cap="requests") == 3


def test_total_token_cap_counts_prompt_and_output() -> None:
    g, _, _, _ = guard(SpendGuard(max_tokens=100))
    g.sent()
    g.record(outcome(prompt=30, output=40))
    assert g.delay_s() == 0
    g.sent()
    g.record(outcome(prompt=30, output=0))  # 100: the cap
    assert g.delay_s() == math.inf
    assert g.tokens == 100


def test_hourly_cap_pauses_until_the_oldest_requests_leave_the_hour() -> None:
    g, clock, events, registry = guard(SpendGuard(max_requests_per_hour=2))
    start = clock.t
    g.sent()
    clock.t += 600
    g.sent()
    wait = g.delay_s()
    # the first request's 10 s bucket leaves the hour 3600 s (+ up to one bucket) after it
    assert 3000 < wait <= 3010
    clock.t = start + 600 + wait
    assert g.delay_s() == 0
    kinds = [e[0] for e in events]
    assert kinds == ["target_paused", "target_resumed"]
    assert events[0][1]["cap"] == "requests_per_hour"
    assert value(registry, "soakd_target_paused", reason="spend_cap") == 0
    assert value(registry, "soakd_target_pauses_total", reason="spend_cap") == 1


def test_hourly_token_cap() -> None:
    g, clock, _, _ = guard(SpendGuard(max_tokens_per_hour=1000))
    for _ in range(3):
        g.sent()
        g.record(outcome(prompt=100, output=300))
        clock.t += 60
    assert g.delay_s() > 3000  # 1200 tokens in the last hour
    clock.t += 3600
    assert g.delay_s() == 0


def test_sliding_count_prunes_and_is_bounded() -> None:
    c = SlidingCount(span_s=100.0, buckets=10)
    for t in range(1000):
        c.add(float(t), 1.0)
    assert c.totals(999.0)[0] <= 110  # ~the last 100 s, never less
    assert c.totals(999.0)[0] >= 100
    assert len(c) <= 12
    assert c.totals(5000.0) == (0.0, 0.0)


def test_retry_after_pauses_the_target_and_the_429_still_counts() -> None:
    g, clock, events, _ = guard(rate=RateLimit(max_pause=60))
    g.sent()
    g.record(outcome(status=429, error=ErrorKind.HTTP_429, retry_after=7))
    assert g.delay_s() == pytest.approx(7)
    assert g.paused == ("rate_limited",)
    assert g.pause_reason == "rate_limited"  # what the runner counts a send not made under
    clock.t += 7
    assert g.delay_s() == 0
    assert [e[0] for e in events] == ["target_paused", "target_resumed"]
    assert events[0][1]["reason"] == "rate_limited"
    g.record(outcome(status=429, error=ErrorKind.HTTP_429, retry_after=3600))
    assert g.delay_s() == pytest.approx(60)  # capped by max_pause
    clock.t += 100
    g.record(outcome(status=429, error=ErrorKind.HTTP_429))  # no header: default_pause
    assert g.delay_s() == pytest.approx(1.0)
    clock.t += 100
    g.record(outcome(status=503, error=ErrorKind.HTTP_5XX, retry_after=2))  # 503 + header
    assert g.delay_s() == pytest.approx(2.0)
    clock.t += 100
    g.record(outcome(status=503, error=ErrorKind.HTTP_5XX))  # a plain 503: no pause
    assert g.delay_s() == 0


def test_an_unreadable_retry_after_pauses_for_the_default() -> None:
    """A 429 or 503 whose Retry-After soakd could not read ("²", a bad date): the server
    asked for a pause, so the target pauses for rate_limit.default_pause."""
    g, clock, _, _ = guard(rate=RateLimit(default_pause=4, max_pause=60))
    for status, kind in ((429, ErrorKind.HTTP_429), (503, ErrorKind.HTTP_5XX)):
        o = outcome(status=status, error=kind)
        o.retry_after_unreadable = True
        g.record(o)
        assert g.delay_s() == pytest.approx(4.0)
        clock.t += 100
        assert g.delay_s() == 0


def test_retry_after_ignored_when_asked() -> None:
    g, _, _, _ = guard(rate=RateLimit(honour_retry_after=False))
    g.record(outcome(status=429, error=ErrorKind.HTTP_429, retry_after=30))
    assert g.delay_s() == 0


def test_auth_failures_log_one_clear_line_per_streak_without_the_key() -> None:
    g, clock, events, _ = guard(key_ref="api_key_env CLOUD_KEY")
    with capture_logs() as logs:
        for _ in range(50):
            g.record(outcome(status=401, error=ErrorKind.HTTP_AUTH, detail="http 401 auth_error"))
            clock.t += 0.1
        clock.t += 61
        g.record(outcome(status=401, error=ErrorKind.HTTP_AUTH, detail="http 401 auth_error"))
        g.record(outcome(status=200))
    failed = [e for e in logs if e["event"] == "auth_failed"]
    assert len(failed) == 2  # the first, then one a minute
    assert failed[0]["key"] == "api_key_env CLOUD_KEY"
    assert failed[0]["detail"] == "http 401 auth_error"
    assert failed[1]["failures"] == 51
    # over a minute of nothing but 401s also paused the target (failing.after: 30 s)
    assert [e["event"] for e in logs][-2:] == ["auth_recovered", "target_resumed"]
    assert [e[0] for e in events] == ["auth_failed", "target_paused", "target_resumed"]


def test_a_failing_target_is_paused_named_and_exported_and_comes_back() -> None:
    g, clock, events, registry = guard(failing=Failing(after=30.0, max_pause=60.0))
    assert value(registry, "soakd_target_failing", cause="http_404") == 0  # there from start
    assert value(registry, "soakd_target_paused", reason="failing") == 0
    with capture_logs() as logs:
        for _ in range(31):  # 404s for 30 s
            assert g.delay_s() == 0
            g.sent()
            g.record(outcome(status=404, error=ErrorKind.HTTP_4XX, detail="http 404 NotFound"))
            clock.t += 1
    paused = [e for e in logs if e["event"] == "target_paused"]
    assert len(paused) == 1
    assert (paused[0]["reason"], paused[0]["cause"]) == ("failing", "http_404")
    assert paused[0]["detail"] == "http 404 NotFound"
    assert paused[0]["log_level"] == "error"
    assert g.delay_s() > 0
    assert g.pause_reason == "failing"  # open-loop sends not made are counted under it
    assert g.failing_now() == FailingNow("http_404", "http 404 NotFound", 1.0)
    assert value(registry, "soakd_target_failing", cause="http_404") == 1
    assert value(registry, "soakd_target_paused", reason="failing") == 1
    assert value(registry, "soakd_target_pauses_total", reason="failing") == 1
    # the probe meets a refused connection now: the cause follows it
    clock.t += g.delay_s()
    assert g.delay_s() == 0
    g.sent()
    g.record(outcome(status=0, error=ErrorKind.CONNECT_REFUSED, detail="connection refused"))
    assert value(registry, "soakd_target_failing", cause="http_404") == 0
    assert value(registry, "soakd_target_failing", cause="connect_refused") == 1
    clock.t += g.delay_s()
    g.sent()
    g.record(outcome(status=200))
    assert g.delay_s() == 0
    assert g.failing_now() is None
    assert value(registry, "soakd_target_failing", cause="connect_refused") == 0
    assert value(registry, "soakd_target_paused", reason="failing") == 0
    kinds = [kind for kind, _ in events]
    assert kinds[-2:] == ["target_paused", "target_resumed"]
    # paused at 30 s; probes at 32 s (refused: 4 s more) and 36 s (answered)
    assert events[-1][1] == {"target": "cloud", "reason": "failing", "paused_s": 6.0}


def test_a_spend_cap_outranks_a_failing_pause_as_the_reason() -> None:
    g, _, _, _ = guard(SpendGuard(max_requests=1), failing=Failing(after=0.0))
    g.sent()
    g.record(outcome(status=401, error=ErrorKind.HTTP_AUTH))
    assert g.delay_s() == math.inf
    assert g.pause_reason == "spend_cap"
