"""Metrics room, the spend guard's families (caps, pauses, Retry-After: soakd/workload/guard.py).
Beside ``soakd/metrics/run.py``, which re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from soakd.metrics import names as mn
from soakd.model import FAILING_CAUSES, PauseReason, SpendCap


class GuardMetrics:
    """Send guards (soakd/workload/guard.py): pauses and spend caps (the open-loop sends not
    made while paused are ``soakd_sends_missed_total``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        target_reason = ["target", "reason"]
        self.paused = Gauge(
            mn.TARGET_PAUSED,
            "1 while the target's sends are paused, by reason.",
            target_reason,
            registry=r,
        )
        self.pauses = Counter(
            mn.TARGET_PAUSES_TOTAL,
            "Times the target's sends were paused, by reason.",
            target_reason,
            registry=r,
        )
        self.failing = Gauge(
            mn.TARGET_FAILING,
            "1 while the target is paused because every request failed in a way the next "
            "one cannot fix, by cause (the last failure's kind).",
            ["target", "cause"],
            registry=r,
        )
        self.cap_hits = Counter(
            mn.SPEND_CAP_HITS_TOTAL,
            "Times a spend cap paused the target.",
            ["target", "cap"],
            registry=r,
        )
        self.used = Gauge(
            mn.SPEND_USED,
            "What the spend caps compare against: requests or tokens in "
            "the last hour, or in the whole run.",
            ["target", "cap"],
            registry=r,
        )
        self.limit = Gauge(
            mn.SPEND_LIMIT,
            "Configured spend caps (absent when not set).",
            ["target", "cap"],
            registry=r,
        )
        # (target, cap, its soakd_spend_used child) of the caps set
        self._capped: list[tuple[str, SpendCap, Gauge]] = []

    def add_target(self, target: str, limits: Mapping[SpendCap, int | None]) -> TargetGuardGauges:
        """Series of one target, zero from the start (``soakd_spend_used`` of the caps set:
        ``show_used``)."""
        for reason in PauseReason:
            self.paused.labels(target, reason).set(0)
            self.pauses.labels(target, reason)
        for cause in FAILING_CAUSES:
            self.failing.labels(target, cause).set(0)
        for cap in SpendCap:
            limit = limits.get(cap)
            if limit is None:
                continue
            self.limit.labels(target, cap).set(limit)
            self.cap_hits.labels(target, cap)
            self._capped.append((target, cap, self.used.labels(target, cap)))
        return TargetGuardGauges(self, target)

    def show_used(self, used: Mapping[str, Mapping[SpendCap, float]]) -> None:
        """What each target's spend caps compare against now (``TargetGuard.used``), set
        by the run loop when it publishes (soakd/run/app.py), for the caps set."""
        for target, cap, gauge in self._capped:
            now = used.get(target)
            if now is not None:
                gauge.set(now.get(cap, 0.0))


@dataclass(slots=True)
class TargetGuardGauges:
    """One target's guard series (the ``GuardGauges`` a TargetGuard reports to)."""

    m: GuardMetrics
    target: str

    def paused(self, reason: PauseReason, on: bool) -> None:
        self.m.paused.labels(self.target, reason).set(1 if on else 0)
        if on:
            self.m.pauses.labels(self.target, reason).inc()

    def cap_hit(self, cap: SpendCap) -> None:
        self.m.cap_hits.labels(self.target, cap).inc()

    def failing(self, cause: str, on: bool) -> None:
        """``cause`` at 1 while on, every other cause at 0 (one cause at a time)."""
        for c in FAILING_CAUSES:
            self.m.failing.labels(self.target, c).set(1 if on and c == cause else 0)
