"""Capacity room, one step: one load on one target, run by the one ``Runner`` until its
queue is steady (or ``max_step``), then drained, and judged by the SLO's own ``judge``.

The step's plan is one phase of one load shape; its outcomes go to a ``StepRecorder``
(the runner's whole-outcome reader: no journal in a sweep), which folds them into a
``TargetStats`` and a goodput ``Tally``. While the step runs, a watcher reads the
server's queue depth and KV-cache use from its own /metrics every ``WATCH_S``, and
soakd's in-flight count beside them (the queue when the server exports none).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from soakd.capacity.search import steady
from soakd.config import Slo
from soakd.measure.analysis import Digest, Quantiles, TargetStats, ms
from soakd.measure.goodput import Tally, error_counts, tally_outcome
from soakd.measure.verdicts import Verdict, judge
from soakd.model import NS_PER_S, ErrorKind, Outcome, Phase, Plan
from soakd.probes._http import Endpoint, fetch
from soakd.probes.server import ServerReading, parse_server_metrics
from soakd.shapes import LoadShape
from soakd.types import Target
from soakd.workload.ledger import SendLedger
from soakd.workload.prompts import PromptSource
from soakd.workload.runner import Runner

WATCH_S = 0.25
"""How often a step reads the queue (the server's /metrics and soakd's in-flight count)."""
SCRAPE_TIMEOUT_S = 1.0
"""A scrape slower than this is no reading (the step's end waits for it at most this)."""
MISSED_LIMIT = 0.01
MISSED_FLOOR = 2
"""A step that could not make more than this share of its planned sends (and more than
``MISSED_FLOOR``: the instant due as a step is stopped counts as one) did not offer its
load (soakd's in-flight cap, or sends too late): it fails as ``offered_not_sent``."""
PHASE = "capacity"


class StepRecorder:
    """The runner's whole-outcome reader for one step: counts, digests and goodput."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.stats = TargetStats()
        self.tally = Tally()
        self.vram_shed = 0  # refused by a guard gateway's VRAM breaker

    def record(self, outcome: Outcome) -> None:
        self.stats.add(outcome)
        tally_outcome(self.tally, outcome, self.slo)
        if outcome.error is ErrorKind.SHED_VRAM_BREAKER:
            self.vram_shed += 1


def _quantiles(digest: Digest) -> Quantiles:
    return {"p50": ms(digest.quantile(0.5)), "p99": ms(digest.quantile(0.99))}


@dataclass
class StepRow:
    """What ``verdicts.judge`` reads of a step (its ``RowLike``): the step's outcomes."""

    requests: int
    ok: int
    not_judged: int
    success_rate: float | None
    error_ratio: float | None
    server_error_ratio: float | None
    latency_ms: dict[str, Quantiles]
    active_s: float
    rps: float | None
    output_tps: float | None
    oom_responses: int
    jitter: float | None = None  # a step is too short for slices
    oom_events: int | None = None
    vram_peak_bytes: float | None = None
    correct_ratio: float | None = None  # a step sends no checks: that SLO key is not judged

    @classmethod
    def of(cls, stats: TargetStats, seconds: float) -> StepRow:
        counts = error_counts(stats.requests, stats.errors)
        attempted = stats.requests - counts.excluded
        return cls(
            requests=stats.requests,
            ok=stats.ok,
            not_judged=counts.excluded,
            success_rate=stats.ok / attempted if attempted else None,
            error_ratio=counts.error_ratio,
            server_error_ratio=counts.server_error_ratio,
            latency_ms={k: _quantiles(getattr(stats, k)) for k in ("ttft", "e2e", "tpot")},
            active_s=seconds,
            rps=stats.ok / seconds if seconds > 0 else None,
            output_tps=stats.output_tokens / seconds if seconds > 0 else None,
            oom_responses=0,  # no probe in a sweep: the SLO's oom_events reads none
        )


@dataclass
class Watched:
    """A step's queue readings: (seconds into the step, depth), and the server's own."""

    depth: list[tuple[float, float]] = field(default_factory=list)
    server_waiting: list[float] = field(default_factory=list)
    server_kv: list[float] = field(default_factory=list)
    source: str = "in_flight"  # "server": the server's waiting queue

    def add(self, t: float, in_flight: int, reading: ServerReading | None) -> None:
        waiting = reading.waiting if reading is not None else None
        if waiting is not None:
            self.server_waiting.append(waiting)
            self.source = "server"
        if reading is not None and reading.kv_cache is not None:
            self.server_kv.append(reading.kv_cache)
        # the server's queue where it says it, else soakd's in-flight count
        self.depth.append((t, waiting if waiting is not None else float(in_flight)))


@dataclass
class StepOutcome:
    """One step, measured and judged."""

    load: float
    seconds: float  # how long it sent
    steady: bool | None
    offered: int  # planned sends (made + not made)
    missed: int
    row: StepRow
    tally: Tally
    verdict: Verdict
    watched: Watched
    vram_shed: int
    cancelled: int  # cut at the drain deadline

    @property
    def passed(self) -> bool:
        return self.limit is None

    @property
    def limit(self) -> str | None:
        """The criterion that failed first (None: the step held): the SLO's first failed
        key, then the queue still rising, sends not made, a VRAM breaker's refusals."""
        failed = self.verdict.failed
        if failed:
            return failed[0].name
        if self.vram_shed:
            return "vram_breaker"
        if self.missed > max(MISSED_FLOOR, MISSED_LIMIT * self.offered):
            return "offered_not_sent"
        if self.steady is False:
            return "queue_rising"
        if self.verdict.passed is None:
            return "not_judged"
        return None


async def _scrape(session: aiohttp.ClientSession, ep: Endpoint | None) -> ServerReading | None:
    if ep is None:
        return None
    got = await fetch(session, ep, SCRAPE_TIMEOUT_S, attempts=1)
    if not got.ok:
        return None
    try:
        return parse_server_metrics(got.text)
    except ValueError:
        return None


async def run_step(
    name: str,
    target: Target,
    shape: LoadShape,
    load: float,
    *,
    slo: Slo,
    prompts: PromptSource,
    seqs: dict[str, int],
    max_tokens: int,
    temperature: float,
    seed: int,
    answers: Callable[[int], int | None] | None,
    metrics_ep: Endpoint | None,
    min_s: float,
    min_requests: int,
    max_s: float,
    tolerance: float,
    deadline: float,
) -> StepOutcome:
    """Send ``shape`` to one target for at least ``min_s`` and at most ``max_s``, ending
    as soon as the queue is steady after ``min_s`` and ``min_requests`` answers; then
    drain until ``deadline`` (``time.monotonic()``) at most: what is still out then is cut
    (``cancelled``, judged by no one)."""
    recorder = StepRecorder(slo)
    ledger = SendLedger()
    plan = Plan((Phase(0, PHASE, 0, math.ceil(max_s * NS_PER_S), {name: shape}),))
    runner = Runner(
        plan,
        {name: target},
        prompts,
        [],
        journal=recorder,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        seqs=seqs,
        ledger=ledger,
        answers=answers,
    )
    watched = Watched()
    judged: bool | None = None
    started = time.monotonic()
    running = asyncio.ensure_future(runner.run())
    async with aiohttp.ClientSession() as session:
        while not running.done():
            reading = await _scrape(session, metrics_ep)
            t = time.monotonic() - started
            watched.add(t, runner.in_flight.get(name, 0), reading)
            if t >= min_s and recorder.stats.requests >= min_requests:
                judged = steady(watched.depth, tolerance)
                if judged:
                    runner.stop()
                    break
            spent = time.monotonic() - started - t
            await asyncio.wait({running}, timeout=max(0.0, WATCH_S - spent))
    await running
    if not judged:  # ran to max_s: judged over the whole step
        judged = steady(watched.depth, tolerance)
    sent_s = runner.active_s()
    runner.stop()  # the instants due now are not sent late into the drain
    cancelled = await runner.drain(max(0.0, deadline - time.monotonic()))
    row = StepRow.of(recorder.stats, sent_s)
    verdict = judge(name, PHASE, slo, row, recorder.tally)
    missed = ledger.total(name)
    return StepOutcome(
        load,
        sent_s,
        judged,
        recorder.stats.requests + missed,
        missed,
        row,
        recorder.tally,
        verdict,
        watched,
        recorder.vram_shed,
        cancelled,
    )
