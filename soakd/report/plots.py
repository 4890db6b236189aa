"""Report room, plots: the time series the HTML report draws, binned over plan time."""

from __future__ import annotations

import math
from collections.abc import Callable

from soakd.analysis import HOUR_S, TargetStats
from soakd.journal import Rollup
from soakd.report import names
from soakd.report.model import GpuRow, LatencyKind, Series
from soakd.report.samples import Samples

PLOT_POINTS = 200
GIB = 2**30


def plots(
    rollups: list[Rollup], targets: list[str], window_s: float, probe: Samples, gpus: list[GpuRow]
) -> dict[str, list[Series]]:
    """Binned time series over plan time (hours): at most PLOT_POINTS per line."""
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
            return [((i + 0.5) * bin_s / HOUR_S, get(bins[i])) for i in xs]

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
        out["errors"].append(
            Series(f"{target} errors/min", line(lambda s: (s.requests - s.ok) / bin_s * 60), target)
        )
        for _, pts in probe.find(names.GPU_PROCESS_MEMORY, {"target": target}):
            out["vram"].append(Series(f"{target} process", _binned(pts, bin_s, 1 / GIB), target))
    for g in gpus:
        for _, pts in probe.find(names.GPU_MEMORY_USED, {"gpu": g.gpu}):
            out["vram"].append(
                Series(f"GPU {g.gpu} used", _binned(pts, bin_s, 1 / GIB), "", dashed=True)
            )
    return {k: v for k, v in out.items() if v}


def _binned(
    points: list[tuple[float, float]], bin_s: float, scale: float
) -> list[tuple[float, float | None]]:
    bins: dict[int, float] = {}
    for t, v in points:
        i = int(t // bin_s)
        bins[i] = max(bins.get(i, v), v)
    return [((i + 0.5) * bin_s / HOUR_S, v * scale) for i, v in sorted(bins.items())]
