"""Workload room, send guard: when a target may be sent to (spend caps, Retry-After pauses,
a target failing every request: failing.py).

One ``TargetGuard`` per target. The runner asks ``delay_s()`` before each send and says
``sent()``; a send it cannot make is the runner's to count, under ``pause_reason``. As an
OutcomeSink the guard reads every finished request for its tokens, its 429s, its auth
failures and its failing streak. Pauses are never silent: each start and end is logged,
handed to ``on_event`` (the journal) and exported (``GuardMetrics``). A cap that can never
free up again (a total) pauses the target for the rest of the run.

Pure apart from the clock, which is injected (tests pass a fake one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Final, Protocol

import structlog

from soakd.config import Failing, RateLimit, SpendGuard
from soakd.journal.records import AuthFailed, Event, TargetPaused, TargetResumed
from soakd.measure.sliding import SlidingCount
from soakd.model import ErrorKind, Finished, MissReason, PauseReason, SpendCap
from soakd.workload.failing import Change, FailingNow, FailingWatch

log = structlog.get_logger()

HOUR_S: Final = 3600.0
BUCKETS_PER_HOUR: Final = 360
"""The sliding hour is kept in 10 s buckets: it may count up to 10 s too much, never less."""
AUTH_LOG_EVERY_S: Final = 60.0
"""While a target keeps refusing the key, one summary line this often (not one a request)."""

EventFn = Callable[[Event], None]
"""A run event for the journal (``Journal.event``)."""


class GuardGauges(Protocol):
    """Where a guard reports (``soakd.metrics.guard.GuardMetrics`` for one target)."""

    def paused(self, reason: PauseReason, on: bool) -> None: ...
    def cap_hit(self, cap: SpendCap) -> None: ...
    def failing(self, cause: str, on: bool) -> None: ...


class TargetGuard:
    """When one target may be sent to. See the module docstring."""

    def __init__(
        self,
        target: str,
        spend: SpendGuard,
        rate: RateLimit,
        *,
        key_ref: str = "",
        failing: Failing | None = None,
        gauges: GuardGauges | None = None,
        on_event: EventFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.spend = spend
        self.rate = rate
        self.key_ref = key_ref  # "api_key_env NAME": where the key comes from, never the key
        self._gauges = gauges
        self._on_event = on_event
        self._clock = clock
        self.hour = SlidingCount(HOUR_S, BUCKETS_PER_HOUR)  # requests, tokens
        self.requests = 0  # sent, whole run
        self.tokens = 0  # prompt + output, whole run
        self._rate_until = 0.0  # honouring a Retry-After until this instant
        self._paused: dict[PauseReason, float] = {}  # reason -> since
        self._cap: SpendCap | None = None  # the spend cap holding the target now
        self._auth_failures = 0  # in the current streak
        self._auth_logged_at = -math.inf
        self._auth_total = 0
        self.failing = FailingWatch(failing or Failing())
        self._reason = PauseReason.RATE_LIMITED  # the reason of the pause delay_s() last found
        self._cause_shown = ""  # the failing cause exported now

    # --- the runner's side ------------------------------------------------------------------

    def delay_s(self) -> float:
        """0 when a request may go now; else how long to wait (``inf``: not in this run)."""
        now = self._clock()
        spend_at, cap = self._spend_free_at(now)
        self._set_paused(PauseReason.SPEND_CAP, spend_at > now, now, cap=cap, until=spend_at)
        rate_at = self._rate_until
        self._set_paused(PauseReason.RATE_LIMITED, rate_at > now, now, until=rate_at)
        waits = (
            (PauseReason.SPEND_CAP, spend_at - now),
            (PauseReason.FAILING, self.failing.delay_s(now)),
            (PauseReason.RATE_LIMITED, rate_at - now),
        )
        self._reason = next((reason for reason, w in waits if w > 0), PauseReason.RATE_LIMITED)
        return max(0.0, *(w for _, w in waits))

    def sent(self) -> None:
        now = self._clock()
        self.requests += 1
        self.hour.add(now, 1.0, 0.0)
        self.failing.sent(now)

    @property
    def pause_reason(self) -> MissReason:
        """The reason of the pause ``delay_s()`` found: a spend cap first (it lasts), then a
        failing target, then the rate limit."""
        return self._reason.missed

    @property
    def paused(self) -> tuple[PauseReason, ...]:
        return tuple(self._paused)

    def failing_now(self) -> FailingNow | None:
        """While paused as failing (None otherwise): its cause, the last failure's detail,
        and when the next probing request goes (for /status and the live view)."""
        w = self.failing
        next_s = w.next_probe_s(self._clock())
        if next_s is None:
            return None
        return FailingNow(w.cause, w.detail, round(next_s, 1))

    def used(self) -> dict[SpendCap, float]:
        """The spend counts the caps compare against (for the gauges: read when the run
        loop publishes; it changes nothing)."""
        requests, tokens = self.hour.peek(self._clock())
        return {
            SpendCap.REQUESTS_PER_HOUR: requests,
            SpendCap.TOKENS_PER_HOUR: tokens,
            SpendCap.REQUESTS: float(self.requests),
            SpendCap.TOKENS: float(self.tokens),
        }

    # --- OutcomeSink ------------------------------------------------------------------------

    def record(self, outcome: Finished) -> None:
        now = self._clock()
        tokens = (outcome.prompt_tokens or 0) + (outcome.output_tokens or 0)  # None: unknown
        if tokens:
            self.tokens += tokens
            self.hour.add(now, 0.0, tokens)
        error = outcome.error
        if error is ErrorKind.HTTP_AUTH:
            self._auth_failed(outcome, now)
        elif self._auth_failures and outcome.status and outcome.status < 400:
            log.info("auth_recovered", target=self.target, failures=self._auth_failures)
            self._auth_failures = 0
        if outcome.status == 429 or (
            outcome.status == 503
            and (outcome.retry_after_s is not None or outcome.retry_after_unreadable)
        ):
            self._rate_limited(outcome, now)
        change = self.failing.record(outcome, now)
        if change is not None:
            self._failing_changed(change)
        elif self.failing.paused and self.failing.cause != self._cause_shown:
            self._cause_shown = self.failing.cause  # a probe failed otherwise than before
            if self._gauges is not None:
                self._gauges.failing(self._cause_shown, True)

    # --- internals --------------------------------------------------------------------------

    def _spend_free_at(self, now: float) -> tuple[float, SpendCap | None]:
        s = self.spend
        if s.max_requests is not None and self.requests >= s.max_requests:
            return math.inf, SpendCap.REQUESTS
        if s.max_tokens is not None and self.tokens >= s.max_tokens:
            return math.inf, SpendCap.TOKENS
        at: float = now
        cap: SpendCap | None = None
        if s.max_requests_per_hour is not None:
            free = self.hour.below_at(now, s.max_requests_per_hour, 0)
            if free > at:
                at, cap = free, SpendCap.REQUESTS_PER_HOUR
        if s.max_tokens_per_hour is not None:
            free = self.hour.below_at(now, s.max_tokens_per_hour, 1)
            if free > at:
                at, cap = free, SpendCap.TOKENS_PER_HOUR
        return at, cap

    def _set_paused(
        self,
        reason: PauseReason,
        on: bool,
        now: float,
        *,
        cap: SpendCap | None = None,
        until: float = 0.0,
    ) -> None:
        since = self._paused.get(reason)
        if on and since is None:
            self._paused[reason] = now
            resume = None if math.isinf(until) else round(until - now, 3)
            event = TargetPaused(self.target, reason, resume)
            if reason is PauseReason.SPEND_CAP and cap is not None:
                self._cap = cap
                event = replace(event, cap=cap, limit=self.spend.limit(cap), used=self.used()[cap])
                if self._gauges is not None:
                    self._gauges.cap_hit(cap)
            log.warning(
                "target_paused",
                **event.to_data(),
                note="until the end of the run" if resume is None else None,
            )
            self._event(event)
            if self._gauges is not None:
                self._gauges.paused(reason, True)
        elif not on and since is not None:
            del self._paused[reason]
            log.info(
                "target_resumed", target=self.target, reason=reason, paused_s=round(now - since, 3)
            )
            self._event(TargetResumed(self.target, reason, round(now - since, 3)))
            if self._gauges is not None:
                self._gauges.paused(reason, False)

    def _rate_limited(self, outcome: Finished, now: float) -> None:
        r = self.rate
        if not r.honour_retry_after:
            return
        asked = outcome.retry_after_s  # None: none, or unreadable (soakd/targets/errors.py)
        pause = min(r.max_pause, r.default_pause if asked is None else asked)
        if pause > 0:
            self._rate_until = max(self._rate_until, now + pause)

    def _auth_failed(self, outcome: Finished, now: float) -> None:
        self._auth_failures += 1
        self._auth_total += 1
        if self._auth_failures == 1 or now - self._auth_logged_at >= AUTH_LOG_EVERY_S:
            self._auth_logged_at = now
            log.error(
                "auth_failed",
                target=self.target,
                status=outcome.status,
                detail=outcome.error_detail,
                key=self.key_ref or "no key configured",
                failures=self._auth_failures,
                hint="the endpoint refused the key: check that it is set and valid for "
                "this endpoint (the key itself is never logged)",
            )
            if self._auth_failures == 1:
                self._event(AuthFailed(self.target, outcome.status, self.key_ref or None))

    def _failing_changed(self, c: Change) -> None:
        """A failing target paused, or back: logged, journaled and exported like any pause,
        with its cause (the paused state itself lives in ``self.failing``)."""
        if c.paused:
            event = TargetPaused(
                self.target,
                PauseReason.FAILING,
                cause=c.cause,
                detail=c.detail,
                failures=c.failures,
                failing_for_s=round(c.seconds, 3),
            )
            log.error(
                "target_paused",
                **event.to_data(),
                key=(self.key_ref or "no key configured") if c.cause == "http_auth" else None,
                hint="every request failed in a way the next one cannot fix: one request "
                f"at a time now, at most {self.failing.max_pause:g} s apart, until one is "
                "answered",
            )
            self._event(event)
        else:
            log.info(
                "target_resumed",
                target=self.target,
                reason=PauseReason.FAILING,
                cause=c.cause,
                paused_s=round(c.seconds, 3),
            )
            self._event(TargetResumed(self.target, PauseReason.FAILING, round(c.seconds, 3)))
        self._cause_shown = c.cause
        if self._gauges is not None:
            self._gauges.paused(PauseReason.FAILING, c.paused)
            self._gauges.failing(c.cause, c.paused)

    def _event(self, event: Event) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception as exc:  # a journal problem must not stop the sends
            log.warning("guard_event_dropped", kind=event.kind, reason=type(exc).__name__)


class Guards:
    """Every target's guard; the runner's gates and one OutcomeSink for them all."""

    def __init__(self, guards: Iterable[TargetGuard]) -> None:
        self.by_target = {g.target: g for g in guards}

    def record(self, outcome: Finished) -> None:
        guard = self.by_target.get(outcome.target)
        if guard is not None:
            guard.record(outcome)
