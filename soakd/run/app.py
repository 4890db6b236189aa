"""Composition root: runs the parts ``soakd/run/assemble.py`` builds; owns the tasks, signals
and shutdown order.

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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import structlog

from soakd import __version__
from soakd.config import Config
from soakd.http import Board, HttpServer, start_exporter
from soakd.journal import Journal, ResumeState, records
from soakd.logs import close_logging, flush_repeats, set_phase, setup_logging
from soakd.measure.analysis import SessionRow
from soakd.metrics.run import Metrics
from soakd.model import Phase
from soakd.probes import Probes
from soakd.run.assemble import (
    Close,
    Hooks,
    Parts,
    Setup,
    assemble,
    close_clients,
    start_journal,
    start_ledger,
    start_servers,
)
from soakd.run.rundir import prepare_dir, raise_fd_limit, write_summary
from soakd.run.session import RunOptions, RunResult, StartError, StoppedBeforeStart, _close_all
from soakd.run.stats import RunStats
from soakd.run.status import RunState, Status, progress_fields, status_now
from soakd.shapes import Sweep
from soakd.sim.spawn import SimProcess
from soakd.types import Target
from soakd.workers.senders import Senders
from soakd.workload.ledger import SendLedger
from soakd.workload.runner import Runner
from soakd.workload.sizing import PromptLengths

if TYPE_CHECKING:
    from rich.live import Live

__all__ = ["RunOptions", "RunResult", "Soak", "StartError", "StoppedBeforeStart"]

log = structlog.get_logger()

TICK_S = 1.0
PROGRESS_LOG_S = 10.0

T = TypeVar("T")


class Soak:
    """One run: ``Setup`` at once, then ``run()`` starts the servers, opens the journal,
    assembles the ``Parts`` and runs them. ``http`` and ``parts`` are None until they
    exist: what the signal handler and tests read meanwhile. The exporter's thread reads
    only ``board``: the ``RunState`` the run loop last published (``_publish``)."""

    def __init__(self, cfg: Config, opts: RunOptions) -> None:
        self.setup = Setup.open(cfg, opts)
        self.http: HttpServer | None = None
        self.parts: Parts | None = None
        self._sims: list[SimProcess] = []  # the simulators started so far, to close
        self._recorded = False  # the journal opened: the run dir is a run's now
        self._signals = 0
        self._force = asyncio.Event()
        self._starting: asyncio.Future[Any] | None = None
        self._last_tick: float | None = None  # the run loop's last tick (time.monotonic())
        self._started = time.monotonic()  # this session's clock, from the journal's opening
        self._elapsed = 0.0
        self._cancelled = 0  # requests cut at the drain deadline
        self._completed = False
        self._summary: dict[str, SessionRow] = {}
        self._urls: dict[str, str] = {}  # each target's server (mode: sweep phases)
        self._sweeps: set[asyncio.Task[None]] = set()  # mode: sweep phases running
        # what the exporter's thread reads: the state the run loop last published
        self.board = Board(RunState(self.status(), ready=False, ticked=None))

    # --- what observers read (tests, the CLI) -----------------------------------------------

    @property
    def cfg(self) -> Config:
        return self.setup.cfg

    @property
    def resume(self) -> ResumeState | None:
        return self.setup.resume

    @property
    def run_id(self) -> str:
        return self.setup.run_id

    @property
    def run_dir(self) -> Path:
        return self.setup.run_dir

    @property
    def metrics(self) -> Metrics:
        return self.setup.metrics

    @property
    def stats(self) -> RunStats:
        return self.setup.stats

    @property
    def runner(self) -> Runner | None:
        return self.parts.runner if self.parts is not None else None

    @property
    def probes(self) -> Probes | None:
        return self.parts.probes if self.parts is not None else None

    @property
    def prompt_lengths(self) -> PromptLengths | None:
        return self.parts.lengths if self.parts is not None else None

    @property
    def targets(self) -> dict[str, Target]:
        return self.parts.targets if self.parts is not None else {}

    @property
    def senders(self) -> Senders | None:
        return self.parts.senders if self.parts is not None else None

    @property
    def ledger(self) -> SendLedger | None:
        return self.parts.ledger if self.parts is not None else None

    # --- what the run publishes ------------------------------------------------------------

    def status(self) -> Status:
        """/status now (the live view's and the progress log's too)."""
        return status_now(self.setup, self.parts, self.http.url if self.http else None)

    def _publish(self) -> RunState:
        """The run's state now, published: one frozen ``RunState`` on the board, all that
        the exporter's thread reads of the run (/status, /readyz, /healthz), and the
        gauges of the same moment (in flight, goodput, spend used), set here on the loop.
        Once a tick, and at a stop; nothing reads the run's objects from another thread."""
        self._update_gauges()
        status = self.status()
        runner = self.runner
        ready = runner is not None and runner.origin_ns > 0 and not runner.stopping
        state = RunState(status, ready, self._last_tick)
        self.metrics.show(
            status.in_flight,
            {name: (r["goodput"], r["goodput_rps"]) for name, r in status.targets.items()},
        )
        if self.parts is not None:
            guards = self.parts.guards.by_target
            self.setup.guard_metrics.show_used({name: g.used() for name, g in guards.items()})
        self.board.publish(state)
        return state

    # --- the run --------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """The whole run. Every resource is closed on one exit stack, each close after the
        ones opened later, and each even when another failed: the clients, then the
        journal's final flush and the summary, then the child servers (once the run is
        recorded: a simulator with thousands of connections can take seconds to go), then
        the exporter (a final scrape still sees the totals), then the log.

        A start that ends before the journal opens (a preflight problem, a child that did
        not start, a signal) recorded nothing: a run directory it made is removed again."""
        s = self.setup
        raise_fd_limit(s.plan)
        made = not s.run_dir.exists()
        prepare_dir(s.run_dir, s.cfg, s.plan)
        try:
            return await self._run()
        except BaseException:
            if made and not self._recorded:
                shutil.rmtree(s.run_dir, ignore_errors=True)
            raise

    async def _run(self) -> RunResult:
        s = self.setup
        setup_logging(
            s.cfg.logging.level,
            s.cfg.logging.format,
            log_file=s.run_dir / "soakd.log",
            console=s.opts.console_logs,
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(close_logging)
            structlog.contextvars.bind_contextvars(run_id=s.run_id)
            log.info(
                "run_starting",
                version=__version__,
                run_dir=str(s.run_dir),
                targets=s.names,
                phases=len(s.plan.phases),
                plan_s=s.plan.duration_ns / 1e9,
            )
            # the exporter binds first: a busy address must fail before a journal exists
            # (or the next try in this directory would "resume" a run that never ran)
            await self._listen(stack)
            stack.push_async_callback(self._close_children)
            # the servers soakd starts, then the preflight, before the journal: a start
            # that ends here leaves no run behind to "resume"
            servers = await self._start(start_servers(s, self._sims))
            if servers is None:
                raise StoppedBeforeStart
            self._urls = servers.urls
            journal = await start_journal(s, servers)
            self._recorded = True
            self._started = time.monotonic()
            ledger = start_ledger(s, journal)
            s.metrics.continued.release()  # at the journal's totals: scrapes see them now
            stack.push_async_callback(self._finish, journal, ledger)
            closes: list[Close] = []
            stack.push_async_callback(close_clients, closes)
            hooks = Hooks(partial(self._on_phase, journal), partial(self._no_reuse, journal))
            parts = await self._start(assemble(s, servers, journal, ledger, hooks, closes))
            if parts is not None:
                self.parts = parts
                self._publish()
                gc.freeze()  # what start-up made lives all run: full collections skip it
                stack.callback(gc.unfreeze)  # back in sight for a caller's later runs
                await self._run_parts(parts)
        return RunResult(
            s.run_id,
            s.run_dir,
            self._completed,
            self._elapsed,
            self._cancelled,
            self._summary,
            session=journal.session,
            journal_unwritten=journal.unwritten,
        )

    async def _listen(self, stack: contextlib.AsyncExitStack) -> None:
        """The signal handlers and the exporter, each undone on ``stack``."""
        self._publish()  # /status answers in full from the first moment
        # signals from here on: one during the start-up (a simulator, a gateway, the
        # preflight, the journal, a slow target) stops the run before it sends
        self._install_signals()
        stack.callback(self._stop_listening)
        self.http = http = await self._start_http()
        stack.push_async_callback(http.aclose)
        log.info("exporter_listening", url=http.url)

    async def _start(self, step: Coroutine[Any, Any, T]) -> T | None:
        """A start-up step a signal may cut short (``_on_signal`` cancels it): None when
        one did."""
        starting: asyncio.Future[T] = asyncio.ensure_future(step)
        self._starting = starting
        if self._signals:  # stopped while the exporter or the journal opened
            starting.cancel()
        try:
            return await starting
        except asyncio.CancelledError:
            if not self._signals:
                raise
            log.warning("stopped_before_start")
            return None

    async def _run_parts(self, parts: Parts) -> None:
        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(self._tick())
            probing = tg.create_task(parts.probes.run())
            gateways = tg.create_task(parts.gateways.run())
            await parts.runner.run(self.setup.resume.offset_ns if self.setup.resume else 0)
            await self._end_sweeps(parts.runner.stopping)
            self._cancelled = await self._drain(parts.runner)
            ticker.cancel()
            probing.cancel()
            gateways.cancel()
            await self._final_gateway_read(parts)

    def _stop_listening(self) -> None:
        self._remove_signals()
        self.setup.fronts.cancel_switches()

    async def _close_children(self) -> None:
        await _close_all("child", self.setup.fronts.closes() + [sim.aclose() for sim in self._sims])

    async def _finish(self, journal: Journal, ledger: SendLedger) -> None:
        """The journal's final flush and the summary: what this session did."""
        s = self.setup
        runner = self.runner
        self._elapsed = elapsed = time.monotonic() - self._started
        active = runner.active_s() if runner is not None else 0.0
        self._completed = completed = bool(runner and runner.finished)
        await journal.aclose(completed=completed)  # RunStats has the last folds then
        summary = s.stats.overall(active, ledger.by_target(session=True))
        for name, row in summary.items():  # this session's goodput (the report: the run's)
            tally = s.goodput.total[name]
            row["goodput"] = tally.goodput
            row["goodput_rps"] = tally.good / active if active > 0 else 0.0
        talks = runner.conversation_counts if runner is not None else {}
        for name, counted in talks.items():  # this session's conversations, by how they ended
            summary[name]["conversations"] = counted.doc()
        self._summary = summary
        write_summary(
            s.run_dir,
            {
                "run_id": s.run_id,
                "version": __version__,
                "node": s.cfg.run.node,
                "site": s.cfg.run.site,
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
            **({"conversations": {k: v.doc() for k, v in talks.items()}} if talks else {}),
        )

    async def _final_gateway_read(self, parts: Parts) -> None:
        """The gateways' final counts into the journal (they are still up: closed later)."""
        try:
            await asyncio.wait_for(parts.gateways.read_all(), 5.0)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            log.warning("gateway_final_read_failed", error=type(exc).__name__)

    async def _drain(self, runner: Runner) -> int:
        deadline = self.setup.cfg.run.drain_timeout
        if runner.stopping:
            log.info("draining", in_flight=sum(runner.in_flight.values()), deadline_s=deadline)
        drain = asyncio.ensure_future(runner.drain(deadline))
        force = asyncio.ensure_future(self._force.wait())
        await asyncio.wait({drain, force}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():  # a second signal: cut the wait short
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
            return await runner.drain(0)
        force.cancel()
        return drain.result()

    # --- parts ----------------------------------------------------------------------------

    async def _start_http(self) -> HttpServer:
        return await start_exporter(
            self.setup.cfg.exporter, self.setup.opts.metrics_addr, self.metrics.registry, self.board
        )

    def _on_phase(self, journal: Journal, phase: Phase | None) -> None:
        s = self.setup
        set_phase(phase.name if phase else None)
        s.metrics.show_phase(s.plan, s.names, phase)
        if phase is not None:
            journal.event(records.Phase(phase.name, phase.index))
            s.fronts.enter(phase.name, journal.event)
            self._sweep(phase)

    def _sweep(self, phase: Phase) -> None:
        """A ``mode: sweep`` phase: its targets' knees measured by the hook while the
        runner sends them nothing (docs/capacity.md), until the phase ends."""
        hook, runner, parts = self.setup.opts.on_sweep, self.runner, self.parts
        swept = {n for n, shape in phase.loads.items() if isinstance(shape, Sweep)}
        if hook is None or runner is None or parts is None or not swept:
            return
        left_s = (phase.end_ns - runner.offset_ns()) / 1e9
        targets = {n: t for n, t in parts.targets.items() if n in swept}
        end = time.monotonic() + left_s
        task = asyncio.ensure_future(hook(phase, targets, self._urls, end, self.run_dir))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _end_sweeps(self, stopped: bool) -> None:
        """The sweeps end with their phase; a stopped run cuts them."""
        for task in list(self._sweeps):
            if stopped:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:  # a sweep that failed costs the soak nothing
                    log.exception("capacity_sweep_failed")

    def _no_reuse(self, journal: Journal, target: str, status: int, closes: bool) -> None:
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
        self.setup.metrics.no_reuse.labels(target, str(status)).set(int(closes))
        journal.event(records.NoReuse(target, status, closes))

    def _update_gauges(self) -> None:
        runner, s = self.runner, self.setup
        if runner is None or not runner.origin_ns:
            return
        offset = runner.offset_ns()
        s.metrics.elapsed.set(offset / 1e9)
        s.metrics.remaining.set(max(0, s.plan.duration_ns - offset) / 1e9)
        phase = runner.phase
        if phase is None:
            return
        for name in s.names:
            shape = phase.loads.get(name)
            rate = shape.rate_at(offset - phase.start_ns, phase.duration_ns) if shape else 0.0
            s.metrics.offered_rate.labels(name).set(rate)

    async def _tick(self) -> None:
        live: Live | None = None
        if self.setup.opts.live:
            from rich.console import Console
            from rich.live import Live

            from soakd.run.live import live_panel

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
                st = self._publish().status
                if live is not None:
                    live.update(live_panel(st, console.width))
                elif now - last_progress >= PROGRESS_LOG_S:
                    last_progress = now
                    log.info(
                        "progress",
                        elapsed_s=st.elapsed_s,
                        remaining_s=st.remaining_s,
                        targets=progress_fields(st.targets),
                    )
                due = time.monotonic() + TICK_S
                await asyncio.sleep(TICK_S)
        finally:
            self._publish()  # the drained run: not ready, nothing in flight
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
                self._publish()  # /readyz and /status say so now, not at the next tick
            elif self._starting is not None:
                self._starting.cancel()  # still starting: stop before the first send
        else:
            log.warning("stop_forced", signal=sig.name)
            self._force.set()
