"""Capacity room, the sweep: each target's knee, one target after the other, within one
time bound (docs/capacity.md).

The servers soakd starts (simulators, gateways) are started as ``soakd run`` starts them
(``soakd/run/assemble.py``: ``Setup``, ``start_servers``), the clients opened by the same
``open_senders``, the prompts made by the same source; each step is a one-phase plan run
by the one ``Runner`` (``soakd/capacity/step.py``) and judged by the SLO's ``judge``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from soakd.capacity.result import CapacityResult, StepPoint, TargetKnee
from soakd.capacity.search import Search
from soakd.capacity.step import StepOutcome, run_step
from soakd.config import CapacityConfig, Config, ConfigError, PhaseConfig, TargetConfig
from soakd.http import Board, start_exporter
from soakd.metrics.capacity import CapacityMetrics
from soakd.model import NS_PER_S
from soakd.probes._http import Endpoint, base_root, endpoint_for
from soakd.run.assemble import Setup, start_servers
from soakd.run.session import RunOptions
from soakd.shapes import LoadShape, shape_of
from soakd.sim.spawn import SimProcess
from soakd.types import Target
from soakd.workers.senders import open_senders
from soakd.workload.answers import workload_answers
from soakd.workload.prompts import PromptSource, make_prompt_source

log = structlog.get_logger()

LATENESS_S = 1.0
"""An open-loop step's send later than this is not made (and fails the step)."""


@dataclass
class SweepState:
    """What the sweep's exporter serves on /status (``soakd.http.Published``)."""

    doc: dict[str, Any] = field(default_factory=dict)
    ready: bool = True

    def status_doc(self) -> dict[str, Any]:
        return dict(self.doc)

    def stalled(self) -> str | None:
        return None


def sweep_by(cfg: Config, name: str, by: str | None) -> str:
    """``rate`` or ``concurrency``: the flag, else ``capacity.by``, else the load mode of the
    target's first phase that sends (a closed loop: concurrency)."""
    chosen = by or (cfg.capacity.by if cfg.capacity else None)
    if chosen:
        return chosen
    for phase in cfg.phases:
        load = cfg.load_for(phase, name)
        if load.mode not in ("idle", "sweep"):
            return "concurrency" if load.mode == "closed" else "rate"
    return "rate"


def step_shape(by: str, load: float, cap: CapacityConfig, tcfg: TargetConfig) -> LoadShape:
    """One step's load: a closed loop of ``load`` streams, or ``load`` req/s."""
    if by == "concurrency":
        return shape_of("closed", concurrency=round(load))
    return shape_of(
        cap.arrivals,
        rate=load,
        max_in_flight=tcfg.max_connections,
        max_lateness_ns=round(LATENESS_S * NS_PER_S),
    )


def metrics_endpoint(tcfg: TargetConfig, url: str) -> Endpoint | None:
    """The server's own /metrics, as the probes read it (None: scraping is off)."""
    if not tcfg.scrape:
        return None
    return endpoint_for(tcfg.metrics_url or base_root(url) + "/metrics", tcfg)


@dataclass
class Sweeper:
    """One target's search, step after step, within its share of the time left."""

    cfg: Config
    cap: CapacityConfig
    metrics: CapacityMetrics
    state: SweepState
    prompts: PromptSource
    seqs: dict[str, int]
    on_step: Callable[[str, StepPoint], None] | None = None

    async def target(
        self, tcfg: TargetConfig, client: Target, ep: Endpoint | None, by: str, deadline: float
    ) -> TargetKnee:
        name, cap = tcfg.name, self.cap
        slo = self.cfg.slo_for(name)
        search = Search(
            cap.start,
            cap.factor,
            cap.ceiling_for(by, tcfg.max_connections),
            cap.precision,
            whole=by == "concurrency",
        )
        knee = TargetKnee(name, by, None, None, "searched to precision", 0.0, cap.floor.get(name))
        started = time.monotonic()
        wl = self.cfg.workload
        answers = workload_answers(wl, self.prompts)
        while (load := search.next()) is not None:
            left = deadline - time.monotonic()
            send_s = min(cap.max_step, left / 2)
            if send_s < cap.min_step:
                knee.ended = "time bound reached"
                break
            index = len(knee.steps) + 1
            self._show(name, by, index, load)
            step = await run_step(
                name,
                client,
                step_shape(by, load, cap, tcfg),
                load,
                slo=slo,
                prompts=self.prompts,
                seqs=self.seqs,
                max_tokens=wl.max_tokens,
                temperature=wl.temperature,
                seed=wl.seed,
                answers=answers,
                metrics_ep=ep,
                min_s=cap.min_step,
                min_requests=cap.min_requests,
                max_s=send_s,
                tolerance=cap.steady_tolerance,
                deadline=deadline,
            )
            search.record(load, step.passed)
            point = StepPoint.of(index, step)
            knee.steps.append(point)
            self._judged(name, by, step, search)
            if self.on_step is not None:
                self.on_step(name, point)
            ended = _stop_early(step, cap)
            if ended:
                knee.ended = ended
                break
        else:
            if search.at_ceiling:
                knee.ended = "held up to the ceiling"
            elif search.knee is None:
                knee.ended = "no load held"
        knee.knee = search.knee
        knee.limit = _limit_above(knee)
        knee.seconds = round(time.monotonic() - started, 3)
        return knee

    def _show(self, name: str, by: str, index: int, load: float) -> None:
        self.metrics.step.labels(name).set(index)
        self.metrics.rate.labels(name, by).set(load)
        self.state.doc = {"target": name, "by": by, "step": index, "load": load}
        log.info("capacity_step", target=name, step=index, by=by, load=round(load, 4))

    def _judged(self, name: str, by: str, step: StepOutcome, search: Search) -> None:
        self.metrics.verdict.labels(name).set(int(step.passed))
        if search.knee is not None:
            self.metrics.knee.labels(name, by).set(search.knee)
        log.info(
            "capacity_step_judged",
            target=name,
            load=round(step.load, 4),
            passed=step.passed,
            limit=step.limit,
            steady=step.steady,
            seconds=round(step.seconds, 2),
            requests=step.row.requests,
        )


