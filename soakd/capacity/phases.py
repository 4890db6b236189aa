"""Capacity room, capacity over days: a ``mode: sweep`` phase inside a soak re-measures its
targets' knees with the run's own clients, bounded by the phase, and writes
``capacity-NNNN.json`` (NNNN: the phase's index) beside the journal; the report lists each
and the drift (docs/capacity.md). The sweep's requests are kept in memory only: in no
journal row, no total, no verdict of the soak."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry

from soakd.capacity.result import CapacityResult, TargetKnee
from soakd.capacity.sweep import Sweeper, SweepState, metrics_endpoint, sweep_by
from soakd.config import CapacityConfig, Config
from soakd.metrics.capacity import CapacityMetrics
from soakd.model import NS_PER_S, Phase
from soakd.run.session import SweepHook
from soakd.types import Target
from soakd.workload.prompts import make_prompt_source

log = structlog.get_logger()

PHASE_FILE = "capacity-{index:04d}.json"


def phase_hook(cfg: Config, registry: CollectorRegistry | None = None) -> SweepHook:
    """What ``soakd run`` calls when a ``mode: sweep`` phase begins (``RunOptions.on_sweep``);
    ``registry``: where its gauges go (the run's, when given)."""
    cap = cfg.capacity or CapacityConfig()
    metrics = CapacityMetrics(registry if registry is not None else CollectorRegistry())

    async def hook(
        phase: Phase,
        targets: Mapping[str, Target],
        urls: Mapping[str, str],
        deadline: float,
        run_dir: Path,
    ) -> None:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        prompts = make_prompt_source(cfg.workload)
        sweeper = Sweeper(cfg, cap, metrics, SweepState(), prompts, dict.fromkeys(targets, 0))
        t0 = time.monotonic()
        knees: dict[str, TargetKnee] = {}
        names = list(targets)
        for i, name in enumerate(names):
            tcfg = cfg.target(name)
            share = (deadline - time.monotonic()) / (len(names) - i)
            knees[name] = await sweeper.target(
                tcfg,
                targets[name],
                metrics_endpoint(tcfg, urls[name]),
                sweep_by(cfg, name, None),
                time.monotonic() + share,
            )
        result = CapacityResult(knees, started, round(time.monotonic() - t0, 3), deadline - t0)
        doc = result.doc() | {
            "phase": phase.name,
            "phase_index": phase.index,
            "plan_offset_s": phase.start_ns / NS_PER_S,
        }
        path = run_dir / PHASE_FILE.format(index=phase.index)
        await asyncio.to_thread(path.write_text, json.dumps(doc, indent=2) + "\n")
        log.info(
            "capacity_sweep_done",
            phase=phase.name,
            knees={n: k.knee for n, k in knees.items()},
            seconds=result.seconds,
        )

    return hook
