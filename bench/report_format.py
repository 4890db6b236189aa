"""docs/benchmarks.md's cells: a figure, a median, a median with its range, as bench/report.py's
tables print them; the clients' labels and order."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

LABEL = {
    "bare": "bare aiohttp loop (floor)",
    "soakd-hot": "soakd hot path, in-process",
    "soakd": "`soakd run` (journal + exporter)",
    "vllm": "`vllm bench serve`",
    "aiperf": "AIPerf",
    "guidellm": "GuideLLM",
}
ORDER = ["bare", "soakd-hot", "soakd", "vllm", "aiperf", "guidellm"]


def _f(v: Any, nd: int = 2, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _spread(values: Sequence[float | None], nd: int = 2) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.{nd}f}"
    return f"{statistics.median(vals):.{nd}f} ({min(vals):.{nd}f}–{max(vals):.{nd}f})"
