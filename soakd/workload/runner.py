"""Runner: drives the plan. Phases in order, one load driver per target, every outcome to the sinks.

Every outcome reaches every reader, the guards first (a 429's pause, a spend cap, are in
force before anything else reads the outcome), then the journal, then the sinks; one that
raises costs only itself: it is logged and counted, and the readers after it still get
the outcome. The journal (an ``OutcomeRecorder``) is the one reader of the whole
``Outcome``; the guards and the sinks read it as ``Finished`` (soakd/model.py): no ITL
gaps, which a sender worker's outcome carries in its record only.

One clock: ``time.perf_counter_ns`` (CLOCK_MONOTONIC, the clock asyncio sleeps on).
Phase boundaries and send times are absolute instants on it, so a wall-clock step
(NTP) moves nothing. A request belongs to the phase it was sent in; a phase ending
stops new sends, not the requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Final

import structlog

from soakd.model import ErrorKind, MissReason, Outcome, Phase, Plan, RequestSpec
from soakd.shapes import LoadShape, OpenLoad
from soakd.types import NotSent, OutcomeRecorder, OutcomeSink, SendGate, Target
from soakd.workload.arrivals import arrivals
from soakd.workload.conversations import Conversations, ConversationTally
from soakd.workload.failing import failing_cause
from soakd.workload.ledger import SendLedger
from soakd.workload.prompts import PromptSource
from soakd.workload.talks import Talks
from soakd.workload.timer import sleep_until_ns

log = structlog.get_logger()


DRIVERS_FINISH_S: Final = 2.0
"""At the plan's end, how long open-loop drivers may take to deal with the instants that
were already due (they skip a backlog older than max_lateness in one step)."""
CATCH_UP: Final = 64
"""Open loop: instants already due sent in one event-loop turn at most. A driver behind
its schedule catches up a few sends a turn instead of one (one a turn would let a busy
loop's turn length set the rate), and the loop is never held for more than these."""
SPAWN_BATCH: Final = 64
"""Closed-loop workers started per event-loop turn: a pool of thousands grows without
holding the loop (the exporter and the signal handlers keep answering)."""


class _Pool:
    """A target's closed-loop workers: how many run, how many the phase wants."""

    __slots__ = ("phase", "want", "workers")

    def __init__(self) -> None:
        self.phase: Phase | None = None
        self.want = 0
        self.workers = 0


now_ns = time.perf_counter_ns


class Runner:
    """Runs a Plan against targets. ``stop()`` ends sending; ``drain()`` waits for in-flight."""

    def __init__(
        self,
        plan: Plan,
        targets: dict[str, Target],
        prompts: PromptSource,
        sinks: Iterable[OutcomeSink],
        *,
        guards: OutcomeSink | None = None,
        journal: OutcomeRecorder | None = None,
        max_tokens: int,
        temperature: float,
        seed: int = 0,
        on_phase: Callable[[Phase | None], None] | None = None,
        seqs: dict[str, int] | None = None,
        gates: Mapping[str, SendGate] | None = None,
        ledger: SendLedger | None = None,
        lead_ns: int = 0,
        on_sink_failure: Callable[[str], None] | None = None,
        answers: Callable[[int], int | None] | None = None,
        conversations: Conversations | None = None,
        on_failure: str = "end",
        on_conversation: Callable[[str, str, str], None] | None = None,
        checks: Callable[[RequestSpec], RequestSpec] | None = None,
    ) -> None:
        self.plan = plan
        self.targets = targets
        self.prompts = prompts
        # (name, record): the guards first, the journal, then the sinks in the order given
        first = [r for r in (guards, journal) if r is not None]
        self._sinks = _named([*first, *sinks])
        self.sink_failures: dict[str, int] = {}  # outcomes a sink raised on, by sink
        self._on_sink_failure = on_sink_failure  # the exporter's counter
        self.max_tokens = max_tokens
        self._answers = answers  # seq -> planned answer length (None: max_tokens caps it)
        # a planned spec -> itself, or the check sent in its place (soakd/checks/mix.py)
        self._checks = checks
        self.temperature = temperature
        self.seed = seed
        self._on_phase = on_phase
        self.origin_ns = 0  # monotonic instant of plan offset 0
        self._start_offset_ns = 0  # plan offset this session started at (a resume: > 0)
        self._ended_ns = 0  # plan offset when sending ended (0: not yet)
        self.phase: Phase | None = None
        self.finished = False
        self._stop = asyncio.Event()
        self._stopped_at = 0.0  # monotonic s of the stop: the drain deadline counts from it
        self._stopped_ns = 0  # the instant sending stopped (0: not stopped)
        # the next prompt seq per target, counted on in place: ``seqs`` when given (a
        # resumed run's numbers continue; whoever gave it reads the same dict)
        self._seq = seqs if seqs is not None else {}
        for name in targets:
            self._seq.setdefault(name, 0)
        self._busy = dict.fromkeys(targets, 0)  # in flight per target, counted at the spawn
        self._gates = dict(gates or {})  # spend caps and Retry-After pauses, per target
        # conversations (the load unit when set): each target's numbered on their own, the
        # next number kept beside the target's next seq (the journal stores both)
        self._talks = (
            Talks(
                conversations,
                seqs=self._seq,
                busy=self._busy,
                gates=self._gates,
                one=self._one,
                sleep_until=self._sleep_until,
                stopping=lambda: self.stopping,
                max_tokens=max_tokens,
                temperature=temperature,
                on_failure=on_failure,
                on_event=on_conversation,
            )
            if conversations is not None
            else None
        )
        self._live = dict.fromkeys(targets, 0)  # conversations under way per target
        self.ledger = ledger if ledger is not None else SendLedger()  # sends not made
        self._pools = {name: _Pool() for name in targets}  # closed-loop workers
        self._drivers: set[asyncio.Task[None]] = set()  # open-loop dispatchers
        self._requests: set[asyncio.Task[Any]] = set()  # requests and closed-loop workers
        self.failures: dict[str, int] = {}  # tasks that died of an exception, per target
        # open loop: hand a request to its target this long before its instant (worker
        # processes send at the instant themselves); 0: at the instant. With a lead, the
        # driver wakes once per quarter of it and hands over every instant then within the
        # lead: a few wake-ups and frames per worker per 5 ms, not one per instant
        self._lead_ns = lead_ns
        self._slack_ns = lead_ns // 4

    # --- clock --------------------------------------------------------------------------

    def offset_ns(self) -> int:
        """Plan time elapsed (real ns since offset 0; resumes start past 0)."""
        return now_ns() - self.origin_ns if self.origin_ns else 0

    def active_s(self) -> float:
        """Plan time this session sent for: from its start (or resume point) to the end of
        sending, within the plan. The one basis of every rate soakd reports."""
        if not self.origin_ns:
            return 0.0
        end = self._ended_ns or self.offset_ns()
        return max(0, min(end, self.plan.duration_ns) - self._start_offset_ns) / 1e9

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def stopped_ns(self) -> int:
        """The monotonic instant sending stopped (0: it has not): every instant before it
        was sent or counted as not made, so a resume goes on from here (soakd/journal/
        progress.py)."""
        return self._stopped_ns

    @property
    def next_seq(self) -> dict[str, int]:
        """The next prompt seq per target (the journal stores it for a resume)."""
        return self._seq

    @property
    def under_way(self) -> dict[str, int]:
        """Open-loop conversations started and not ended, per target (the cap's count)."""
        return self._live

    @property
    def conversation_counts(self) -> dict[str, ConversationTally]:
        """Conversations started, finished, ended early, per target (none: single requests)."""
        return self._talks.counts if self._talks is not None else {}

    @property
    def missed(self) -> dict[tuple[str, str, str], int]:
        """Planned sends not made, whole run (the journal stores them)."""
        return self.ledger.counts

    @property
    def in_flight(self) -> dict[str, int]:
        """Requests sent and not finished, per target (copied into /status and the in-flight
        gauge when the run publishes: soakd/run/app.py)."""
        return self._busy

    # --- control ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop sending. In-flight requests go on; ``drain`` waits for them."""
        if not self._stop.is_set():
            self._stop.set()
            self._stopped_at = time.monotonic()
            self._stopped_ns = now_ns()
            for task in self._drivers:
                task.cancel()

    async def run(self, start_offset_ns: int = 0) -> None:
        """Run the plan from ``start_offset_ns`` (0, or where a resumed run stopped)."""
        self.origin_ns = now_ns() - start_offset_ns
        self._start_offset_ns = start_offset_ns
        for phase in self.plan.phases:
            if phase.end_ns <= start_offset_ns:
                continue
            if not await self._sleep_until(self.origin_ns + phase.start_ns):
                break
            self._enter(phase)
            for name, shape in phase.loads.items():
                self._start_load(name, shape, phase)
            if not await self._sleep_until(self.origin_ns + phase.end_ns):
                break
        self.finished = not self.stopping
        self._ended_ns = self.offset_ns()
        self._enter(None)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for in-flight requests, then cancel the rest.

        The deadline counts from the stop (a signal), not from when a busy loop got here.
        Returns how many had to be cancelled (they are recorded as ``cancelled``)."""
        if not self.stopping and self._drivers:
            # the plan ran out: the drivers end by themselves once the instants already
            # due are sent or counted (a signal cuts them short instead)
            await asyncio.wait(set(self._drivers), timeout=DRIVERS_FINISH_S)
        self.stop()
        timeout_s = max(0.0, timeout_s - (time.monotonic() - self._stopped_at))
        if self._drivers:
            await asyncio.gather(*self._drivers, return_exceptions=True)
        pending = set(self._requests)
        if not pending:
            return 0
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        return len(late)

    # --- internals ----------------------------------------------------------------------

    async def _sleep_until(self, deadline_ns: int) -> bool:
        """Sleep until the instant; False when stopped first."""
        delay = (deadline_ns - now_ns()) / 1e9
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        return not self.stopping

    def _enter(self, phase: Phase | None) -> None:
        self.phase = phase
        if phase is None:
            for pool in self._pools.values():
                pool.want, pool.phase = 0, None
        if phase is not None:
            log.info(
                "phase_started",
                phase=phase.name,
                index=phase.index,
                duration_s=round(phase.duration_ns / 1e9, 3),
                loads={k: v.describe() for k, v in phase.loads.items()},
            )
        if self._on_phase is not None:
            self._on_phase(phase)

    def _start_load(self, name: str, shape: LoadShape, phase: Phase) -> None:
        pool = self._pools[name]
        pool.phase = phase
        pool.want = shape.concurrency
        if pool.workers < pool.want:
            self._spawn(self._drivers, self._grow(name, pool))
        if isinstance(shape, OpenLoad):
            self._spawn(self._drivers, self._open_loop(name, shape, phase))

    def _spawn(
        self, into: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)
        return task

    async def _grow(self, name: str, pool: _Pool) -> None:
        """Start the pool's missing workers, a batch per loop turn. Only the missing ones:
        those still finishing the previous phase's request carry on, so concurrency never
        overshoots at a boundary."""
        while pool.workers < pool.want and not self.stopping:
            self._start_worker(name, pool)
            if pool.workers % SPAWN_BATCH == 0:
                await asyncio.sleep(0)

    def _start_worker(self, name: str, pool: _Pool) -> None:
        pool.workers += 1
        task = self._spawn(self._requests, self._closed_worker(name, pool))
        task.add_done_callback(partial(self._worker_done, name, pool))

    def _worker_done(self, name: str, pool: _Pool, task: asyncio.Task[Any]) -> None:
        """The supervisor: a closed-loop worker that died of an exception (a target that
        broke its contract, a bug of the runner's own) is logged and replaced at once, so the
        pool keeps its concurrency. A done callback, so the hot path pays nothing."""
        if task.cancelled() or task.exception() is None:
            return
        self._failed(name, "worker_failed", task)
        if not self.stopping and pool.phase is not None and pool.workers < pool.want:
            self._start_worker(name, pool)

    def _failed(self, name: str, event: str, task: asyncio.Task[Any]) -> None:
        """Log a task's exception: the first per target with its traceback, then one line
        at each power of two (a sink that fails on every outcome must not flood the log)."""
        n = self.failures[name] = self.failures.get(name, 0) + 1
        exc = task.exception()
        if n == 1:
            log.error(event, target=name, failures=n, exc_info=exc)
        elif n & (n - 1) == 0:
            log.error(event, target=name, failures=n, error=f"{type(exc).__name__}: {exc}")

    def _send(self, name: str, spec: RequestSpec) -> None:
        """Spawn one open-loop request; it counts as in flight from here (the cap is
        compared with what was spawned, not with what has started)."""
        self._busy[name] += 1
        task = asyncio.get_running_loop().create_task(self._one(name, spec))
        self._requests.add(task)
        task.add_done_callback(partial(self._sent_done, name))

    def _start_conversation(
        self, talks: Talks, name: str, phase: Phase, due: int, deadline: int
    ) -> None:
        """Spawn one open-loop conversation; under way from here (for the cap). Its later
        turns are sent in its phase only: the phase's end ends it (``phase_ended``)."""
        self._live[name] += 1
        current = partial(self._same_phase, phase)
        task = asyncio.get_running_loop().create_task(talks.run(name, current, due, deadline))
        self._requests.add(task)
        task.add_done_callback(partial(self._talk_done, name))

    def _same_phase(self, phase: Phase) -> Phase | None:
        return phase if self.phase is phase else None

    def _talk_done(self, name: str, task: asyncio.Task[Any]) -> None:
        self._live[name] -= 1
        self._requests.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed(name, "conversation_failed", task)

    def _sent_done(self, name: str, task: asyncio.Task[Any]) -> None:
        self._requests.discard(task)
        self._busy[name] -= 1
        if not task.cancelled() and task.exception() is not None:
            self._failed(name, "request_failed", task)  # retrieved: never lost unseen

    def _spec(
        self, name: str, phase: Phase, scheduled_ns: int, deadline_ns: int = 0
    ) -> RequestSpec:
        seq = self._seq[name]
        self._seq[name] = seq + 1
        answer = self._answers(seq) if self._answers is not None else None
        spec = RequestSpec(
            name,
            phase.name,
            seq,
            "",  # the text is built where it is sent (soakd/workload/build.py)
            self.prompts.length(seq),
            answer or self.max_tokens,
            self.temperature,
            scheduled_ns,
            deadline_ns,
            answer is not None,
        )
        return spec if self._checks is None else self._checks(spec)

    async def _one(self, name: str, spec: RequestSpec) -> Outcome | None:
        """Send one request and hand its Outcome to every sink; None when it was not sent
        (the target had no way to send it: counted in the ledger, not an outcome)."""
        outcome = Outcome.planned(spec)
        try:
            await self.targets[name].send(spec, outcome)
        except NotSent as exc:
            self.ledger.miss(name, spec.phase, exc.reason, 1)
            return None
        except asyncio.CancelledError:
            if not outcome.sent_ns:  # cut while a worker held it for its instant
                self.ledger.miss(name, spec.phase, MissReason.LATE, 1)
                raise
            # only past the drain deadline: keep what arrived, say it was cut, let go (a
            # worker's request that had ended before the cut is kept as it ended)
            if not outcome.end_ns or outcome.error is ErrorKind.CANCELLED:
                outcome.error = ErrorKind.CANCELLED
                outcome.end_ns = outcome.end_ns or now_ns()
            self._deliver(outcome)
            raise
        self._deliver(outcome)
        return outcome

    def _deliver(self, outcome: Outcome) -> None:
        """The outcome to every sink, in order; one that raises misses it alone (a reader's
        bug must not hide a 429 from the guards, nor a request from the journal)."""
        for name, record in self._sinks:
            try:
                record(outcome)
            except Exception as exc:
                self._sink_failed(name, exc)

    def _sink_failed(self, name: str, exc: Exception) -> None:
        """Count a sink's failure; log the first, then one line at each power of two (a
        sink that fails on every outcome must not flood the log). The exception's type and
        where it was raised, never its message: it may hold a request's data or a key."""
        n = self.sink_failures[name] = self.sink_failures.get(name, 0) + 1
        if self._on_sink_failure is not None:
            self._on_sink_failure(name)
        if n & (n - 1) == 0:
            log.error(
                "sink_failed",
                sink=name,
                failures=n,
                error=type(exc).__name__,
                at=_raised_at(exc),
                note="this reader missed these outcomes; the other readers got them",
            )

    async def _closed_worker(self, name: str, pool: _Pool) -> None:
        """Send, wait, send again, while the pool wants this many workers.

        After a failure the next request cannot fix (failing.py: refused, no connection,
        401/403, 404), a request not sent, or a failure of soakd's own client (it can come
        back without the loop ever turning: a stream would spin, deaf to signals) the
        worker pauses (50 ms doubling to 1 s) before its next send: a dead or
        misconfigured target is then asked a few times a second, not hammered thousands
        of times (every failure is still recorded)."""
        pause = 0.0
        gate = self._gates.get(name)
        try:
            while not self.stopping and pool.workers <= pool.want and pool.phase is not None:
                if gate is not None:
                    wait = gate.delay_s()
                    if wait > 0:  # paused: look again within a second (or at the phase end)
                        await self._sleep_until(now_ns() + int(min(wait, 1.0) * 1e9))
                        continue
                    gate.sent()
                if self._talks is not None:
                    outcome = await self._talks.run(name, partial(_pool_phase, pool), now_ns())
                else:
                    self._busy[name] += 1
                    try:
                        outcome = await self._one(name, self._spec(name, pool.phase, now_ns()))
                    finally:
                        self._busy[name] -= 1
                if (
                    outcome is None
                    or failing_cause(outcome) is not None
                    or outcome.error is ErrorKind.CLIENT_ERROR
                ):
                    pause = min(1.0, pause * 2 or 0.05)
                    await self._sleep_until(now_ns() + int(pause * 1e9))
                else:
                    pause = 0.0
        finally:
            pool.workers -= 1

    async def _open_loop(self, name: str, shape: OpenLoad, phase: Phase) -> None:
        """Send at the planned instants, or count why not.

        A send goes out late when soakd is behind, and its dispatch lag says by how much
        (no coordinated omission). When an instant is already more than ``max_lateness``
        past, soakd drops its backlog: that instant and every one up to now are not made
        (``late``), and sending goes on from the present. A send that finds
        ``max_in_flight`` sends out, and one that falls while the target is paused, is not
        made either. The ledger counts each (offered = sent + missed). The backlog is
        skipped in one step, and the loop yields before every instant still to come and
        after ``CATCH_UP`` already due, so soakd stays responsive at any rate."""
        start_abs = self.origin_ns + phase.start_ns
        # the same instants for every target with the same shape: a fair A/B
        schedule = arrivals(shape, phase.duration_ns, random.Random(f"{self.seed}/{phase.index}"))
        # a resumed run enters mid-phase: the instants before the resume point fell in the
        # downtime (recorded as such), not in this session's offer
        resumed_at = self.origin_ns + self._start_offset_ns - start_abs
        if resumed_at > 0:
            schedule.skip_to(resumed_at)
        cap, late = shape.max_in_flight, shape.max_lateness_ns
        gate = self._gates.get(name)
        miss, pname = self.ledger.miss, phase.name
        # what the in-flight cap counts: requests, or conversations under way (an arrival
        # starts one; its later turns are its own, never missed)
        talks = self._talks
        busy = self._live if talks is not None else self._busy
        lead, slack = self._lead_ns, self._slack_ns
        # handed over ``lead`` early and not due yet: not in flight for the cap (with a
        # worker process they wait there for their instant)
        ahead: deque[int] = deque()
        offset = -1  # the instant taken from the schedule and not yet dealt with
        burst = 0  # instants sent in this loop turn, already due
        try:
            for offset in schedule:
                due = start_abs + offset
                now = now_ns()
                if due - lead > now:  # not to be handed over yet: sub-ms sleep (timerfd)
                    await sleep_until_ns(due - lead + slack)
                    burst = 0
                    now = now_ns()
                elif burst >= CATCH_UP:  # CATCH_UP handed over in this turn: yield one
                    await sleep_until_ns(due - lead)
                    burst = 0
                    now = now_ns()
                else:
                    burst += 1
                while ahead and ahead[0] <= now:
                    ahead.popleft()
                behind = now - due
                if behind > late:  # too far behind: drop the backlog up to now, go on fresh
                    miss(name, pname, MissReason.LATE, 1 + schedule.skip_to(offset + behind + 1))
                elif cap and busy[name] - len(ahead) >= cap:
                    miss(name, pname, MissReason.IN_FLIGHT_CAP, 1)
                elif gate is not None and gate.delay_s() > 0:
                    miss(name, pname, gate.pause_reason, 1)
                else:
                    if gate is not None:
                        gate.sent()
                    if talks is not None:
                        self._start_conversation(talks, name, phase, due, due + late)
                    else:
                        self._send(name, self._spec(name, phase, due, due + late))
                    if due > now:
                        ahead.append(due)
                offset = -1
        except asyncio.CancelledError:
            # stopped (the plan's end, a signal) while behind: the instants already due
            # when sending stopped were offered and not made; a later one is the resume's
            elapsed = (self._stopped_ns or now_ns()) - start_abs
            due_now = int(0 <= offset <= elapsed) + schedule.skip_to(elapsed + 1)
            if due_now:
                miss(name, pname, MissReason.LATE, due_now)
            raise


def _pool_phase(pool: _Pool) -> Phase | None:
    """A closed-loop worker's phase: None once the pool wants fewer workers than it has."""
    return pool.phase if pool.workers <= pool.want else None


def _named(
    sinks: list[OutcomeSink | OutcomeRecorder],
) -> tuple[tuple[str, Callable[[Outcome], None]], ...]:
    """Each sink's ``record`` under its class's name (numbered when a class comes twice)."""
    names = [type(s).__name__ for s in sinks]
    return tuple(
        (f"{name}#{i}" if names.count(name) > 1 else name, sink.record)
        for i, (name, sink) in enumerate(zip(names, sinks, strict=True))
    )


def _raised_at(exc: BaseException) -> str:
    """``file.py:line in function`` of the frame that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno} in {last.name}"
