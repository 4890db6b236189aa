"""Verdicts: a run's numbers against its SLO and its baseline, pass or fail. Pure: no IO.

Per target and per criterion (the ``slo`` keys): what was measured, the limit, pass or
fail; a target passes when no criterion fails and at least one was measured. A target
that was sent requests and answered none of them fails (``successes``), SLO or not. The
same per phase. ``compare`` judges a candidate target against a baseline by the
regressions it allows. ``soakd report --check`` exits on ``overall`` (docs/slo.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from soakd.config import Compare, LimitKind, Slo
from soakd.measure.analysis import Quantiles, quantile_of
from soakd.measure.goodput import Tally

MS_PER_S = 1000.0
MAJORITY = 0.5
"""A target whose success rate is at or below this is never marked best (it shed or
failed most of its requests: its few successes say little about its latency)."""


class RowLike(Protocol):
    """What verdicts read of a report row (soakd.report.Row)."""

    requests: int
    ok: int
    not_judged: int  # cut by soakd at the stop or lost with a sender process
    success_rate: float | None
    error_ratio: float | None  # every failure / judged requests (soakd/measure/goodput.py)
    server_error_ratio: float | None  # 5xx / judged requests
    latency_ms: dict[str, Quantiles]  # "ttft", "itl", "tpot", "e2e"
    jitter: float | None
    oom_events: int | None
    oom_responses: int
    vram_peak_bytes: float | None
    output_tps: float | None
    rps: float | None
    active_s: float
    correct_ratio: float | None  # checks passed / judged (docs/checks.md); None: no checks


@dataclass
class Criterion:
    """One SLO key judged: ``passed`` None when it could not be measured (``note`` says why)."""

    name: str
    limit: float
    measured: float | None
    unit: str  # "s", "ratio", "count", "bytes"; "min_count", "min_ratio": floors, not ceilings
    passed: bool | None
    note: str = ""


@dataclass
class Verdict:
    target: str
    phase: str | None
    criteria: list[Criterion]
    passed: bool | None  # None: nothing judged (no SLO, or nothing measurable)
    goodput: float | None = None
    goodput_rps: float | None = None
    error_ratio: float | None = None
    sent: int = 0
    server_error_ratio: float | None = None

    @property
    def failed(self) -> list[Criterion]:
        return [c for c in self.criteria if c.passed is False]


def _all(results: Iterable[bool | None]) -> bool | None:
    """False when any is False; True when some are True and none False; else None."""
    seen = [r for r in results if r is not None]
    if not seen:
        return None
    return all(seen)


def _at_most(key: str, limit: float, value: float | None, unit: str, absent: str) -> Criterion:
    """A criterion met when the measured value is at most the limit; not judged (with why)
    when there is no value."""
    if value is None:
        return Criterion(key, limit, None, unit, None, absent)
    return Criterion(key, limit, value, unit, value <= limit)


_LATENCY = (("ttft_p99", "ttft"), ("tpot_p99", "tpot"), ("e2e_p99", "e2e"))


def judge(target: str, phase: str | None, slo: Slo, row: RowLike, tally: Tally) -> Verdict:
    """One target (over the run or one phase) against its SLO."""
    out: list[Criterion] = []
    attempted = row.requests - row.not_judged
    dead = attempted > 0 and row.ok == 0
    if dead:  # fails whatever its SLO says (or when it has none)
        out.append(Criterion("successes", 1, 0.0, "min_count", False, "no request succeeded"))
    for key, kind in _LATENCY:
        limit = getattr(slo, key)
        if limit is None:
            continue
        ms = row.latency_ms.get(kind, {}).get("p99")
        if ms is not None:
            value = ms / MS_PER_S
            out.append(Criterion(key, limit, value, "s", value <= limit))
        elif dead:
            out.append(Criterion(key, limit, None, "s", False, "no successful request"))
        else:
            why = "no request" if not attempted else "no value (e.g. one-token answers)"
            out.append(Criterion(key, limit, None, "s", None, why))
    for key in ("error_ratio", "server_error_ratio"):
        limit = getattr(slo, key)
        if limit is not None:
            value = getattr(row, key)
            out.append(_at_most(key, limit, value, "ratio", "no request judged"))
    if slo.correct_ratio is not None:  # a floor: the share of checks answered right
        right = row.correct_ratio
        met = None if right is None else right >= slo.correct_ratio
        why = "" if right is not None else "no check judged"
        out.append(Criterion("correct_ratio", slo.correct_ratio, right, "min_ratio", met, why))
    if slo.jitter is not None:
        out.append(
            _at_most(
                "jitter", slo.jitter, row.jitter, "ratio", "too few slices with enough requests"
            )
        )
    if slo.oom_events is not None:
        if row.oom_events is None and not attempted:  # no probe, no request: no evidence
            out.append(
                Criterion(
                    "oom_events",
                    slo.oom_events,
                    None,
                    "count",
                    None,
                    "no request and no probe readings",
                )
            )
        else:
            events = max(row.oom_events or 0, row.oom_responses)
            out.append(
                Criterion(
                    "oom_events", slo.oom_events, float(events), "count", events <= slo.oom_events
                )
            )
    if slo.vram_peak is not None:
        out.append(
            _at_most(
                "vram_peak", slo.vram_peak, row.vram_peak_bytes, "bytes", "no GPU memory readings"
            )
        )
    return Verdict(
        target,
        phase,
        out,
        _all(c.passed for c in out),
        goodput=tally.goodput,
        goodput_rps=tally.good / row.active_s if row.active_s > 0 else None,
        error_ratio=row.error_ratio,
        sent=tally.sent,
        server_error_ratio=row.server_error_ratio,
    )


def eligible_for_best(row: RowLike, verdict: Verdict | None) -> bool:
    """May this target be marked best on latency (and every other non-error row)? Not
    when it failed the error criterion, nor when it shed or failed most of its requests."""
    if row.success_rate is None or row.success_rate <= MAJORITY:
        return False
    if verdict is None:
        return True
    return not any(c.name == "error_ratio" and c.passed is False for c in verdict.criteria)


# --- baseline against candidate --------------------------------------------------------------

HIGHER_IS_WORSE = frozenset(
    {"ttft_p99", "tpot_p99", "e2e_p99", "ttft_p50", "e2e_p50", "error_ratio", "server_error_ratio"}
)


@dataclass
class Delta:
    """One compared metric: the candidate's regression against the limit allowed."""

    key: str
    baseline: float | None
    candidate: float | None
    delta: float | None  # candidate - baseline
    relative: float | None  # delta / baseline
    limit_kind: LimitKind
    limit: float
    regression: float | None  # in the limit's terms (relative or absolute), > 0: worse
    passed: bool | None
    note: str = ""


