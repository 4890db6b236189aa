"""Goodput: which requests count, against which SLO, and the tallies behind each verdict.

The definitions (docs/slo.md has them in full), in one place so that the report, the live
view, ``/status``, the summary and ``/metrics`` agree:

- *judged*: a request that ended as an outcome, less the ones soakd itself cut at the
  stop (``cancelled``) or lost with a sender process (``worker_lost``): those are no one's
  failure, and out of every denominator.
- *error ratio* (``slo.error_ratio``): every failed request (4xx and 429 refusals, 5xx,
  transport errors, timeouts, broken streams, invalid answers) over the judged requests,
  less the guard gateway's own refusals (``shed_*``: load it shed on purpose, reported
  apart). *server error ratio* (``slo.server_error_ratio``): the 5xx answers alone, over
  the same requests.
- *good*: judged, succeeded, and within every latency SLO set for its target (TTFT, TPOT
  and E2E, each judged on the request's own value; a value the request does not have, such
  as the TPOT of a one-token answer, is not held against it).
- *goodput*: good / judged (the guard's refusals included: they were not served either).

Whether a failure is the guard's own refusal is decided by ``guard_refusal`` alone: the
client classifies the gateway's refusals by their error ``code`` into the ``shed_*``
kinds, which the journal stores like any other kind.
"""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the journal's writer process imports this module, not the config
    from soakd.config import Slo
from soakd.model import NS_PER_S, SHED_KINDS, ErrorKind, Finished

Class = Literal["ok", "error", "guard", "excluded"]

NOT_JUDGED = frozenset(
    {
        ErrorKind.CANCELLED.value,
        ErrorKind.WORKER_LOST.value,
        ErrorKind.CONNECTION_CLOSED_UNANNOUNCED.value,
    }
)
"""Cut or lost by soakd itself (the drain deadline, a sender process that died), or lost
on a connection the server had closed after its last answer without saying so (it most
likely never read the request): out of every denominator."""

SERVER_ERRORS = frozenset({ErrorKind.HTTP_5XX.value})
"""The server's 5xx answers (the guard's own 503s are ``shed_*``): ``server_error_ratio``."""


def guard_refusal(error: str | None, origin: str | None = None) -> bool:
    """The guard gateway answered this itself (shed it): the ``shed_*`` kinds, which the
    client gives by the gateway's error ``code`` (soakd/targets/errors.py). ``origin`` is
    for a future journal column; the kind carries it today."""
    return error is not None and (origin == "gateway" or error in SHED_KINDS)


def classify(error: str | None, origin: str | None = None) -> Class:
    """``ok``; ``error`` (in the error ratio); ``guard`` (the guard's refusal: against
    goodput, out of the error ratio); ``excluded`` (not judged at all)."""
    if error is None:
        return "ok"
    if error in NOT_JUDGED:
        return "excluded"
    if guard_refusal(error, origin):
        return "guard"
    return "error"


@dataclass(frozen=True, slots=True)
class ErrorCounts:
    """One target's outcomes (over a run, a phase or a window) as the error ratios count
    them: ``judged`` = ok + ``failed``; ``shed`` and ``excluded`` are apart."""

    judged: int = 0  # the ratios' basis: requests less sheds and soakd's own cuts
    failed: int = 0  # every failure in it (4xx, 5xx, transport, timeouts, bad answers)
    server: int = 0  # of which 5xx answers
    shed: int = 0  # the guard gateway's own refusals
    excluded: int = 0  # cancelled at the stop, lost with a sender process

    @property
    def ok(self) -> int:
        return self.judged - self.failed

    @property
    def error_ratio(self) -> float | None:
        """Failed / judged (None: nothing judged)."""
        return self.failed / self.judged if self.judged else None

    @property
    def server_error_ratio(self) -> float | None:
        """5xx / judged (None: nothing judged)."""
        return self.server / self.judged if self.judged else None


def error_counts(requests: int, by_kind: Mapping[str, int]) -> ErrorCounts:
    """``requests`` outcomes, of which ``by_kind`` failed by error kind (the rest ok)."""
    failed = server = shed = excluded = 0
    for kind, n in by_kind.items():
        cls = classify(kind)
        if cls == "excluded":
            excluded += n
        elif cls == "guard":
            shed += n
        elif cls == "error":
            failed += n
            if kind in SERVER_ERRORS:
                server += n
    return ErrorCounts(requests - shed - excluded, failed, server, shed, excluded)


def _bound_ns(limit_s: float | None) -> int | None:
    return None if limit_s is None else round(limit_s * NS_PER_S)


def within(slo: Slo, ttft_ns: int | None, tpot_ns: int | None, e2e_ns: int | None) -> bool:
    """A successful request's latencies against the latency SLOs (unset: no bound)."""
    for value, limit in ((ttft_ns, slo.ttft_p99), (tpot_ns, slo.tpot_p99), (e2e_ns, slo.e2e_p99)):
        if value is not None and limit is not None and value > limit * NS_PER_S:
            return False
    return True


