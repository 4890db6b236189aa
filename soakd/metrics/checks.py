"""Metrics room, the checks' families: answers judged (soakd/checks/mix.py) and what each
target says it is (soakd/checks/identity.py). Counted when judged, not when journaled."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from soakd.metrics import names as mn


class CheckMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.checks = Counter(
            mn.CHECKS_TOTAL,
            "Checks judged (docs/checks.md), by target, check kind and result "
            "(pass, fail, unparseable); a check whose request failed is not judged.",
            ["target", "check", "result"],
            registry=registry,
        )
        self.identity = Gauge(
            mn.TARGET_IDENTITY_INFO,
            "1 for what the target's answers say it is now: their model and "
            "system_fingerprint (an empty label: the answers carry none).",
            ["target", "model", "fingerprint"],
            registry=registry,
        )
        self.identity_changes = Counter(
            mn.TARGET_IDENTITY_CHANGES_TOTAL,
            "Times the target's answers changed model or system_fingerprint during the run.",
            ["target"],
            registry=registry,
        )
        self._shown: dict[str, tuple[str, str]] = {}

    def start(self, targets: Iterable[str], checks: Iterable[str], results: Iterable[str]) -> None:
        """Every (target, check, result) at 0 from the start (a rate over a series that
        appears late misses its first increase)."""
        kinds, outcomes = list(checks), list(results)
        for t in targets:
            self.identity_changes.labels(t)
            for c in kinds:
                for r in outcomes:
                    self.checks.labels(t, c, r)

    def judged(self, target: str, check: str, result: str) -> None:
        self.checks.labels(target, check, result).inc()

    def identified(self, target: str, model: str, fingerprint: str, changed: bool) -> None:
        """The target's identity now: its info series set to 1, the one before removed."""
        before = self._shown.get(target)
        if before is not None:
            self.identity.remove(target, *before)
        self._shown[target] = (model, fingerprint)
        self.identity.labels(target, model, fingerprint).set(1)
        if changed:
            self.identity_changes.labels(target).inc()
