"""Workers room, the seam the run uses: its targets' clients, in this process or in workers.

``open_senders`` gives the run what it sends through: with one sender (``run.workers: 1``,
or ``auto`` for a plan one loop times well) one ``OpenAITarget`` per target on the run's
own loop (as soakd always did); with more, a ``WorkerPool`` and a ``RemoteTarget`` per
target. The runner sees the same Target and SendGate protocols either way.

``senders_for`` resolves ``run.workers: auto`` (the default) from the plan's peak: the
requests a second, the tokens a second they may stream (at ``workload.max_tokens``) and the
closed-loop streams of the busiest phase, against what one sender times well
(``SENDER_RPS``, ``SENDER_TOKENS_S``, ``SENDER_STREAMS``: about a third of what one loop
reaches saturated, docs/benchmarks.md "Worker processes"), on at most the cores soakd may
use less one (the parent's).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from soakd.config import TargetConfig, Workload
from soakd.model import Plan
from soakd.targets.openai import open_target
from soakd.types import SendGate, Target
from soakd.workers.pool import (
    LEAD_NS,
    RemoteTarget,
    WorkerGate,
    WorkerMetrics,
    WorkerNow,
    WorkerPool,
)
from soakd.workers.reuse import NoReuse
from soakd.workload.build import Builder
from soakd.workload.calibration import Calibration

SENDER_RPS: Final = 600.0
"""Requests a second one sender times well (one loop saturates at 1.5-1.9k of 16 tokens)."""
SENDER_TOKENS_S: Final = 10_000.0
"""Streamed tokens a second one sender times well (one loop saturates at 28-30k)."""
SENDER_STREAMS: Final = 64
"""Concurrent closed-loop streams per sender (the one-core benchmark's load)."""


def plan_peak(plan: Plan) -> tuple[float, int]:
    """The busiest phase's open-loop requests a second (a ramp at its top) and closed-loop
    streams, each summed over the targets."""
    rate, streams = 0.0, 0
    for phase in plan.phases:
        loads = phase.loads.values()
        rate = max(rate, sum(s.peak_rate for s in loads))
        streams = max(streams, sum(s.concurrency for s in loads))
    return rate, streams  # a rehearsal keeps the configured rates


def senders_for(setting: int | str, plan: Plan, max_tokens: int) -> tuple[int, str]:
    """``run.workers`` resolved: how many sender processes (1: this process sends) and why,
    in words for the line ``soakd run`` and ``soakd check`` print."""
    if setting != "auto":
        return int(setting), f"run.workers: {setting}"
    rate, streams = plan_peak(plan)
    tokens = rate * max_tokens
    need = max(
        1,
        math.ceil(rate / SENDER_RPS),
        math.ceil(tokens / SENDER_TOKENS_S),
        math.ceil(streams / SENDER_STREAMS),
    )
    cores = len(os.sched_getaffinity(0))
    n = min(need, max(1, cores - 1))
    peak = (
        f"the plan peaks at {rate:,.0f} req/s (up to {tokens:,.0f} tokens/s at max_tokens "
        f"{max_tokens}) and {streams} closed-loop streams; one sender times about "
        f"{SENDER_RPS:,.0f} req/s, {SENDER_TOKENS_S:,.0f} tokens/s or {SENDER_STREAMS} streams"
    )
    if need == 1:
        return 1, f"run.workers: auto: {peak}, so this process sends"
    if n < need:
        return n, f"run.workers: auto: {peak}: {need} wanted, {n} on {cores} cores (one kept)"
    return n, f"run.workers: auto: {peak}"


@dataclass
class Senders:
    targets: dict[str, Target] = field(default_factory=dict)
    pool: WorkerPool | None = None
    builder: Builder | None = None  # this process's, when it sends itself

    def calibrate(self, cal: Calibration) -> None:
        """Size the text built from ``cal.from_seq`` on by ``cal``, wherever it is built."""
        if self.pool is not None:
            self.pool.calibrate(cal)
        if self.builder is not None:
            self.builder.calibrate(cal)

    @property
    def lead_ns(self) -> int:
        """How early the runner hands an open-loop request over (0: it sends it itself)."""
        return LEAD_NS if self.pool is not None else 0

    def gates(self, own: Mapping[str, SendGate]) -> dict[str, SendGate]:
        """The targets' send gates; with workers, none is open while no worker is up."""
        if self.pool is None:
            return dict(own)
        return {name: WorkerGate(self.pool, own.get(name)) for name in self.targets}

    def status(self) -> tuple[WorkerNow, ...] | None:
        """The worker processes, for /status (None: no workers, requests sent here)."""
        return self.pool.status() if self.pool is not None else None

    async def aclose(self) -> None:
        """Close every client and the workers, each even when another close fails; the
        first failure is raised once all are done."""
        closes = [t.aclose() for t in self.targets.values()]
        if self.pool is not None:
            closes.append(self.pool.aclose())
        for result in await asyncio.gather(*closes, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result


class WorkerStartError(RuntimeError):
    """A worker process that did not start; the message has its log's tail."""


async def open_senders(
    n: int,
    cfgs: list[TargetConfig],
    *,
    run_id: str,
    run_dir: Path,
    registry: CollectorRegistry,
    workload: Workload,
    no_reuse: NoReuse | None = None,
) -> Senders:
    """The run's ``n`` senders (``senders_for``). ConfigError for a target's key or TLS files
    (named, read here first, also when workers read them again); WorkerStartError when a
    worker cannot start. ``no_reuse`` hears what their connection pools learn about closes
    after answers. Each sending process builds its requests' text from ``workload``
    (soakd/workload/build.py), calibrated as ``Senders.calibrate`` says."""
    if n == 1:  # soakd's own process is the one sender, and it is up
        WorkerMetrics(registry, 1).up.set(1)
        builder = Builder(workload)
        return Senders(
            {
                c.name: await open_target(
                    c,
                    run_id=run_id,
                    on_learn=partial(no_reuse.learned, c.name, 0) if no_reuse else None,
                    builder=builder,
                )
                for c in cfgs
            },
            builder=builder,
        )
    for c in cfgs:  # the same errors, here and at once, as with one process
        c.api_key()
        c.ssl_context()
    pool = WorkerPool(n, cfgs, run_id, run_dir, WorkerMetrics(registry, n), no_reuse, workload)
    senders = Senders({c.name: RemoteTarget(c.name, i, pool) for i, c in enumerate(cfgs)}, pool)
    try:
        await pool.start()
    except RuntimeError as exc:
        await pool.aclose()
        raise WorkerStartError(str(exc)) from None
    return senders
