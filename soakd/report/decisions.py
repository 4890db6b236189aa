"""Report room, decisions: what the run is judged by, the verdicts, the best target, the
notes that qualify the figures.

The deciding sections of the stored config (``slo``, ``compare``, each target's ``slo`` and
``cost``) are read here by the config's own strict models: a section that cannot be read
is said in a note ("no verdicts", "not costed"), never judged by half. ``soakd report
--config`` replaces them (``decisions_from``). Every function returns values; none
writes into a row (rows.py puts a row's goodput in with ``with_goodput``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pydantic import Field, ValidationError

from soakd.config import Compare, Slo, TargetCost
from soakd.config.slo import client_limited, lag_limit_s, lagged
from soakd.journal.stored import JsonObject, Lenient, StoredConfig, StoredReport
from soakd.measure.analysis import LATENCY_TIE, best_of, fmt_ms
from soakd.measure.goodput import Tally
from soakd.measure.verdicts import Verdict, judge
from soakd.model import MissReason
from soakd.report.model import METRIC_COLUMNS, NOT_RANKED, Row, value_of
from soakd.report.rows import Rows

# --- what decides -----------------------------------------------------------------------------


class _JudgedTarget(Lenient):
    name: str
    slo: JsonObject | None = None
    cost: JsonObject | None = None


class _Decisions(Lenient):
    """``soakd report --config``'s document (``Decisions`` as JSON, or a whole config):
    a section it lacks decides nothing, as in ``Decisions``; its report section is the
    defaults then."""

    slo: JsonObject | None = None
    compare: JsonObject | None = None
    report: StoredReport = StoredReport()
    targets: list[_JudgedTarget] = Field(default_factory=list)


def decisions_from(stored: StoredConfig, other: Mapping[str, object]) -> StoredConfig:
    """The run's config with what decides (slo, compare, costs, report) taken from
    ``other``; targets are matched by name, targets ``other`` lacks keep none of it."""
    decided = _Decisions.model_validate(other)
    theirs = {t.name: t for t in decided.targets}
    return stored.model_copy(
        update={
            "slo": decided.slo,
            "compare": decided.compare,
            "report": decided.report,
            "targets": [
                t.model_copy(
                    update={
                        "slo": theirs[t.name].slo if t.name in theirs else None,
                        "cost": theirs[t.name].cost if t.name in theirs else None,
                    }
                )
                for t in stored.targets
            ],
        }
    )


@dataclass(frozen=True)
class Judging:
    """What the run is judged by: each target's SLO (overrides applied), the comparison,
    and the note when they could not be read."""

    slos: dict[str, Slo]
    spec: Compare | None
    note: str | None


def judging(config: StoredConfig, targets: list[str]) -> Judging:
    """The stored config's slo (per target, overrides applied) and compare sections."""
    try:
        base = Slo.model_validate(config.slo or {})
        slos = {}
        for t in targets:
            mine = config.target(t)
            slos[t] = Slo.model_validate((mine.slo if mine else None) or {}).over(base)
        spec = Compare.model_validate(config.compare) if config.compare else None
    except ValidationError as exc:
        return Judging(
            {t: Slo() for t in targets},
            None,
            f"the run's slo/compare config could not be read ({exc.error_count()} error(s)): "
            "no verdicts",
        )
    if spec is not None and not {spec.baseline, spec.candidate} <= set(targets):
        return Judging(slos, None, "compare names a target the run does not have: no comparison")
    return Judging(slos, spec, None)


def costs(config: StoredConfig) -> tuple[dict[str, TargetCost], list[str]]:
    """Each target's cost section, and a note per one that cannot be read (not costed)."""
    out: dict[str, TargetCost] = {}
    notes = []
    for t in config.targets:
        try:
            out[t.name] = TargetCost.model_validate(t.cost or {})
        except ValidationError:
            out[t.name] = TargetCost()
            notes.append(f"targets[{t.name}].cost could not be read: not costed")
    return out, notes


# --- verdicts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdicts:
    whole: dict[str, Verdict]  # by target
    phases: dict[str, dict[str, Verdict]]  # by phase, then target

    def of(self, row: Row) -> Verdict:
        return self.whole[row.target] if row.phase is None else self.phases[row.phase][row.target]


def verdicts(
    rows: Rows,
    targets: list[str],
    slos: Mapping[str, Slo],
    tallies: Mapping[str, tuple[Tally, dict[str, Tally]]],
) -> Verdicts:
    """Each target judged over the run and per phase (goodput from the tallies, the
    error ratios and the rest from the rows)."""
    whole: dict[str, Verdict] = {}
    phases: dict[str, dict[str, Verdict]] = {p: {} for p in rows.by_phase}
    for t in targets:
        run, per_phase = tallies[t]
        for row in rows.of(t):
            tally = run if row.phase is None else per_phase.get(row.phase, Tally())
            v = judge(t, row.phase, slos[t], row, tally)
            if row.phase is None:
                whole[t] = v
            else:
                phases[row.phase][t] = v
    return Verdicts(whole, phases)


def with_goodput(row: Row, verdict: Verdict) -> Row:
    """The row with its goodput (its verdict's)."""
    return replace(row, goodput=verdict.goodput, goodput_rps=verdict.goodput_rps)


def best(
    overall: dict[str, Row], targets: list[str], eligible: set[str] | None = None
) -> dict[str, list[str]]:
    """Per metric, the target(s) with the better value, when there is a contest. Outside
    NOT_RANKED only ``eligible`` targets compete (a target that failed most requests is
    never best on latency); latencies within ``LATENCY_TIE`` of each other are a tie."""
    out: dict[str, list[str]] = {}
    for key, _, better in METRIC_COLUMNS:
        if better is None:
            continue
        pool = (
            targets
            if eligible is None or key in NOT_RANKED
            else [t for t in targets if t in eligible]
        )
        values = {t: v for t in pool if (v := value_of(overall[t], key)) is not None}
        winners = best_of(values, better, LATENCY_TIE if "." in key else 0.0)
        if winners:
            out[key] = winners
    return out


# --- what qualifies the figures ---------------------------------------------------------------


def client_limits(overall: dict[str, Row], targets: list[str], config: StoredConfig) -> list[str]:
    """Say so when soakd itself was the bottleneck (``slo.client_limited``): its dispatch
    lag past the limit, or planned sends it could not make in time. Those latency figures
    are the client's."""
    dispatch_lag = config.alert_limits.dispatch_lag
    limit_s = lag_limit_s(dispatch_lag)
    notes = []
    for t in targets:
        row = overall[t]
        late = row.missed_by_reason.get(MissReason.LATE, 0)
        if client_limited(row.lag_p99_ms, late, dispatch_lag):
            why = []
            if lagged(row.lag_p99_ms, dispatch_lag):
                lag = fmt_ms(row.lag_p99_ms or 0)
                why.append(f"dispatch lag p99 {lag} (limit {fmt_ms(limit_s * 1e3)})")
            if late:
                why.append(f"{late:,} planned sends too late to make")
            notes.append(
                f"CLIENT-LIMITED: soakd could not keep up with {t}'s schedule "
                f"({'; '.join(why)}): its latency and rate figures measure soakd as much as "
                "the target (give soakd more CPU, or lower the load)"
            )
    for t in targets:
        capped = overall[t].missed_by_reason.get(MissReason.IN_FLIGHT_CAP)
        if capped:
            notes.append(
                f"{t}: {capped:,} planned sends found "
                "max_in_flight requests already out and were not made (the target could "
                "not keep up with the offered rate)"
            )
    return notes
