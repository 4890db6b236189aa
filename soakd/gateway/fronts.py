"""Gateway room, fronts: the gateways a run starts in front of its targets, and their
per-phase modes (docs/gateway.md). The composition root owns one ``Fronts``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from soakd.config import GatewayModes, PhaseConfig, TargetConfig
from soakd.gateway.spawn import GatewayProcess, spawn_gateway
from soakd.journal import records
from soakd.workload.answers import target_asks


class Fronts:
    """The gateways soakd started, by target; ``aclose_all`` stops them."""

    def __init__(self, phases: Sequence[PhaseConfig], run_dir: Path) -> None:
        self.gateways: dict[str, GatewayProcess] = {}
        self._modes: dict[str, dict[str, GatewayModes]] = {}  # phase -> target -> modes
        for p in phases:
            self._modes.setdefault(p.name, p.gateway)  # the first phase of a name, as planned
        self._run_dir = run_dir
        self._tasks: set[asyncio.Task[Any]] = set()

    async def front(self, tcfg: TargetConfig) -> TargetConfig:
        """Start ``soakd gateway`` in front of the target; the client then talks to it, the
        probes still to the server itself. RuntimeError when it does not come up."""
        assert tcfg.gateway is not None
        parts = urlsplit(tcfg.base_url)
        origin = f"{parts.scheme}://{parts.netloc}"
        gateway = await spawn_gateway(tcfg.name, tcfg.gateway, origin, self._run_dir)
        self.gateways[tcfg.name] = gateway
        root = tcfg.base_url.rstrip("/").removesuffix("/v1")
        return tcfg.model_copy(
            update={
                "base_url": gateway.url + parts.path,
                "metrics_url": tcfg.metrics_url or root + "/metrics",
                "health_url": tcfg.health_url or root + "/health",
                "planned_output": target_asks(tcfg),  # as the server's own address says
            }
        )

    def enter(self, phase: str, event: Callable[[records.Event], None] | None) -> None:
        """Switch the phase's gateway features (a PUT to each gateway soakd started), each
        switch journaled through ``event``."""
        for target, modes in self._modes.get(phase, {}).items():
            gateway = self.gateways.get(target)
            if gateway is None:
                continue
            if event is not None:
                event(
                    records.GatewayModes(
                        target, modes.vram_breaker, modes.error_breaker, modes.adaptive
                    )
                )
            task = asyncio.get_running_loop().create_task(gateway.set_modes(modes))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def cancel_switches(self) -> None:
        for task in self._tasks:
            task.cancel()

    def closes(self) -> list[Coroutine[Any, Any, None]]:
        return [g.aclose() for g in self.gateways.values()]