@dataclass(slots=True)
class Tally:
    """Counts of one target (over a run, a phase or a window) as goodput sees them: the
    journal's request rows, or the live window's outcomes (the error ratios are counted
    from the complete per-kind counts instead: ``error_counts``)."""

    sent: int = 0  # judged: sent and not cut by soakd
    ok: int = 0
    good: int = 0  # ok and within every latency SLO
    errors: int = 0  # failed (in the error ratio)
    guard: int = 0  # the guard gateway's own refusals
    excluded: int = 0  # not judged (NOT_JUDGED): cut or lost by soakd, or never read
    unsent: int = 0  # never left soakd

    def add(self, cls: Class, good: bool, n: int = 1, sent: bool = True) -> None:
        if not sent:
            self.unsent += n
            return
        if cls == "excluded":
            self.excluded += n
            return
        self.sent += n
        if cls == "ok":
            self.ok += n
            if good:
                self.good += n
        elif cls == "error":
            self.errors += n
        else:
            self.guard += n

    def merge(self, other: Tally) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def goodput(self) -> float | None:
        """Good / sent (None: nothing sent)."""
        return self.good / self.sent if self.sent else None


def tally_outcome(tally: Tally, o: Finished, slo: Slo) -> None:
    error = None if o.error is None else o.error.value
    cls = classify(error, getattr(o, "origin", None))
    good = cls == "ok" and within(slo, o.ttft_ns, o.tpot_ns, o.e2e_ns)
    tally.add(cls, good, sent=bool(o.sent_ns))


# --- from the journal ------------------------------------------------------------------------

_TALLY_SQL = """
SELECT phase, error, sent_ns IS NOT NULL,
       error IS NULL
       AND (? IS NULL OR ttft_ns IS NULL OR ttft_ns <= ?)
       AND (? IS NULL OR tpot_ns IS NULL OR tpot_ns <= ?)
       AND (? IS NULL OR e2e_ns IS NULL OR e2e_ns <= ?),
       COUNT(*)
FROM requests WHERE target = ? GROUP BY 1, 2, 3, 4
"""


def journal_tallies(
    conn: sqlite3.Connection, target: str, slo: Slo
) -> tuple[Tally, dict[str, Tally]]:
    """One target's tally over its journaled request rows: whole run, and per phase.
    One grouped query (SQLite does the per-row work; memory stays flat)."""
    bounds: list[int | None] = []
    for limit in (slo.ttft_p99, slo.tpot_p99, slo.e2e_p99):
        b = _bound_ns(limit)
        bounds += [b, b]
    overall = Tally()
    by_phase: dict[str, Tally] = {}
    for phase, error, sent, good, n in conn.execute(_TALLY_SQL, (*bounds, target)):
        cls = classify(error, None)
        overall.add(cls, bool(good), n, bool(sent))
        by_phase.setdefault(phase, Tally()).add(cls, bool(good), n, bool(sent))
    return overall, by_phase


# --- live, over a window ----------------------------------------------------------------------


@dataclass(slots=True)
class _Slot:
    second: int
    tally: Tally = field(default_factory=Tally)


class GoodputWindow:
    """An OutcomeSink: per target, goodput over the last ``span_s`` seconds (a ring of
    one-second tallies: bounded memory whatever the rate) and over the whole session."""

    def __init__(self, slos: dict[str, Slo], span_s: int = 60) -> None:
        self.slos = slos
        self.span_s = span_s
        self.total = {t: Tally() for t in slos}
        self._ring: dict[str, deque[_Slot]] = {t: deque() for t in slos}

    def record(self, outcome: Finished) -> None:
        slo = self.slos.get(outcome.target)
        if slo is None:
            return
        tally_outcome(self.total[outcome.target], outcome, slo)
        now = int(time.monotonic())
        ring = self._ring[outcome.target]
        if not ring or ring[-1].second != now:
            ring.append(_Slot(now))
            self._trim(ring, now)
        tally_outcome(ring[-1].tally, outcome, slo)

    def _trim(self, ring: deque[_Slot], now: int) -> None:
        while ring and ring[0].second <= now - self.span_s:
            ring.popleft()

    def recent(self, target: str) -> tuple[Tally, float]:
        """The window's tally and the seconds it covers (at least 1)."""
        now = int(time.monotonic())
        # read on the run loop only (its publish: the gauges and /status' rows)
        slots = [slot for slot in self._ring[target] if slot.second > now - self.span_s]
        merged = Tally()
        for slot in slots:
            merged.merge(slot.tally)
        covered = (now - slots[0].second + 1) if slots else 0
        return merged, float(max(1, min(covered, self.span_s)))

    def row(self, target: str) -> dict[str, float | None]:
        """What the live view and /status add to a target's row."""
        tally, seconds = self.recent(target)
        return {"goodput": tally.goodput, "goodput_rps": tally.good / seconds}


def merged(tallies: Iterable[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        out.merge(t)
    return out


__all__ = [
    "ErrorCounts",
    "GoodputWindow",
    "Tally",
    "classify",
    "error_counts",
    "guard_refusal",
    "journal_tallies",
    "within",
]
