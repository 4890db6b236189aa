"""Report room, plots: the time series the HTML report draws, binned over plan time, and
what frames them: the phase boundaries and the SLO lines. Nothing past the plan time the
run reached is drawn (the drain's last answers and late probe readings are not the plan)."""

from __future__ import annotations

import math
from collections.abc import Callable

from soakd.config import Slo
from soakd.journal import Rollup
from soakd.measure.analysis import HOUR_S, TargetStats
from soakd.measure.goodput import ErrorCounts, error_counts
from soakd.model import ErrorKind
from soakd.report import names
from soakd.report.model import GpuRow, LatencyKind, Series
from soakd.report.samples import Samples

PLOT_POINTS = 200
SHED_KINDS = frozenset(k.value for k in ErrorKind if k.shed)
GB = 1e9  # the reports' one byte unit (table.BYTE_UNITS)


def plots(
    rollups: list[Rollup],
    targets: list[str],
    window_s: float,
    probe: Samples,
    gpus: list[GpuRow],
    end_s: float,
) -> dict[str, list[Series]]:
    """Binned time series over plan time (hours): at most PLOT_POINTS per line, none past
    ``end_s`` (the plan time the run reached)."""
    rollups = [r for r in rollups if r.window * window_s < end_s]
    if not rollups:
        return {}
    top = max(r.window for r in rollups) + 1
    per_bin = max(1, math.ceil(top / PLOT_POINTS))
    bin_s = per_bin * window_s
    out: dict[str, list[Series]] = {
        k: [] for k in ("latency", "ttft", "throughput", "errors", "vram")
    }
    for target in targets:
        bins: dict[int, TargetStats] = {}
        for r in rollups:
            if r.target == target:
                b = bins.get(r.window // per_bin)
                if b is None:
                    b = bins[r.window // per_bin] = TargetStats()
                b.merge(r.stats)
        xs = sorted(bins)

        def line(
            get: Callable[[TargetStats], float | None],
            xs: list[int] = xs,
            bins: dict[int, TargetStats] = bins,
        ) -> list[tuple[float, float | None]]:
            # a bin's middle, or the plan's end for a last bin cut by it
            return [(min(i + 0.5, end_s / bin_s) * bin_s / HOUR_S, get(bins[i])) for i in xs]

        def q(kind: LatencyKind, x: float) -> Callable[[TargetStats], float | None]:
            def get(s: TargetStats) -> float | None:
                v = getattr(s, kind).quantile(x)
                return None if v is None else v / 1e6

            return get

        out["latency"] += [
            Series(f"{target} E2E p50", line(q("e2e", 0.5)), target, dashed=True),
            Series(f"{target} E2E p99", line(q("e2e", 0.99)), target),
        ]
        out["ttft"] += [
            Series(f"{target} TTFT p99", line(q("ttft", 0.99)), target),
            Series(f"{target} ITL p99", line(q("itl", 0.99)), target, dashed=True),
        ]
        out["throughput"].append(
            Series(f"{target} output tok/s", line(lambda s: s.output_tokens / bin_s), target)
        )

        def per_min(get: Callable[[ErrorCounts], int]) -> Callable[[TargetStats], float]:
            return lambda s: get(error_counts(s.requests, s.errors)) / bin_s * 60

        out["errors"].append(
            Series(f"{target} errors/min", line(per_min(lambda c: c.failed)), target)
        )
        if any(r.target == target and r.stats.errors.keys() & SHED_KINDS for r in rollups):
            # the guard's sheds: apart, as in the tables
            shed = line(per_min(lambda c: c.shed))
            out["errors"].append(Series(f"{target} shed/min", shed, target, dashed=True))
        for _, pts in probe.find(names.GPU_PROCESS_MEMORY, {"target": target}):
            out["vram"].append(
                Series(f"{target} process", _binned(pts, bin_s, 1 / GB, end_s), target)
            )
    for g in gpus:
        for _, pts in probe.find(names.GPU_MEMORY_USED, {"gpu": g.gpu}):
            out["vram"].append(
                Series(f"GPU {g.gpu} used", _binned(pts, bin_s, 1 / GB, end_s), "", dashed=True)
            )
    return {k: v for k, v in out.items() if v}


def _binned(
    points: list[tuple[float, float]], bin_s: float, scale: float, end_s: float
) -> list[tuple[float, float | None]]:
    bins: dict[int, float] = {}
    for t, v in points:
        if t >= end_s:
            continue
        i = int(t // bin_s)
        bins[i] = max(bins.get(i, v), v)
    return [
        (min(i + 0.5, end_s / bin_s) * bin_s / HOUR_S, v * scale) for i, v in sorted(bins.items())
    ]


_SLO_LINES = (
    ("latency", "e2e_p99", 1000.0),
    ("ttft", "ttft_p99", 1000.0),
    ("vram", "vram_peak", 1 / GB),
)
"""plot -> the SLO key drawn on it, and the factor to the plot's unit (ms, GB)."""


def slo_lines(slos: dict[str, Slo], targets: list[str]) -> dict[str, list[tuple[str, float]]]:
    """Per plot, its SLO lines (label, value in the plot's unit): one when every target has
    the same limit, one per target otherwise."""
    out: dict[str, list[tuple[str, float]]] = {}
    for plot, key, factor in _SLO_LINES:
        limits = {t: v for t in targets if (v := getattr(slos[t], key)) is not None}
        if len(set(limits.values())) == 1 and len(limits) == len(targets):
            out[plot] = [(f"SLO {key}", next(iter(limits.values())) * factor)]
        elif limits:
            out[plot] = [(f"SLO {key} {t}", v * factor) for t, v in limits.items()]
    return out