@dataclass
class CompareVerdict:
    baseline: str
    candidate: str
    deltas: list[Delta] = field(default_factory=list)
    passed: bool | None = None


def compared_value(key: str, row: RowLike, verdict: Verdict) -> float | None:
    """A compare key's value: latencies in seconds, ratios, rates per second."""
    if key in ("error_ratio", "server_error_ratio", "goodput", "goodput_rps"):
        value: float | None = getattr(verdict, key)
        return value
    if key in ("output_tps", "rps"):
        rate: float | None = getattr(row, key)
        return rate
    kind, q = key.split("_")
    ms = quantile_of(row.latency_ms.get(kind, Quantiles()), q)
    return None if ms is None else ms / MS_PER_S


def compare(
    spec: Compare, rows: Mapping[str, RowLike], verdicts: Mapping[str, Verdict]
) -> CompareVerdict:
    out = CompareVerdict(spec.baseline, spec.candidate)
    for key, (kind, limit) in spec.max_regression.items():
        base = compared_value(key, rows[spec.baseline], verdicts[spec.baseline])
        cand = compared_value(key, rows[spec.candidate], verdicts[spec.candidate])
        if cand is None or base is None:
            # a candidate with no value where the baseline has one (no success at all) fails
            missing = cand is None and base is not None
            out.deltas.append(
                Delta(
                    key,
                    base,
                    cand,
                    None,
                    None,
                    kind,
                    limit,
                    None,
                    False if missing else None,
                    "no value for the candidate" if missing else "no value",
                )
            )
            continue
        delta = cand - base
        worse = delta if key in HIGHER_IS_WORSE else -delta
        if base:
            relative: float | None = delta / abs(base)
            rel_worse = worse / abs(base)
        else:
            relative = None
            rel_worse = math.inf if worse > 0 else 0.0
        regression = rel_worse if kind == "relative" else worse
        out.deltas.append(
            Delta(key, base, cand, delta, relative, kind, limit, regression, regression <= limit)
        )
    out.passed = _all(d.passed for d in out.deltas)
    return out


def describe_slo(slo: Slo) -> str:
    """``ttft_p99 2s, error_ratio 0.3 %, vram_peak 3.9 GB`` (``soakd check``)."""
    parts = []
    for key, value in slo.model_dump(exclude_none=True).items():
        if key.endswith("_p99"):
            text = f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"
        elif key in ("error_ratio", "server_error_ratio", "jitter"):
            text = f"{value * 100:g} %"
        elif key == "correct_ratio":
            text = f"at least {value * 100:g} %"
        elif key == "vram_peak":
            text = f"{value / 1e9:g} GB"
        else:
            text = f"{value:g}"
        parts.append(f"{key} {text}")
    return ", ".join(parts) or "none"


def overall(verdicts: Iterable[Verdict], comparison: CompareVerdict | None) -> bool | None:
    """The run: fails when any target or the comparison fails."""
    results = [v.passed for v in verdicts]
    if comparison is not None:
        results.append(comparison.passed)
    return _all(results)


__all__ = [
    "CompareVerdict",
    "Criterion",
    "Delta",
    "Verdict",
    "compare",
    "eligible_for_best",
    "judge",
    "overall",
]
