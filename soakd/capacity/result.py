"""Capacity room, the result: each target's knee and its throughput-latency curve, as JSON
(``soakd capacity --out``, ``capacity.json`` in the sweep's directory) and as a terminal
table. ``read_result`` reads the JSON back (plans written as a share of the knee)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from soakd.capacity.step import StepOutcome
from soakd.config import ConfigError

FORMAT = 1
"""The JSON's version: a reader refuses another."""


@dataclass
class StepPoint:
    """One step of the curve: what was offered and what came back."""

    step: int
    load: float  # the step's rate (req/s) or concurrency
    seconds: float
    offered_rps: float  # planned sends a second (made or not)
    achieved_rps: float  # successes a second
    goodput: float | None  # share of judged requests within every SLO
    goodput_rps: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    error_ratio: float | None
    queue_source: str  # "server": the server's own waiting queue; "in_flight": soakd's count
    queue_mean: float | None  # over the step
    server_waiting_max: float | None
    kv_cache_max: float | None  # 0-1, the server's
    steady: bool | None
    passed: bool
    limit: str | None  # the criterion that failed first (None: held)

    @classmethod
    def of(cls, index: int, s: StepOutcome) -> StepPoint:
        secs = s.seconds
        w = s.watched
        lat = s.row.latency_ms
        return cls(
            step=index,
            load=s.load,
            seconds=round(secs, 3),
            offered_rps=s.offered / secs if secs > 0 else 0.0,
            achieved_rps=s.row.ok / secs if secs > 0 else 0.0,
            goodput=s.verdict.goodput,
            goodput_rps=s.tally.good / secs if secs > 0 else None,
            ttft_p50_ms=lat["ttft"].get("p50"),
            ttft_p99_ms=lat["ttft"].get("p99"),
            e2e_p50_ms=lat["e2e"].get("p50"),
            e2e_p99_ms=lat["e2e"].get("p99"),
            error_ratio=s.row.error_ratio,
            queue_source=w.source,
            queue_mean=sum(d for _, d in w.depth) / len(w.depth) if w.depth else None,
            server_waiting_max=max(w.server_waiting) if w.server_waiting else None,
            kv_cache_max=max(w.server_kv) if w.server_kv else None,
            steady=s.steady,
            passed=s.passed,
            limit=s.limit,
        )


@dataclass
class TargetKnee:
    """One target's sweep: the knee, what limited it there, the curve."""

    target: str
    by: str  # "rate" (req/s) or "concurrency"
    knee: float | None  # the highest load that held (None: none did)
    limit: str | None  # at the first failing load above the knee
    ended: str  # why the search ended
    seconds: float
    floor: float | None = None
    steps: list[StepPoint] = field(default_factory=list)

    @property
    def below_floor(self) -> bool:
        return self.floor is not None and (self.knee is None or self.knee < self.floor)


@dataclass
class CapacityResult:
    targets: dict[str, TargetKnee]
    started: str  # ISO time, UTC
    seconds: float
    max_time_s: float

    def doc(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.doc(), indent=2) + "\n")


def read_result(path: Path, where: str = "capacity.result") -> dict[str, tuple[str, float]]:
    """Each target's (by, knee) from a result ``soakd capacity`` wrote (a file, or a
    directory holding ``capacity.json``); ConfigError, one line naming ``where``, when it
    cannot be read. A target whose sweep found no knee is left out."""
    file = path / "capacity.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{where}: {file}: cannot be read ({why})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{where}: {file}: not a soakd capacity result (format {FORMAT})")
    out: dict[str, tuple[str, float]] = {}
    for name, t in doc.get("targets", {}).items():
        if isinstance(t, dict) and isinstance(t.get("knee"), int | float):
            out[name] = (str(t.get("by")), float(t["knee"]))
    return out


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def knee_text(k: TargetKnee) -> str:
    unit = " req/s" if k.by == "rate" else " concurrent"
    knee = "none held" if k.knee is None else f"{k.knee:.3g}{unit}"
    return f"{k.target}: knee {knee}; limited by {k.limit or '-'}; {k.ended} ({k.seconds:.0f} s)"


def curve_table(k: TargetKnee) -> Table:
    """One target's steps, in the order run."""
    t = Table(title=knee_text(k), title_justify="left")
    for col in (
        "step",
        k.by,
        "offered/s",
        "achieved/s",
        "goodput",
        "TTFT p50",
        "TTFT p99",
        "E2E p50",
        "E2E p99",
        "errors",
        "queue",
        "KV max",
        "verdict",
    ):
        t.add_column(col, justify="right" if col != "verdict" else "left")
    for p in k.steps:
        t.add_row(
            str(p.step),
            f"{p.load:.3g}",
            _num(p.offered_rps, "{:.2f}"),
            _num(p.achieved_rps, "{:.2f}"),
            _num(None if p.goodput is None else p.goodput * 100, "{:.1f} %"),
            _num(p.ttft_p50_ms, "{:.0f} ms"),
            _num(p.ttft_p99_ms, "{:.0f} ms"),
            _num(p.e2e_p50_ms, "{:.0f} ms"),
            _num(p.e2e_p99_ms, "{:.0f} ms"),
            _num(None if p.error_ratio is None else p.error_ratio * 100, "{:.1f} %"),
            _num(p.queue_mean) + ("" if p.queue_source == "server" else " (in flight)"),
            _num(None if p.kv_cache_max is None else p.kv_cache_max * 100, "{:.0f} %"),
            "pass" if p.passed else f"FAIL {p.limit}",
        )
    return t