def _stop_early(step: StepOutcome, cap: CapacityConfig) -> str | None:
    """Why the sweep of a target ends at this step, whatever the search would try next."""
    if step.vram_shed:
        return "a VRAM breaker opened"
    ratio = step.row.error_ratio
    if ratio is not None and ratio > cap.stop_error_ratio:
        return f"errors climbed ({ratio:.0%} of the step's requests)"
    return None


def _limit_above(knee: TargetKnee) -> str | None:
    """What failed at the lowest failing load above the knee (the limit there)."""
    above = [p for p in knee.steps if not p.passed and (knee.knee is None or p.load > knee.knee)]
    if not above:
        return None
    return min(above, key=lambda p: p.load).limit


async def sweep(
    cfg: Config,
    run_dir: Path,
    *,
    by: str | None = None,
    max_time_s: float | None = None,
    metrics_addr: str | None = None,
    on_step: Callable[[str, StepPoint], None] | None = None,
) -> CapacityResult:
    """Every target's knee, one target after the other, all within ``max_time_s`` (else
    ``capacity.max_time``) from the first step; the servers soakd starts are started first.
    ConfigError: a target with no SLO, an unknown floor target."""
    problem = cfg.capacity_problem()
    if problem:
        raise ConfigError(problem)
    cap = cfg.capacity or CapacityConfig()
    bound = max_time_s if max_time_s is not None else cap.max_time
    await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
    bys = {t.name: sweep_by(cfg, t.name, by) for t in cfg.targets}
    # the servers are started as a run's, with a plan of its own (the config's may hold
    # shares of the knee this sweep is to measure)
    plain = cfg.model_copy(update={"phases": [PhaseConfig(name="capacity", duration=60)]})
    setup = Setup.open(plain, RunOptions(run_dir=run_dir))
    registry = CollectorRegistry(auto_describe=True)
    metrics = CapacityMetrics(registry)
    state = SweepState()
    started_wall = datetime.now(UTC).isoformat(timespec="seconds")
    sims: list[SimProcess] = []
    async with contextlib.AsyncExitStack() as stack:
        http = await start_exporter(cfg.exporter, metrics_addr, registry, Board(state))
        stack.push_async_callback(http.aclose)
        log.info("exporter_listening", url=http.url)
        stack.push_async_callback(_close_servers, setup, sims)
        servers = await start_servers(setup, sims)
        senders = await open_senders(
            1,
            list(servers.clients),
            run_id=setup.run_id,
            run_dir=run_dir,
            registry=registry,
            workload=cfg.workload,  # the text its steps send: the plan's prompts
        )
        stack.push_async_callback(senders.aclose)
        prompts = make_prompt_source(cfg.workload)
        seqs = {t.name: 0 for t in cfg.targets}
        sweeper = Sweeper(cfg, cap, metrics, state, prompts, seqs, on_step)
        t0 = time.monotonic()
        deadline = t0 + bound
        knees: dict[str, TargetKnee] = {}
        for i, tcfg in enumerate(cfg.targets):
            share = (deadline - time.monotonic()) / (len(cfg.targets) - i)
            knees[tcfg.name] = await sweeper.target(
                tcfg,
                senders.targets[tcfg.name],
                metrics_endpoint(tcfg, servers.urls[tcfg.name]),
                bys[tcfg.name],
                time.monotonic() + share,
            )
        state.ready = False
        return CapacityResult(knees, started_wall, round(time.monotonic() - t0, 3), bound)
    raise AssertionError("unreachable")  # pragma: no cover


async def _close_servers(setup: Setup, sims: list[SimProcess]) -> None:
    for close in setup.fronts.closes() + [sim.aclose() for sim in sims]:
        with contextlib.suppress(Exception):
            await close
