"""Probes room: watches the GPU and the servers (NVML or DCGM, target /metrics, health,
restarts, OOMs, leaks, P99 drift) and exports what it sees; the composition root calls
``make_probes``.

Every probe loop is its own task, survives its own failures (logged, retried), and only
ever ends by cancellation; ``Probes.outcome_sink`` lets request outcomes count as
evidence too (a refused connect is a down target, an OOM error body an OOM event).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import aiohttp
import structlog

from soakd.config import Config, TargetConfig
from soakd.metrics import names as mn
from soakd.metrics.run import ProbeMetrics
from soakd.model import Finished, Sample
from soakd.probes._http import Endpoint, base_root, endpoint_for, resolve_proxy
from soakd.probes._ticks import sleep_until_next
from soakd.probes.drift import LatencyDrift
from soakd.probes.gpu import GpuProbe, NvmlApi, ProcFs, make_gpu_source
from soakd.probes.health import TargetState, health_loop
from soakd.probes.oom import COUNTED_SOURCES, LogTail, OomWatch, tail_loop
from soakd.probes.server import ServerScraper

__all__ = ["Probes", "make_probes"]

log = structlog.get_logger()

LOOP_RESTART_S = 5.0
TAIL_INTERVAL_S = 1.0
CONFIRM_SCRAPES = 3
"""After a hard down and back up, wait this many scrape intervals for a start time."""


class _SafeEmit:
    """Hands samples to the journal; a failing journal is logged once, never raised into
    a probe or into the request path."""

    def __init__(self, emit: Callable[[Sample], None]) -> None:
        self._emit = emit
        self._failed = False

    def __call__(self, sample: Sample) -> None:
        try:
            self._emit(sample)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                log.warning("probe_sample_dropped", reason=f"{type(exc).__name__}: {exc}"[:200])


class ProbeSink:
    """The probes' OutcomeSink: OOM error bodies and error bursts, refused connects,
    latencies for the P99 drift."""

    def __init__(self, oom: OomWatch, states: dict[str, TargetState], drift: LatencyDrift) -> None:
        self._oom = oom
        self._states = states
        self._drift = drift

    def record(self, outcome: Finished) -> None:
        self._oom.record(outcome)
        self._drift.record(outcome)
        state = self._states.get(outcome.target)
        if state is not None:
            state.record(outcome)


class Probes:
    """Every probe of a run. ``run()`` until cancelled, then ``aclose()``."""

    def __init__(
        self,
        cfg: Config,
        metrics: ProbeMetrics,
        targets: dict[str, str],
        emit: Callable[[Sample], None],
        *,
        nvml: NvmlApi | None = None,
        procfs: ProcFs | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._emit = emit = _SafeEmit(emit)
        probes = cfg.probes
        confirm = max(CONFIRM_SCRAPES * probes.scrape_interval, 2 * probes.health_interval)
        self.states = {
            t.name: TargetState(t.name, metrics, emit, confirm_s=confirm) for t in cfg.targets
        }
        self.oom = OomWatch(metrics, [t.name for t in cfg.targets], emit)
        for name, state in self.states.items():
            state.listeners.append(self.oom.on_restart)
            metrics.restarts.labels(name)  # zero, not absent, until the first restart
        self.drift = LatencyDrift(
            [t.name for t in cfg.targets],
            metrics,
            emit,
            interval_s=probes.drift_interval,
            window_s=probes.drift_window,
        )
        self.outcome_sink = ProbeSink(self.oom, self.states, self.drift)
        self.scrapers: list[ServerScraper] = []
        self.health: list[tuple[TargetState, Endpoint]] = []
        self.tails: list[tuple[str, LogTail]] = []
        for t in cfg.targets:
            base = targets.get(t.name) or t.base_url
            self._add_target(t, base)
        self.gpu = self._make_gpu(targets, nvml, procfs)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    # --- construction ------------------------------------------------------------------------

    def _add_target(self, t: TargetConfig, base: str) -> None:
        if t.oom_log is not None:
            self.tails.append((t.name, LogTail(t.oom_log)))
        if not t.scrape:
            return
        if not base and not (t.metrics_url and t.health_url):
            log.warning(
                "probe_target_without_url",
                target=t.name,
                note="no resolved base_url: not scraped, not health-checked",
            )
            return
        root = base_root(base) if base else ""
        metrics_ep = endpoint_for(t.metrics_url or root + "/metrics", t)
        health_ep = endpoint_for(t.health_url or root + "/health", t)
        self.metrics.scrape_errors.labels(t.name)
        self.metrics.preemptions.labels(t.name)
        self.scrapers.append(
            ServerScraper(
                t.name,
                metrics_ep,
                self.metrics,
                self.states[t.name],
                self._emit,
                leak_window_s=self.cfg.gpu.leak_window,
            )
        )
        self.health.append((self.states[t.name], health_ep))

    def _make_gpu(
        self, targets: dict[str, str], nvml: NvmlApi | None, procfs: ProcFs | None
    ) -> GpuProbe | None:
        g = self.cfg.gpu
        sim = next((t for t in self.cfg.targets if t.simulator), None)
        sim_base = (targets.get(sim.name) or sim.base_url) if sim is not None else ""
        source = make_gpu_source(
            g, dcgm_base=sim_base or "", targets=self.cfg.targets, nvml=nvml, procfs=procfs
        )
        if source is None:
            if g.source == "dcgm":  # no URL to read (logged): say so in the gauge too
                self.metrics.probe_up.labels("dcgm").set(0)
            return None
        return GpuProbe(
            source,
            self.metrics,
            self._emit,
            interval=g.interval,
            leak_window_s=g.leak_window,
            leak_limit_bytes_per_hour=self.cfg.alert_limits.vram_leak_per_hour,
            on_vanished=self.oom.process_vanished,
        )

    # --- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every probe loop until cancelled. Never raises anything but CancelledError."""
        session = self._session = aiohttp.ClientSession(trust_env=False)
        probes = self.cfg.probes
        try:
            async with asyncio.TaskGroup() as tg:
                if self.gpu is not None:
                    tg.create_task(self._guard("gpu", self.gpu.run))
                for scraper in self.scrapers:
                    scraper.ep = await resolve_proxy(scraper.ep)
                    tg.create_task(
                        self._guard(
                            f"scrape:{scraper.target}",
                            partial(scraper.run, session, probes.scrape_interval),
                        )
                    )
                for state, ep in self.health:
                    tg.create_task(
                        self._guard(
                            f"health:{state.name}",
                            partial(
                                health_loop,
                                state,
                                session,
                                await resolve_proxy(ep),
                                probes.health_interval,
                            ),
                        )
                    )
                tail_every = min(TAIL_INTERVAL_S, probes.health_interval)
                for target, tail in self.tails:
                    tg.create_task(
                        self._guard(
                            f"oom_log:{target}",
                            partial(tail_loop, self.oom, target, tail, tail_every),
                        )
                    )
                tg.create_task(self._guard("journal", self._journal_loop))
                tg.create_task(self._guard("drift", self.drift.run))
        finally:
            self._session = None
            await session.close()

    async def aclose(self) -> None:
        """Stop NVML's threads, close files and HTTP sessions. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                await self.gpu.aclose()
        for _target, tail in self.tails:
            tail.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _guard(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run one probe loop; log and restart it if it ever fails."""
        while True:
            try:
                await loop()
            except Exception as exc:
                log.error(
                    "probe_loop_failed",
                    probe=name,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=LOOP_RESTART_S,
                    exc_info=True,
                )
            else:
                return  # a loop that returns (an absent GPU) is done
            await asyncio.sleep(LOOP_RESTART_S)

    async def _journal_loop(self) -> None:
        """Up, restarts and OOM totals of every target, each health interval, for the journal;
        also settles down/up restarts of targets nobody health-checks."""
        interval = self.cfg.probes.health_interval
        next_t = time.monotonic()
        while True:
            wall = time.time()
            for name, state in self.states.items():
                state.tick()
                t = (("target", name),)
                if state.up is not None:
                    self._emit(Sample(wall, mn.TARGET_UP, 1.0 if state.up else 0.0, t))
                self._emit(Sample(wall, mn.TARGET_RESTARTS_TOTAL, float(state.restarts), t))
                for source in COUNTED_SOURCES:
                    self._emit(
                        Sample(
                            wall,
                            mn.TARGET_OOM_EVENTS_TOTAL,
                            float(self.oom.totals.get((name, source), 0)),
                            (("source", source), ("target", name)),
                        )
                    )
            next_t = await sleep_until_next(next_t, interval)


def make_probes(
    cfg: Config,
    metrics: ProbeMetrics,
    targets: dict[str, str],
    emit: Callable[[Sample], None],
    *,
    nvml: NvmlApi | None = None,
    procfs: ProcFs | None = None,
) -> Probes:
    """Build every probe the config asks for. ``targets``: target name -> resolved base URL
    (simulator targets get theirs at run time). ``nvml``/``procfs``: fakes for tests."""
    return Probes(cfg, metrics, targets, emit, nvml=nvml, procfs=procfs)
