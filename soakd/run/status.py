"""What the run publishes: ``/status``, the live view and the progress log read one typed
value (``Status``), built by the run loop once a tick from what it holds (soakd/run/app.py
hands it in), and ``RunState``, the frozen state the exporter's thread reads.

Cross-thread contract: the exporter (soakd/http.py) serves /status, /readyz and /healthz
on its own thread and reads only the ``RunState`` the loop last published: every value in
it is built fresh at publish time (copies, new rows) and never changed after, so nothing
it holds is an object the loop goes on changing. The gauges of the same moment (in
flight, goodput, spend used) are set by the loop when it publishes (``app.Soak._publish``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Final

from soakd import __version__
from soakd.config import Config
from soakd.measure.analysis import RecentRow, SummaryRow
from soakd.probes.gpu import GpuProbe
from soakd.run.assemble import Parts, Setup
from soakd.workers.pool import WorkerNow
from soakd.workload.failing import FailingNow
from soakd.workload.sizing import PromptTokens

STALL_S: Final = 30.0
"""/healthz says 503 when the run loop has not ticked for this long."""


class StatusRow(RecentRow):
    """A target's row in /status and the live view: the last minute (``RecentRow``) and
    the notes its answers carried this session (soakd/measure/notes.py)."""

    notes: dict[str, int]


@dataclass(frozen=True, slots=True)
class GpuNow:
    """One GPU now: used, peak, the VRAM line and whose it is."""

    gpu: str
    target: str | None
    used_bytes: float | None
    peak_bytes: float
    limit_bytes: float | None


@dataclass(frozen=True, slots=True)
class Status:
    """``/status``, typed: the fields in the JSON's order (``doc``)."""

    run_id: str
    version: str
    node: str
    site: str | None
    phase: str | None
    phase_index: int | None
    phases: int
    elapsed_s: float
    remaining_s: float
    plan_scale: float
    stopping: bool
    in_flight: Mapping[str, int]
    workers: tuple[WorkerNow, ...] | None  # None: no sender processes, sent here
    missed: Mapping[str, Mapping[str, int]]  # sends not made this session, by reason
    failing: Mapping[str, FailingNow]  # the targets paused as failing
    no_reuse: Mapping[str, Sequence[int]]  # statuses after which a server closes unannounced
    vram: tuple[GpuNow, ...]
    lag_limit_s: float
    drain_timeout_s: float
    slo: Mapping[str, Mapping[str, float]]  # each target's limits
    metrics_url: str | None
    targets: Mapping[str, StatusRow]
    prompt_tokens: PromptTokens | None  # None: before the prompts are sized
    # phase -> target -> its load as a share of the knee, resolved (docs/capacity.md)
    shares: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The /status JSON document: every field, in order; a value as JSON has it."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: object) -> Any:
    """A published value as JSON's types: dataclasses and mappings as dicts, tuples as
    lists (new containers: the document shares nothing with the state)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RunState:
    """What the run loop published last (each tick, and at a stop): all the exporter's
    thread reads of the run (soakd/http.py's ``Published``)."""

    status: Status
    ready: bool  # /readyz: sending, not stopping
    ticked: float | None  # time.monotonic() of the loop's last tick (None: not ticking yet)

    def status_doc(self) -> dict[str, Any]:
        return self.status.doc()

    def stalled(self) -> str | None:
        """None while the run loop turns; else why /healthz should say 503."""
        if self.ticked is None:
            return None  # starting: the run loop is busy opening things, not stuck
        stalled = time.monotonic() - self.ticked
        return f"run loop stalled for {stalled:.0f} s" if stalled > STALL_S else None


def status_now(s: Setup, parts: Parts | None, metrics_url: str | None) -> Status:
    """/status now, from what the run holds (``parts``: None until assembled)."""
    runner = parts.runner if parts is not None else None
    elapsed = runner.offset_ns() / 1e9 if runner else 0.0
    total = s.plan.duration_ns / 1e9
    phase = runner.phase if runner else None
    return Status(
        run_id=s.run_id,
        version=__version__,
        node=s.cfg.run.node,
        site=s.cfg.run.site,
        phase=phase.name if phase else None,
        phase_index=phase.index if phase else None,
        phases=len(s.plan.phases),
        elapsed_s=round(elapsed, 3),
        remaining_s=round(max(0.0, total - elapsed), 3),
        plan_scale=s.plan.scale,
        stopping=bool(runner and runner.stopping),
        in_flight=dict(runner.in_flight) if runner else {},
        workers=parts.senders.status() if parts else None,
        missed=parts.ledger.by_target(session=True) if parts else {},
        failing={name: f for name, g in parts.guards.by_target.items() if (f := g.failing_now())}
        if parts
        else {},
        no_reuse=parts.no_reuse.status() if parts else {},
        vram=vram_status(parts.probes.gpu if parts else None, s.cfg, s.names),
        lag_limit_s=s.cfg.alert_limits.dispatch_lag,
        drain_timeout_s=s.cfg.run.drain_timeout,
        slo=s.live_slo,
        metrics_url=metrics_url,
        targets={name: _row(s, name, row) for name, row in s.stats.recent().items()},
        shares=s.cfg.share_texts(),
        prompt_tokens=parts.lengths.status() if parts else None,
    )


def _row(s: Setup, name: str, row: SummaryRow) -> StatusRow:
    """A target's last minute, its goodput over it and its notes this session."""
    good = s.goodput.row(name)
    return {
        **row,
        "goodput": good["goodput"],
        "goodput_rps": good["goodput_rps"],
        "notes": s.notes.row(name),
    }


def gpu_owner(cfg: Config, names: Sequence[str]) -> str | None:
    """The target the GPU readings belong to, as the report attributes them: the only
    target, or the simulator whose own DCGM page is read."""
    if len(names) == 1:
        return names[0]
    if cfg.gpu.source == "dcgm" and cfg.gpu.dcgm_url is None:
        return next((t.name for t in cfg.targets if t.simulator), None)
    return None


def vram_status(gpu: GpuProbe | None, cfg: Config, names: Sequence[str]) -> tuple[GpuNow, ...]:
    """Each GPU now: used, peak, the VRAM line and whose it is."""
    if gpu is None or not gpu.peak:
        return ()
    owner = gpu_owner(cfg, names)
    limit = cfg.slo_for(owner).vram_peak if owner else cfg.slo.vram_peak
    # used: the probe's own last reading; the registry's get_sample_value would collect
    # every metric family on the run loop, each second (~ms)
    return tuple(
        GpuNow(index, owner, gpu.used.get(index), peak, limit)
        for index, peak in sorted(gpu.peak.items())
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def progress_fields(targets: Mapping[str, StatusRow]) -> dict[str, dict[str, Any]]:
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
