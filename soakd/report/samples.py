"""Report room, probe samples: the journal's readings placed on plan time and per phase.

``Timeline`` maps wall-clock readings onto plan time (through the sessions) and plan time
onto phases; ``Samples`` answers what the report asks of the readings: a counter's
increase per phase, a gauge's peak per phase, energy per phase, the GPUs and whom they
are charged to, the guard gateways' counts. Reading only: no figure here depends on
another having been asked first.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from soakd.journal import records
from soakd.journal.records import Logged
from soakd.journal.stored import StoredConfig
from soakd.measure.analysis import GpuEnergy, leak_note, leak_slope
from soakd.measure.goodput import guard_refusal
from soakd.report import names
from soakd.report.model import GpuRow, GuardRow, Row

Points = list[tuple[float, float]]
"""(plan seconds, value), in time order."""
Found = list[tuple[dict[str, str], Points]]
"""The series of one name matching some labels: (labels, points) each."""


@dataclass
class Session:
    started_wall: float
    started_offset: float  # seconds of plan time
    wall: float
    offset: float


class Timeline:
    """Maps wall-clock readings onto plan time (sessions) and plan time onto phases."""

    def __init__(self, sessions: list[Session], phases: list[tuple[str, float, float]]) -> None:
        self.sessions = sessions
        self.phases = phases

    def offset(self, wall: float) -> float | None:
        for s in self.sessions:
            if s.started_wall - 1.0 <= wall <= s.wall + 5.0:
                return max(s.started_offset, s.started_offset + wall - s.started_wall)
        return None

    def phase(self, offset_s: float) -> str | None:
        """The phase whose window holds this plan time (a reading after the plan's end:
        the last phase's; None: before the first phase, or no phases)."""
        for name, start, end in self.phases:
            if start <= offset_s < end:
                return name
        return self.phases[-1][0] if self.phases and offset_s >= self.phases[-1][2] else None


class Samples:
    """Probe samples by series, placed on plan time."""

    def __init__(
        self,
        series: dict[int, tuple[str, dict[str, str]]],
        samples: dict[int, list[tuple[float, float]]],
        timeline: Timeline,
    ) -> None:
        self.timeline = timeline
        self.by_name: dict[str, Found] = {}
        for sid, points in samples.items():
            name, labels = series[sid]
            placed = [(off, v) for w, v in points if (off := timeline.offset(w)) is not None]
            if placed:
                self.by_name.setdefault(name, []).append((labels, placed))

    def find(self, name: str, match: Mapping[str, str]) -> Found:
        return [
            (lbl, pts)
            for lbl, pts in self.by_name.get(name, [])
            if all(lbl.get(k) == v for k, v in match.items())
        ]

    def increase(self, name: str, match: Mapping[str, str]) -> dict[str, float] | None:
        """A counter's increase per phase, summed over matching series; None: no series.
        A drop is a restart of soakd (its probe counters start at 0 again)."""
        found = self.find(name, match)
        if not found:
            return None
        out: dict[str, float] = {}
        for _, points in found:
            prev = 0.0
            for offset, value in points:
                inc = value - prev if value >= prev else value
                prev = value
                if inc > 0:
                    phase = self.timeline.phase(offset) or "?"
                    out[phase] = out.get(phase, 0.0) + inc
        return out

    def peaks(self, points: Points) -> dict[str, float]:
        """A gauge's highest reading in each phase it was read in ("?": outside every
        phase), each reading in the phase ``Timeline.phase`` puts it in."""
        out: dict[str, float] = {}
        for offset, value in points:
            phase = self.timeline.phase(offset) or "?"
            if phase not in out or value > out[phase]:
                out[phase] = value
        return out

    def gpu_used(self, gpu: str) -> Points:
        """A GPU's memory-used readings, every series of it (a GPU row's peak and slope)."""
        return [p for _, pts in self.find(names.GPU_MEMORY_USED, {"gpu": gpu}) for p in pts]

    def power_energy(self, gpu: str) -> dict[str, float] | None:
        """Joules per phase from power readings (trapezoids; gaps over 30 s skipped)."""
        found = self.find(names.GPU_POWER, {"gpu": gpu})
        if not found:
            return None
        out: dict[str, float] = {}
        for _, points in found:
            for (t0, p0), (t1, p1) in itertools.pairwise(points):
                if 0 < t1 - t0 <= 30:
                    phase = self.timeline.phase((t0 + t1) / 2) or "?"
                    out[phase] = out.get(phase, 0.0) + (p0 + p1) / 2 * (t1 - t0)
        return out

    def gpu_names(self) -> list[str]:
        found = (lbl for name in names.GPU_NAMES for lbl, _ in self.by_name.get(name, []))
        return sorted({lbl.get("gpu", "?") for lbl in found})

    def charged(self, targets: list[str], config: StoredConfig) -> dict[str, list[str]]:
        """GPU -> the targets charged with it: ``cost.gpus``, else the GPUs the target's
        process was seen on, else every GPU when there is one target (or it owns the DCGM
        page the readings came from)."""
        every = self.gpu_names()
        charged: dict[str, list[str]] = {g: [] for g in every}
        configured = {t.name: t.charged_gpus for t in config.targets}
        for target in targets:
            gpus = configured.get(target)
            if gpus is None:
                gpus = sorted(
                    {
                        lbl["gpu"]
                        for lbl, pts in self.find(names.GPU_PROCESS_MEMORY, {"target": target})
                        if any(v > 0 for _, v in pts)
                    }
                )
            if not gpus and (len(targets) == 1 or target == dcgm_owner(config)):
                gpus = every
            for g in gpus:
                charged.setdefault(g, []).append(target)
        return dict(sorted(charged.items()))

    def energy(self, gpu: str) -> tuple[float | None, dict[str, float]]:
        """A GPU's joules over the run (None: not measured) and per phase: the energy
        counter's increase, else power integrated over time. Kept as the single-module
        report had it: an energy counter that never rose gives 0 J over the run but the
        power integral per phase."""
        counted = self.increase(names.GPU_ENERGY, {"gpu": gpu})
        total = counted if counted is not None else self.power_energy(gpu)
        by_phase = counted or self.power_energy(gpu) or {}
        return (None if total is None else sum(total.values())), by_phase

    def gpus(self, charged: Mapping[str, list[str]]) -> tuple[list[GpuRow], list[GpuEnergy]]:
        """The GPU table's rows, and each GPU's energy for the attribution (``analysis``)."""
        rows, energy = [], []
        for g, targets in charged.items():
            points = self.gpu_used(g)
            values = [v for _, v in points]
            joules, by_phase = self.energy(g)
            power = [v for _, pts in self.find(names.GPU_POWER, {"gpu": g}) for _, v in pts]
            rows.append(
                GpuRow(
                    gpu=g,
                    peak_used_bytes=max(values) if values else None,
                    leak_bytes_per_hour=leak_slope(points),
                    leak_note=leak_note(points),
                    energy_j=joules,
                    mean_power_w=statistics.fmean(power) if power else None,
                    targets=targets,
                )
            )
            energy.append(GpuEnergy(g, targets, joules, by_phase))
        return rows, energy


def dcgm_owner(config: StoredConfig) -> str | None:
    """The target whose own page the GPU readings came from: with ``gpu.source: dcgm`` and
    no ``dcgm_url``, the first simulator target (as the probe picks it); with a
    ``dcgm_url``, the target whose server answers on that host and port."""
    if config.gpu.source != "dcgm":
        return None
    url = config.gpu.dcgm_url
    if not url:
        return next((t.name for t in config.targets if t.simulator), None)
    host = urlsplit(url).netloc
    return next(
        (
            t.name
            for t in config.targets
            if host
            and host in (urlsplit(t.base_url or "").netloc, urlsplit(t.metrics_url or "").netloc)
        ),
        None,
    )


@dataclass(frozen=True)
class Vram:
    """A target's VRAM over the run: its peak and leak slope (None: not measured), and its
    peak in each phase it was read in (``of``)."""

    peak_bytes: float | None
    leak_bytes_per_hour: float | None
    leak_note: str | None
    phase_peaks: Mapping[str, float] = field(default_factory=dict)

    def of(self, phase: str | None) -> Vram:
        """Over the run (``phase`` None), or in one phase: that phase's peak alone (the
        leak slope is the run's; None: no reading in the phase)."""
        if phase is None:
            return self
        return Vram(self.phase_peaks.get(phase), None, None)


def vram(targets: list[str], probe: Samples, gpus: list[GpuRow]) -> dict[str, Vram]:
    """Each target's VRAM peak and leak slope: its process's memory, else its own GPUs'
    (a GPU charged to it alone; a shared GPU's memory is no one target's). A peak is the
    sum over the series (processes, GPUs) of each one's highest reading, over the run or
    within a phase (``Samples.peaks``)."""
    out: dict[str, Vram] = {}
    for target in targets:
        found = probe.find(names.GPU_PROCESS_MEMORY, {"target": target})
        if found:
            longest = max(found, key=lambda f: len(f[1]))[1]
            out[target] = Vram(
                sum(max(v for _, v in pts) for _, pts in found),
                leak_slope(longest),
                leak_note(longest),
                _summed(probe.peaks(pts) for _, pts in found),
            )
            continue
        mine = [g for g in gpus if g.targets == [target]]
        if mine:
            peaks = [g.peak_used_bytes for g in mine if g.peak_used_bytes is not None]
            slopes = [g.leak_bytes_per_hour for g in mine if g.leak_bytes_per_hour is not None]
            out[target] = Vram(
                sum(peaks) if peaks else None,
                sum(slopes) if slopes else None,
                next((g.leak_note for g in mine if g.leak_note), None),
                _summed(probe.peaks(probe.gpu_used(g.gpu)) for g in mine),
            )
    return out


def _summed(peaks: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per phase, the sum of the series' peaks in it (a series not read there adds nothing)."""
    out: dict[str, float] = {}
    for per_phase in peaks:
        for phase, value in per_phase.items():
            out[phase] = out.get(phase, 0.0) + value
    return out


def guard_rows(
    probe: Samples,
    by_phase: dict[str, dict[str, Row]],
    targets: list[str],
    phases: list[str],
    config: StoredConfig,
    events: Sequence[Logged],
) -> list[GuardRow]:
    """Per phase and guarded target: the modes the phase set, breaker openings, the sheds
    soakd counted and the gateway's own rejections, the concurrency limit's range."""
    guarded = [t.name for t in config.targets if t.guarded]
    guarded += [
        t
        for t in targets
        if t not in guarded
        and any(
            guard_refusal(k)
            for row in (p.get(t) for p in by_phase.values())
            if row
            for k in row.errors_by_kind
        )
    ]
    modes: dict[tuple[str, str], str] = {}
    state: dict[str, dict[str, bool]] = {}  # a phase changes the features it names only
    current = None
    for logged in events:
        match logged.event:
            case records.Phase(name=name):
                current = name
            case records.GatewayModes() as e if current is not None:
                flags = state.setdefault(e.target, {})
                flags.update(e.switched())
                modes[(current, e.target)] = ", ".join(k for k, v in flags.items() if v) or "none"
    rows = []
    for target in guarded:
        openings: dict[str, dict[str, float]] = {}
        for labels, _ in probe.find(
            names.GATEWAY_BREAKER_TRANSITIONS, {"target": target, "to": "open"}
        ):
            b = labels.get("breaker", "?")
            openings[b] = (
                probe.increase(
                    names.GATEWAY_BREAKER_TRANSITIONS,
                    {"target": target, "to": "open", "breaker": b},
                )
                or {}
            )
        rejected: dict[str, dict[str, float]] = {}
        for labels, _ in probe.find(names.GATEWAY_REJECTIONS, {"target": target}):
            reason = labels.get("reason", "?")
            rejected[reason] = (
                probe.increase(names.GATEWAY_REJECTIONS, {"target": target, "reason": reason}) or {}
            )
        limits: dict[str, list[float]] = {}
        for _, points in probe.find(names.GATEWAY_CONCURRENCY_LIMIT, {"target": target}):
            pts = sorted(points)  # journaled on change: a step function of plan time
            for name, start, end in probe.timeline.phases:
                before = [v for t, v in pts if t < start]
                inside = [v for t, v in pts if start <= t < end]
                values = ([before[-1]] if before else []) + inside
                if values:
                    limits.setdefault(name, []).extend(values)
        for phase in phases:
            row = by_phase.get(phase, {}).get(target)
            shed = {
                k: n for k, n in (row.errors_by_kind if row else {}).items() if guard_refusal(k)
            }
            lim = limits.get(phase, [])
            rows.append(
                GuardRow(
                    phase,
                    target,
                    modes.get((phase, target), "-"),
                    {b: round(v.get(phase, 0.0)) for b, v in openings.items()},
                    shed,
                    {r: n for r, v in rejected.items() if (n := round(v.get(phase, 0.0)))},
                    min(lim) if lim else None,
                    max(lim) if lim else None,
                )
            )
    return rows
