"""Composition root: builds every part from the Config, owns the tasks, signals and shutdown order.

Shutdown order: stop arrivals -> drain in-flight requests (deadline) -> close targets
-> flush and close the journal -> write the summary -> stop the child servers -> close
HTTP last, so a final scrape still sees the totals. Each close is on one AsyncExitStack:
one that fails skips none of the others. A run dir holding an unfinished journal is
resumed (same run id, the plan clock and the counters continue): docs/journal.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from soakd import __version__
from soakd.analysis import SessionRow
from soakd.config import Config, ConfigError, TargetConfig
from soakd.gateway.fronts import Fronts
from soakd.goodput import GoodputWindow
from soakd.http import HttpServer, start_exporter
from soakd.journal import (
    JOURNAL_FILE,
    Journal,
    RunInfo,
    config_doc,
    open_journal,
    plan_doc,
    read_resume_state,
    records,
    rollup_window_ns,
)
from soakd.logs import close_logging, flush_repeats, set_phase, setup_logging
from soakd.metrics import GuardMetrics, JournalMetrics, Metrics, ProbeMetrics
from soakd.model import Phase, Plan, SpendCap
from soakd.notes import Notes
from soakd.probes import Probes, make_probes
from soakd.probes.gateways import GatewayExport, export_gateways
from soakd.rundir import new_run_id, prepare_dir, raise_fd_limit, write_summary
from soakd.session import RunOptions, RunResult, StartError, StoppedBeforeStart, _close_all
from soakd.sim.spawn import SimProcess, spawn_sim
from soakd.stats import RunStats
from soakd.status import progress_fields, vram_status
from soakd.targets.preflight import Preflight, preflight
from soakd.targets.tokenize import open_tokenizer
from soakd.types import Target
from soakd.workers.senders import NoReuse, Senders, WorkerStartError, open_senders, senders_for
from soakd.workload.calibration import LocalTokenizer, TokenCounter, TokenizeError
from soakd.workload.guard import Guards, TargetGuard
from soakd.workload.ledger import SendLedger
from soakd.workload.plan import build_plan
from soakd.workload.prompts import PromptSource, make_prompt_source
from soakd.workload.runner import Runner
from soakd.workload.sizing import (
    TOKENIZE_TIMEOUT_S,
    PromptLengths,
    StartMeasure,
    log_start,
    measure_at_start,
    stored,
)

__all__ = ["RunOptions", "RunResult", "Soak", "StartError", "StoppedBeforeStart"]

log = structlog.get_logger()

TICK_S = 1.0
STALL_S = 30.0  # /healthz says 503 when the run loop has not ticked for this long
PROGRESS_LOG_S = 10.0


class Soak:
    """One run: the parts, wired. ``run()`` does it all; tests may drive the parts."""

    def __init__(self, cfg: Config, opts: RunOptions) -> None:
        self.cfg = cfg
        self.opts = opts
        # an unfinished journal in the run dir: resume it (JournalError when it cannot be)
        self.resume = read_resume_state(opts.run_dir / JOURNAL_FILE) if opts.run_dir else None
        self.run_id = self.resume.run_id if self.resume else new_run_id(cfg.run.name)
        self.run_dir = opts.run_dir or Path("runs") / self.run_id
        stored = self.resume.options if self.resume else {}
        self.plan_options = {  # a resume keeps the first session's flags unless given again
            "rehearse_s": opts.rehearse_s
            if opts.rehearse_s is not None
            else stored.get("rehearse_s"),
            "duration_s": opts.duration_s
            if opts.duration_s is not None
            else stored.get("duration_s"),
        }
        self.plan_start = self.resume.plan_start if self.resume else datetime.now(UTC)
        self.plan: Plan = build_plan(
            cfg,
            self.plan_start,
            rehearse_s=self.plan_options["rehearse_s"],
            duration_cap_s=self.plan_options["duration_s"],
        )
        self.config_changes = (
            self.resume.check(cfg, self.plan, force=opts.force) if self.resume else []
        )
        self.journal: Journal | None = None
        self.metrics = Metrics()
        self.probe_metrics = ProbeMetrics(self.metrics.registry)
        self.probes: Probes | None = None
        self.names = [t.name for t in cfg.targets]
        self.stats = RunStats(self.names)
        self.goodput = GoodputWindow({name: cfg.slo_for(name) for name in self.names})
        self.notes = Notes()  # usage not taken or off the stream, unreadable Retry-After
        self.targets: dict[str, Target] = {}
        self.senders = Senders()  # the targets' clients, here or in worker processes
        # statuses after which a target's server closes its connections unannounced
        self.no_reuse = NoReuse(self._no_reuse_changed)
        self.runner: Runner | None = None
        self.http: HttpServer | None = None
        self._signals = 0
        self._sims: list[SimProcess] = []
        self.fronts = Fronts(cfg.phases, self.run_dir)  # the gateways soakd starts
        self.guard_metrics = GuardMetrics(self.metrics.registry)
        self.guards = Guards(())
        self.ledger = SendLedger()
        self._force = asyncio.Event()
        self._starting: asyncio.Future[None] | None = None
        self.gateway_export: GatewayExport | None = None
        self._status: dict[str, Any] | None = None  # /status, refreshed by the ticker
        self._last_tick: float | None = None
        self._started = time.monotonic()  # this session's clock, from the journal's opening
        self._elapsed = 0.0
        self._cancelled = 0  # requests cut at the drain deadline
        self._completed = False
        self._summary: dict[str, SessionRow] = {}
        self._cfgs: list[TargetConfig] = []  # the targets as the clients see them
        self._urls: dict[str, str] = {}  # the servers the probes watch (not a gateway)
        self._preflight: list[Preflight] = []
        # what the live view marks as breached: each target's limits (its overrides applied)
        self._live_slo = {
            name: cfg.slo_for(name).model_dump(exclude_none=True) for name in self.names
        }
        # prompts in the target's tokens (soakd/workload/sizing.py): a bad file fails here
        tok = cfg.workload.tokenizer
        self._tokenizer = LocalTokenizer(tok) if tok and cfg.workload.calibrate == "auto" else None
        self.prompt_lengths: PromptLengths | None = None

    # --- status ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        runner = self.runner
        elapsed = runner.offset_ns() / 1e9 if runner else 0.0
        total = self.plan.duration_ns / 1e9
        phase = runner.phase if runner else None
        return {
            "run_id": self.run_id,
            "version": __version__,
            "node": self.cfg.run.node,
            "site": self.cfg.run.site,
            "phase": phase.name if phase else None,
            "phase_index": phase.index if phase else None,
            "phases": len(self.plan.phases),
            "elapsed_s": round(elapsed, 3),
            "remaining_s": round(max(0.0, total - elapsed), 3),
            "plan_scale": self.plan.scale,
            "stopping": bool(runner and runner.stopping),
            "in_flight": dict(runner.in_flight) if runner else {},
            "workers": self.senders.status(),
            "missed": self.ledger.by_target(session=True),
            "failing": {
                name: f for name, g in self.guards.by_target.items() if (f := g.failing_now())
            },
            "no_reuse": self.no_reuse.status(),
            "vram": vram_status(
                self.probes.gpu if self.probes is not None else None, self.cfg, self.names
            ),
            "lag_limit_s": self.cfg.alert_limits.dispatch_lag,
            "drain_timeout_s": self.cfg.run.drain_timeout,
            "slo": self._live_slo,
            "metrics_url": self.http.url if self.http else None,
            "targets": {
                name: row | self.goodput.row(name) | {"notes": self.notes.row(name)}
                for name, row in self.stats.recent().items()
            },
            "prompt_tokens": self.prompt_lengths.status() if self.prompt_lengths else None,
        }

    def _status_snapshot(self) -> dict[str, Any]:
        """/status, as the run loop last computed it (read on the exporter's thread)."""
        return self._status or {}

    def _alive(self) -> str | None:
        """None while the run loop turns; else why /healthz should say 503."""
        if self._last_tick is None:
            return None  # starting: the run loop is busy opening things, not stuck
        stalled = time.monotonic() - self._last_tick
        if stalled > STALL_S:
            return f"run loop stalled for {stalled:.0f} s"
        return None

    def _ready(self) -> bool:
        return self.runner is not None and self.runner.origin_ns > 0 and not self.runner.stopping

    # --- the run --------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """The whole run. Every resource is closed on one exit stack, each close after the
        ones opened later, and each even when another failed: the clients, then the
        journal's final flush and the summary, then the child servers (once the run is
        recorded: a simulator with thousands of connections can take seconds to go), then
        the exporter (a final scrape still sees the totals), then the log.

        A start that ends before the journal opens (a preflight problem, a child that did
        not start, a signal) recorded nothing: a run directory it made is removed again."""
        raise_fd_limit(self.plan)
        made = not self.run_dir.exists()
        prepare_dir(self.run_dir, self.cfg, self.plan)
        try:
            return await self._run()
        except BaseException:
            if made and self.journal is None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    async def _run(self) -> RunResult:
        setup_logging(
            self.cfg.logging.level,
            self.cfg.logging.format,
            log_file=self.run_dir / "soakd.log",
            console=self.opts.console_logs,
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(close_logging)
            structlog.contextvars.bind_contextvars(run_id=self.run_id)
            log.info(
                "run_starting",
                version=__version__,
                run_dir=str(self.run_dir),
                targets=self.names,
                phases=len(self.plan.phases),
                plan_s=self.plan.duration_ns / 1e9,
            )
            self._setup_metrics()
            # the exporter binds first: a busy address must fail before a journal exists
            # (or the next try in this directory would "resume" a run that never ran)
            self._status = self.status()  # /status answers in full from the first moment
            # signals from here on: one during the start-up (a simulator, a gateway, the
            # preflight, the journal, a slow target) stops the run before it sends
            self._install_signals()
            stack.callback(self._stop_listening)
            self.http = await self._start_http()
            stack.push_async_callback(self.http.aclose)
            log.info("exporter_listening", url=self.http.url)
            stack.push_async_callback(self._close_children)
            # the servers soakd starts, then the preflight, before the journal: a start
            # that ends here leaves no run behind to "resume"
            if not await self._start(self._start_children()):
                raise StoppedBeforeStart
            self.journal = journal = await self._open_journal()
            for r in self._preflight:
                journal.event(
                    records.Preflight(r.target, r.ok, r.line, r.seconds, r.unreached, r.warning)
                )
            self._started = time.monotonic()
            stack.push_async_callback(self._finish)
            self.ledger = SendLedger(
                journal.restored.missed if self.resume and journal.restored else None,
                on_miss=self.metrics.missed,
            )
            for key, n in self.ledger.counts.items():
                self.metrics.missed(*key, n)  # continue the counter
            stack.push_async_callback(self._close_clients)
            if await self._start(self._start_parts()):
                self._status = self.status()
                gc.freeze()  # what start-up made lives all run: full collections skip it
                stack.callback(gc.unfreeze)  # back in sight for a caller's later runs
            if self.runner is not None and self.probes is not None:
                await self._run_parts()
        return RunResult(
            self.run_id,
            self.run_dir,
            self._completed,
            self._elapsed,
            self._cancelled,
            self._summary,
            session=journal.session,
            journal_unwritten=journal.unwritten,
        )

    async def _start(self, step: Coroutine[Any, Any, None]) -> bool:
        """A start-up step a signal may cut short (``_on_signal`` cancels it): False when
        one did."""
        self._starting = asyncio.ensure_future(step)
        if self._signals:  # stopped while the exporter or the journal opened
            self._starting.cancel()
        try:
            await self._starting
        except asyncio.CancelledError:
            if not self._signals:
                raise
            log.warning("stopped_before_start")
            return False
        return True

    async def _run_parts(self) -> None:
        assert self.runner is not None
        assert self.probes is not None
        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(self._tick())
            probing = tg.create_task(self.probes.run())
            gateways = (
                tg.create_task(self.gateway_export.run())
                if self.gateway_export is not None
                else None
            )
            await self.runner.run(self.resume.offset_ns if self.resume else 0)
            self._cancelled = await self._drain()
            ticker.cancel()
            probing.cancel()
            if gateways is not None:
                gateways.cancel()
                await self._final_gateway_read()

    def _stop_listening(self) -> None:
        self._remove_signals()
        self.fronts.cancel_switches()

    async def _close_clients(self) -> None:
        await _close_all(
            "client",
            [self.senders.aclose()] + ([self.probes.aclose()] if self.probes is not None else []),
        )

    async def _close_children(self) -> None:
        await _close_all("child", self.fronts.closes() + [sim.aclose() for sim in self._sims])

    async def _finish(self) -> None:
        """The journal's final flush and the summary: what this session did."""
        assert self.journal is not None
        self._elapsed = elapsed = time.monotonic() - self._started
        active = self.runner.active_s() if self.runner is not None else 0.0
        self._completed = completed = bool(self.runner and self.runner.finished)
        await self.journal.aclose(completed=completed)  # RunStats has the last folds then
        summary = self.stats.overall(active, self.ledger.by_target(session=True))
        for name, row in summary.items():  # this session's goodput (the report: the run's)
            tally = self.goodput.total[name]
            row["goodput"] = tally.goodput
            row["goodput_rps"] = tally.good / active if active > 0 else 0.0
        self._summary = summary
        write_summary(
            self.run_dir,
            {
                "run_id": self.run_id,
                "version": __version__,
                "node": self.cfg.run.node,
                "site": self.cfg.run.site,
                "completed": completed,
                "elapsed_s": round(elapsed, 3),
                "active_s": round(active, 3),
                "rate_basis": "active plan time (active_s): rates count the time soakd was "
                "sending, not start-up or the drain",
                "cancelled": self._cancelled,
                "targets": summary,
            },
        )
        log.info(
            "run_finished",
            completed=completed,
            elapsed_s=round(elapsed, 3),
            cancelled=self._cancelled,
            requests={k: v["requests"] for k, v in summary.items()},
            errors={k: v["errors"] for k, v in summary.items()},
        )

    async def _final_gateway_read(self) -> None:
        """The gateways' final counts into the journal (they are still up: closed later)."""
        if self.gateway_export is None:
            return
        try:
            await asyncio.wait_for(self.gateway_export.read_all(), 5.0)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            log.warning("gateway_final_read_failed", error=type(exc).__name__)

    async def _start_children(self) -> None:
        """The simulators and gateways soakd starts, then the preflight of every target's
        server (the simulator's, the one behind a gateway: docs/architecture.md)."""
        servers: list[TargetConfig] = []
        for tcfg in self.cfg.targets:
            if tcfg.simulator:
                try:
                    sim = await spawn_sim(
                        tcfg.simulator, tcfg.model, self.run_dir / f"sim-{tcfg.name}.log"
                    )
                except RuntimeError as exc:
                    raise StartError(f"targets[{tcfg.name}].simulator", exc) from None
                self._sims.append(sim)
                tcfg = tcfg.model_copy(update={"base_url": sim.base_url})
            servers.append(tcfg)  # probes and the preflight ask the server, not a gateway
            if tcfg.gateway is not None:
                try:
                    tcfg = await self.fronts.front(tcfg)
                except RuntimeError as exc:
                    raise StartError(f"targets[{tcfg.name}].gateway", exc) from None
            self._cfgs.append(tcfg)
        self._urls = {t.name: t.base_url for t in servers}
        if self.opts.preflight:
            await self._run_preflight(servers)

    async def _run_preflight(self, servers: list[TargetConfig]) -> None:
        """Ask each server once; a problem ends the start (ConfigError: one line a target,
        exit 2). Warnings go on: the server's own trouble, a target meant to fail, and on a
        resume one that does not answer yet (a reboot: the run pauses it until it does)."""
        self._preflight = await preflight(servers)
        problems = []
        for r, tcfg in zip(self._preflight, servers, strict=True):
            if r.ok and not r.warning:
                log.info("preflight_ok", target=r.target, seconds=round(r.seconds, 3))
            elif r.ok or tcfg.expect_failure or (r.unreached and self.resume is not None):
                log.warning("preflight_warning", target=r.target, problem=r.line)
                if not self.opts.console_logs:  # the live view: the log is in soakd.log
                    print(f"soakd: warning: {r.line}", file=sys.stderr)
            else:
                problems.append(r.line)
        if problems:
            raise ConfigError.of(problems)

    async def _start_parts(self) -> None:
        """Guards, target clients, probes, then the runner."""
        assert self.journal is not None
        cfgs = self._cfgs  # as the clients see them (a simulator's, a gateway's URL)
        for tcfg in cfgs:
            self._add_guard(tcfg)
        n, why = senders_for(self.cfg.run.workers, self.plan, self.cfg.workload.max_tokens)
        log.info("senders", processes=n, why=why)  # how many send, and why (auto: the plan)
        try:
            self.senders = await open_senders(
                n,
                cfgs,
                run_id=self.run_id,
                run_dir=self.run_dir,
                registry=self.metrics.registry,
                no_reuse=self.no_reuse,
            )
        except WorkerStartError as exc:
            raise StartError("run.workers", exc) from None
        self.targets = self.senders.targets
        self.probes = make_probes(self.cfg, self.probe_metrics, self._urls, self.journal.sample)
        # the gateways soakd started, on soakd's own /metrics (their ports are random)
        self.gateway_export = export_gateways(
            {t: g.url for t, g in self.fronts.gateways.items()},
            self.cfg.probes.scrape_interval,
            self.metrics.registry,
            self.journal.sample,
        )
        lengths = self.prompt_lengths = await self._size_prompts(self._urls)
        self.runner = runner = Runner(
            self.plan,
            self.targets,
            lengths.prompts,
            # the journal folds each outcome once and hands the folds on to Metrics and
            # RunStats once committed: Prometheus never counts a request the journal
            # could lose (docs/journal.md)
            [self.journal, self.goodput, self.probes.outcome_sink, self.notes, lengths],
            guards=self.guards,  # each outcome's 429 or spend reaches the gates first
            max_tokens=self.cfg.workload.max_tokens,
            temperature=self.cfg.workload.temperature,
            seed=self.cfg.workload.seed,
            on_phase=self._on_phase,
            start_seq=self.resume.next_seq if self.resume else None,
            gates=self.senders.gates(self.guards.by_target),
            ledger=self.ledger,
            lead_ns=self.senders.lead_ns,
        )
        lengths.next_seq = lambda: max(runner.next_seq.values(), default=0)
        self.journal.attach(self.runner)
        self.metrics.watch_in_flight(self.runner.in_flight)

    async def _size_prompts(self, urls: dict[str, str]) -> PromptLengths:
        """The prompts, sized in the reference's tokens: measured now (``urls``: each
        target's server), or as the run measured them before a resume; and the sink that
        checks them against the first answers and tallies planned against served."""
        assert self.journal is not None
        journal = self.journal
        wl = self.cfg.workload
        # a run an older soakd started (no workload.calibrate stored) goes on as it ran
        first = self.resume.config.get("workload", {}) if self.resume else {"calibrate": "auto"}
        auto = wl.calibrate == "auto" and first.get("calibrate") == "auto"
        try:
            done = stored(self.resume.calibrations if self.resume else [])
        except ValueError as exc:
            raise StartError("workload.calibrate", exc) from None
        prompts: PromptSource = make_prompt_source(wl, done.calibrations)
        reference = done.reference
        measure: StartMeasure | None = None
        if done.measured:
            log.info(
                "prompt_calibration_reused",
                calibrations=[c.describe() for c in done.calibrations] or None,
            )
        elif auto:
            measure = await self._measure_prompts(urls, prompts)
            log_start(measure, self.names)
            journal.event(records.PromptCalibration(measure.doc()))
            cal = measure.calibration
            reference = cal.reference if cal is not None and cal.source == "tokenize" else None
        lengths = PromptLengths(
            prompts,
            self.names,
            checks=done.checks_left if auto else 0,
            reference=reference,
            on_calibration=lambda doc: journal.event(records.PromptCalibration(doc)),
        )
        if measure is not None:
            lengths.started(measure)
        return lengths

    async def _measure_prompts(self, urls: dict[str, str], prompts: PromptSource) -> StartMeasure:
        """Ask each target's /tokenize (its server's, not a gateway's) and the local
        tokenizer: sizing.measure_at_start."""
        t0 = time.monotonic()
        servers: dict[str, TokenCounter] = {}
        failed: dict[str, str] = {}
        closes = []
        try:
            for tcfg in self.cfg.targets:
                try:
                    server = await open_tokenizer(tcfg, urls[tcfg.name], TOKENIZE_TIMEOUT_S)
                except (TokenizeError, ValueError) as exc:
                    failed[tcfg.name] = str(exc)
                else:
                    servers[tcfg.name] = server
                    closes.append(server.aclose)
            measure = await measure_at_start(prompts, servers, local=self._tokenizer, failed=failed)
            measure.seconds = time.monotonic() - t0  # the clients' set-up included
            return measure
        finally:
            await _close_all("tokenizer", [close() for close in closes])

    async def _drain(self) -> int:
        assert self.runner is not None
        deadline = self.cfg.run.drain_timeout
        if self.runner.stopping:
            log.info("draining", in_flight=sum(self.runner.in_flight.values()), deadline_s=deadline)
        drain = asyncio.ensure_future(self.runner.drain(deadline))
        force = asyncio.ensure_future(self._force.wait())
        await asyncio.wait({drain, force}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():  # a second signal: cut the wait short
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
            return await self.runner.drain(0)
        force.cancel()
        return drain.result()

    # --- parts ----------------------------------------------------------------------------

    def _setup_metrics(self) -> None:
        m = self.metrics
        m.build_info.info(
            {
                "version": __version__,
                "run_id": self.run_id,
                "node": self.cfg.run.node,
                "site": self.cfg.run.site or "",
            }
        )
        m.set_limits(self.cfg.slo, self.cfg.alert_limits)
        phases = sorted({p.name for p in self.plan.phases})
        m.add_phases(phases)
        for name in self.names:
            m.add_target(name, phases)
        m.trace_exemplars(self.run_id, self.cfg.targets)  # those sending a traceparent
        m.watch_goodput(self.goodput.ratio, self.goodput.rate)
        m.run_start.set(self.resume.created_wall if self.resume else time.time())
        m.phase_index.set(-1)

    async def _open_journal(self) -> Journal:
        """Open or continue the run's journal; a resume restores the counters from it."""
        jm = JournalMetrics(self.metrics.registry)
        run = RunInfo(
            self.run_id,
            config_doc(self.cfg),
            plan_doc(self.plan),
            self.plan_start,
            self.plan_options,
            rollup_window_ns(self.plan),
        )
        journal = await open_journal(
            self.run_dir,
            run,
            self.cfg.journal,
            metrics=jm,
            forward=(self.metrics, self.stats),  # each batch's fold, once committed
            resume=self.resume,
        )
        restored = journal.restored
        if self.resume is not None and restored is not None:
            missing = self.metrics.restore(restored.totals, restored.histograms)
            self.metrics.restore_notes(restored.notes)
            self.notes.restore(restored.notes)
            if self.config_changes:
                journal.event(records.ConfigChanged(tuple(self.config_changes)))
            loss = self.resume.loss
            if loss is not None:  # said, and kept: the next session's mark will not know
                journal.event(
                    records.JournalLoss(
                        loss.rows, loss.requests, loss.offset_ns, loss.held_offset_ns
                    )
                )
                log.error("journal_loss", **asdict(loss), note=loss.describe())
            log.warning(
                "run_resumed",
                session=journal.session,
                plan_offset_s=round(self.resume.offset_ns / 1e9, 3),
                down_since=datetime.fromtimestamp(self.resume.last_wall, UTC).isoformat(
                    timespec="seconds"
                ),
                config_changes=self.config_changes or None,
                not_restored=missing or None,
            )
        return journal

    async def _start_http(self) -> HttpServer:
        return await start_exporter(
            self.cfg.exporter,
            self.opts.metrics_addr,
            self.metrics.registry,
            self._status_snapshot,
            self._ready,
            alive=self._alive,
        )

    def _on_phase(self, phase: Phase | None) -> None:
        set_phase(phase.name if phase else None)
        self.metrics.show_phase(self.plan, self.names, phase)
        if phase is not None:
            if self.journal is not None:
                self.journal.event(records.Phase(phase.name, phase.index))
            self.fronts.enter(phase.name, self.journal.event if self.journal else None)

    def _no_reuse_changed(self, target: str, status: int, closes: bool) -> None:
        """A target's server closes (or keeps again) its connections after answers with
        ``status``, unannounced (soakd/targets/pool.py): logged, exported, journaled."""
        if closes:
            log.warning(
                "server_closes_after_answers",
                target=target,
                status=status,
                note="no Connection: close was said; soakd opens a new connection for each "
                "request after such an answer",
            )
        else:
            log.info("server_keeps_connections_again", target=target, status=status)
        self.metrics.no_reuse.labels(target, str(status)).set(int(closes))
        if self.journal is not None:
            self.journal.event(records.NoReuse(target, status, closes))

    # --- cloud targets (docs/gateway.md) ---------------------------------------------------

    def _add_guard(self, tcfg: TargetConfig) -> None:
        if tcfg.api_key_env:
            key_ref = f"api_key_env {tcfg.api_key_env}"
        elif tcfg.api_key_file:
            key_ref = f"api_key_file {tcfg.api_key_file}"
        else:
            key_ref = ""
        spend = tcfg.spend
        limits = {cap: spend.limit(cap) for cap in SpendCap}
        guard = TargetGuard(
            tcfg.name,
            spend,
            tcfg.rate_limit,
            key_ref=key_ref,
            failing=tcfg.failing,
            on_event=self.journal.event if self.journal is not None else None,
        )
        guard.report_to(self.guard_metrics.add_target(tcfg.name, limits, guard.used))
        self.guards.by_target[tcfg.name] = guard

    def _update_gauges(self) -> None:
        runner = self.runner
        if runner is None or not runner.origin_ns:
            return
        offset = runner.offset_ns()
        self.metrics.elapsed.set(offset / 1e9)
        self.metrics.remaining.set(max(0, self.plan.duration_ns - offset) / 1e9)
        phase = runner.phase
        if phase is None:
            return
        for name in self.names:
            shape = phase.loads.get(name)
            rate = shape.rate_at(offset - phase.start_ns, phase.duration_ns) if shape else 0.0
            self.metrics.offered_rate.labels(name).set(rate)

    async def _tick(self) -> None:
        live: Any = None
        if self.opts.live:
            from rich.console import Console
            from rich.live import Live

            from soakd.live import live_panel

            console = Console(file=sys.stdout)
            live = Live(console=console, refresh_per_second=2, transient=True)
            live.start()
        last_progress = time.monotonic()
        due = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                self.metrics.loop_delay.set(max(0.0, now - due))  # how late this tick woke
                self._last_tick = now
                self.metrics.loop_tasks.set(len(asyncio.all_tasks()))
                flush_repeats()  # the log's summaries of repeated lines whose window closed
                self._update_gauges()
                st = self._status = self.status()
                if live is not None:
                    live.update(live_panel(st, console.width))
                elif now - last_progress >= PROGRESS_LOG_S:
                    last_progress = now
                    log.info(
                        "progress",
                        elapsed_s=st["elapsed_s"],
                        remaining_s=st["remaining_s"],
                        targets=progress_fields(st["targets"]),
                    )
                due = time.monotonic() + TICK_S
                await asyncio.sleep(TICK_S)
        finally:
            self._update_gauges()
            if live is not None:
                live.stop()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _remove_signals(self) -> None:
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning(
                "stop_requested",
                signal=sig.name,
                hint="draining in-flight requests; signal again to stop now",
            )
            if self.runner is not None:
                self.runner.stop()
            elif self._starting is not None:
                self._starting.cancel()  # still starting: stop before the first send
        else:
            log.warning("stop_forced", signal=sig.name)
            self._force.set()
