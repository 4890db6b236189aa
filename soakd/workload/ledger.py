"""Workload, send ledger: the sends the plan offered and soakd did not make, and why.

A soak is overloaded on purpose. An open-loop driver never spawns without bound: a
send whose instant is already later than the load's ``max_lateness``, one that finds
the in-flight cap full, and one that falls while the target is paused (Retry-After,
a spend cap, a target failing every request) is not made. Each is counted here, per
target, phase and reason, like k6's ``dropped_iterations``: offered = sent + missed, and
nothing is hidden.

The counts are small (targets x phases x reasons) and only the loop reads them: the
journal in the plan clock's snapshot the loop publishes (``Journal.publish``, every
0.1 s and at the close), the live view and the summary at their tick; the exporter's
counter hears each increment (``on_miss``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from soakd.model import MissReason

Key = tuple[str, str, str]
"""(target, phase, reason): the reason a ``MissReason`` (a journal's are read back as strings)."""

MissFn = Callable[[str, str, MissReason, int], None]


class SendLedger:
    """Missed sends, whole run: ``base`` (earlier sessions, from the journal) plus this
    session's. ``on_miss`` (the exporter's counter) hears each increment."""

    def __init__(self, base: Mapping[Key, int] | None = None, on_miss: MissFn | None = None):
        self.counts: dict[Key, int] = dict(base or {})  # whole run
        self.session: dict[Key, int] = {}  # this session only
        self._on_miss = on_miss

    def miss(self, target: str, phase: str, reason: MissReason, n: int = 1) -> None:
        key = (target, phase, reason)
        self.counts[key] = self.counts.get(key, 0) + n
        self.session[key] = self.session.get(key, 0) + n
        if self._on_miss is not None:
            self._on_miss(target, phase, reason, n)

    def by_target(self, *, session: bool = False) -> dict[str, dict[str, int]]:
        """{target: {reason: count}} over every phase (the whole run, or this session)."""
        out: dict[str, dict[str, int]] = {}
        for (target, _, reason), n in list((self.session if session else self.counts).items()):
            per = out.setdefault(target, {})
            per[reason] = per.get(reason, 0) + n
        return out

    def total(self, target: str) -> int:
        return sum(n for (t, _, _), n in list(self.counts.items()) if t == target)
