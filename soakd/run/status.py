"""What ``/status``, the live view and the progress log show beside the outcome stats
(soakd/run/stats.py): each GPU's VRAM against its line and whose it is, and the one-line
progress fields. Pure: the run (soakd/run/app.py) hands in what it holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from soakd.config import Config
from soakd.probes.gpu import GpuProbe


def gpu_owner(cfg: Config, names: Sequence[str]) -> str | None:
    """The target the GPU readings belong to, as the report attributes them: the only
    target, or the simulator whose own DCGM page is read."""
    if len(names) == 1:
        return names[0]
    if cfg.gpu.source == "dcgm" and cfg.gpu.dcgm_url is None:
        return next((t.name for t in cfg.targets if t.simulator), None)
    return None


def vram_status(gpu: GpuProbe | None, cfg: Config, names: Sequence[str]) -> list[dict[str, Any]]:
    """Each GPU now: used, peak, the VRAM line and whose it is."""
    if gpu is None or not gpu.peak:
        return []
    owner = gpu_owner(cfg, names)
    limit = cfg.slo_for(owner).vram_peak if owner else cfg.slo.vram_peak
    # used: the probe's own last reading; the registry's get_sample_value would collect
    # every metric family on the run loop, each second (~ms)
    return [
        {
            "gpu": index,
            "target": owner,
            "used_bytes": gpu.used.get(index),
            "peak_bytes": peak,
            "limit_bytes": limit,
        }
        for index, peak in sorted(gpu.peak.items())
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def progress_fields(targets: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per target, what the minute's progress log line says (no live view)."""
    return {
        name: {
            "rps": round(row["rps"], 2),
            "errors": row["errors"],
            "goodput_pct": _round(None if row["goodput"] is None else row["goodput"] * 100),
            "ttft_p99_ms": _round(row["ttft_p99_ms"]),
            "e2e_p99_ms": _round(row["e2e_p99_ms"]),
        }
        for name, row in targets.items()
    }
