"""Spawn: runs the embedded simulator as a child process for targets with ``simulator: PROFILE``.

A separate process, not a task in soakd's loop, so the simulated server's CPU never
shows up as soakd's own latency. Started through ``soakd.spawn`` (parent-death signal,
log file, readiness on /health).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from soakd.spawn import Child, free_port, spawn_soakd

__all__ = ["SimProcess", "free_port", "spawn_sim"]

log = structlog.get_logger()


@dataclass
class SimProcess(Child):
    """A running ``soakd sim``; ``base_url`` is its root URL."""

    @property
    def base_url(self) -> str:
        return self.url


async def spawn_sim(
    profile: str, model: str, log_path: Path, timeout_s: float = 30.0
) -> SimProcess:
    """Start ``soakd sim`` on a free loopback port and wait until /health answers.

    Its output goes to ``log_path``. Raises ``soakd.spawn.SpawnError`` (a RuntimeError)
    with the log's tail when it does not come up."""
    port = free_port()
    child = await spawn_soakd(
        ["sim", "--host", "127.0.0.1", "--port", str(port), "--profile", profile,
         "--model", model],
        what="simulator",
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
        log_path=log_path,
        timeout_s=timeout_s,
    )  # fmt: skip
    sim = SimProcess(child.proc, child.url)
    log.info("simulator_started", profile=profile, url=sim.base_url, pid=sim.proc.pid)
    return sim
