"""Workers room, the seam the run uses: its targets' clients, in this process or in workers.

``open_senders`` gives the run what it sends through: with ``run.workers: 1`` one
``OpenAITarget`` per target on the run's own loop (as soakd always did); with more, a
``WorkerPool`` and a ``RemoteTarget`` per target. The runner sees the same Target and
SendGate protocols either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from soakd.config import TargetConfig
from soakd.targets.openai import open_target
from soakd.types import SendGate, Target
from soakd.workers.pool import (
    LEAD_NS,
    RemoteTarget,
    WorkerGate,
    WorkerMetrics,
    WorkerPool,
    worker_count,
)


@dataclass
class Senders:
    targets: dict[str, Target] = field(default_factory=dict)
    pool: WorkerPool | None = None

    @property
    def lead_ns(self) -> int:
        """How early the runner hands an open-loop request over (0: it sends it itself)."""
        return LEAD_NS if self.pool is not None else 0

    def gates(self, own: Mapping[str, SendGate]) -> dict[str, SendGate]:
        """The targets' send gates; with workers, none is open while no worker is up."""
        if self.pool is None:
            return dict(own)
        return {name: WorkerGate(self.pool, own.get(name)) for name in self.targets}

    def status(self) -> list[dict[str, Any]] | None:
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
    workers: int | str,
    cfgs: list[TargetConfig],
    *,
    run_id: str,
    run_dir: Path,
    registry: CollectorRegistry,
) -> Senders:
    """The run's senders. ConfigError for a target's key or TLS files (named, read here
    first, also when workers read them again); WorkerStartError when a worker cannot start."""
    n = worker_count(workers)
    if n == 1:  # soakd's own process is the one sender, and it is up
        WorkerMetrics(registry, 1).up.set(1)
        return Senders({c.name: await open_target(c, run_id=run_id) for c in cfgs})
    for c in cfgs:  # the same errors, here and at once, as with one process
        c.api_key()
        c.ssl_context()
    pool = WorkerPool(n, cfgs, run_id, run_dir, WorkerMetrics(registry, n))
    senders = Senders({c.name: RemoteTarget(c.name, i, pool) for i, c in enumerate(cfgs)}, pool)
    try:
        await pool.start()
    except RuntimeError as exc:
        await pool.aclose()
        raise WorkerStartError(str(exc)) from None
    return senders
