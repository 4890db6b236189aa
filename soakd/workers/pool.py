"""Workers room, the parent's side: the sender processes, supervised, and the targets that
send through them.

The runner plans every send exactly as with one process (the schedule, the prompts'
order, the gates, the in-flight caps, the ledger); ``RemoteTarget.send`` hands the
request to a worker instead of sending it here, and the Outcome comes back filled in
place. Each target's requests go round-robin over the workers that are up, so every
worker gets every N-th open-loop instant (a smooth rate each) and a closed-loop stream's
next request goes to the next worker.

A worker that dies (a crash, a SIGKILL, the OOM killer) is logged, exported
(``soakd_workers_up``) and started again with back-off (soakd/spawn.py's ``Backoff``, the
journal's writer's too). What it had in flight is
recorded once, as ``worker_lost``: the parent cannot know whether the server answered
it, and it never comes back twice, since the worker that held it is gone. While no
worker is up, the runner sees the targets as paused (reason ``no_worker``): open-loop
sends are counted as missed, closed-loop streams wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from soakd import outcome_record
from soakd.config import TargetConfig, Workload
from soakd.metrics import names as mn
from soakd.model import ErrorKind, MissReason, Outcome, RequestSpec
from soakd.spawn import Backoff, socket_pair, spawn_module
from soakd.types import NotSent, SendGate
from soakd.workers import wire
from soakd.workload.calibration import Calibration

if TYPE_CHECKING:
    from soakd.workers.reuse import NoReuse

log = structlog.get_logger()
now_ns = time.perf_counter_ns

READY_TIMEOUT_S: Final = 60.0
"""A worker that has not said READY by then failed to start (imports, a bad key file)."""
STOP_GRACE_S: Final = 5.0
"""At close, how long a worker may take to hand back and exit before it is killed."""
CANCEL_WAIT_S: Final = 1.0
"""After a cancel, how long to wait for the worker's record of what arrived."""
LEAD_NS: Final = 20_000_000
"""Open-loop requests go to a worker this long before their instant; the worker sends at
the instant on its own clock, so neither the hop through the socket nor a busy turn of
the parent's loop is in the dispatch lag. 2 ms left the median lag at 3.8-12.9 ms at
5,000 req/s (the hand-over takes two loop turns, a few ms each at that rate); 20 ms took
it to 0.17 ms. It is also how late a pause or a stop can be for a worker: what was
handed over before it still goes out at its instant."""
CLOCK_PINGS: Final = 8
WAKE_SLICE: Final = 8
"""Finished requests whose waiters are woken per event-loop turn (``Wakeups``)."""


class Wakeups:
    """The waiters of finished open-loop requests, woken ``WAKE_SLICE`` per loop turn,
    oldest first; a closed-loop stream's waiter is woken at once (its next send waits on
    it), as a worker hands its outcome back at once (soakd/workers/child.py).

    A frame from a worker holds up to dozens of outcomes, and eight workers' frames
    arrive in the same turn. Waking every waiter at once queued each outcome's
    bookkeeping (journal, stats, metrics: 100-200 us each) ahead of the open loop's
    next hand-over, which waited behind the whole batch: a third of the requests reached
    their worker after their instant at 5,000 req/s, and the dispatch lag's p99 followed
    the parent's load (docs/benchmarks.md, "Worker processes"). Woken a slice per turn,
    the schedule's timers run between slices, and a hand-over waits for one slice at
    most. The work is the same, only its order changes; a waiter cancelled meanwhile (the
    drain deadline) is skipped. Closed-loop outcomes are not paced: slices of 8 took a
    saturated closed loop of 16-token answers from 7.1k to 5.2k requests a second (the next
    sends waited for the slices)."""

    def __init__(self) -> None:
        self._queue: deque[tuple[asyncio.Future[None], BaseException | None]] = deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(
        self, done: asyncio.Future[None], exc: BaseException | None = None, *, paced: bool
    ) -> None:
        """Wake ``done`` (with ``exc``): now, or among the next slices when ``paced``."""
        if not paced:
            _wake_one(done, exc)
            return
        self._queue.append((done, exc))
        if not self._scheduled:
            self._scheduled = True
            done.get_loop().call_soon(self._wake)

    def _wake(self) -> None:
        queue = self._queue
        for _ in range(min(WAKE_SLICE, len(queue))):
            _wake_one(*queue.popleft())
        if queue:
            asyncio.get_running_loop().call_soon(self._wake)
        else:
            self._scheduled = False


def _wake_one(done: asyncio.Future[None], exc: BaseException | None) -> None:
    if done.done():  # cancelled meanwhile (the drain deadline)
        return
    if exc is None:
        done.set_result(None)
    else:
        done.set_exception(exc)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, n: int) -> None:
        Gauge(
            mn.WORKERS,
            "Sender processes configured (run.workers; 1: soakd's own process sends).",
            registry=registry,
        ).set(n)
        self.up = Gauge(mn.WORKERS_UP, "Sender processes up now.", registry=registry)
        self.restarts = Counter(
            mn.WORKER_RESTARTS_TOTAL,
            "Sender worker processes started again after one died.",
            registry=registry,
        )
        self.requests = Counter(
            mn.WORKER_REQUESTS_TOTAL,
            "Requests a sender worker process handed back (lost ones included), by phase.",
            ["worker", "phase"],
            registry=registry,
        )
        self._children: dict[tuple[int, str], Any] = {}
        self.offset = Gauge(
            mn.WORKER_CLOCK_OFFSET_SECONDS,
            "A worker's monotonic clock minus soakd's, as measured (applied when larger "
            "than half the round trip).",
            ["worker"],
            registry=registry,
        )

    def count(self, worker: int, phase: str, n: int = 1) -> None:
        key = (worker, phase)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(str(worker), phase)
        child.inc(n)


class Worker:
    """One sender process and its socket."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: asyncio.subprocess.Process | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.flusher: asyncio.Task[None] | None = None
        # id -> (its Outcome, its waiter, whether its waiter is woken paced: open loop)
        self.pending: dict[int, tuple[Outcome, asyncio.Future[None], bool]] = {}
        self.shift = 0  # parent clock - worker clock, added to every instant it reports
        self.started = 0.0
        self.up = False
        self.backoff = Backoff()  # 0.25 s after a death, doubling to 30 s while it keeps dying
        self.outbox = wire.Outbox()
        self._pong: asyncio.Future[tuple[int, int]] | None = None

    def submit(
        self, rid: int, target: int, spec: RequestSpec, out: Outcome
    ) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending[rid] = (out, done, bool(spec.deadline_ns))
        wire.pack_spec(self.outbox.buf(wire.SEND), rid, target, spec)
        return done

    def cancel(self, rid: int) -> None:
        if rid in self.pending:
            wire.pack_ids(self.outbox.buf(wire.CANCEL), rid)

    def finished(
        self, payload: bytes, count: Callable[[int, str, int], None] | None, wake: Wakeups
    ) -> None:
        """A worker's OUTCOMES frame: each record read into its Outcome, its waiter woken;
        counted by phase once per frame (a counter's lock per outcome cost ~0.8 us), and
        counted even when the frame breaks halfway (what was woken is counted)."""
        shift = self.shift
        done_by: dict[str, int] = {}
        try:
            for rid, head, start, end in wire.unpack_outcomes(payload):
                got = self.pending.pop(rid, None)
                if got is None:
                    continue
                out, done, paced = got
                if head.error == wire.NOT_SENT:  # the worker reached it past its deadline
                    why = outcome_record.detail(payload, start, head)
                    wake.add(done, NotSent(MissReason(why)), paced=paced)
                    continue
                if shift or not head.wall_start or not head.end_ns:
                    # instants to move, or a field soakd sets itself: unpacked, packed again
                    wall = out.wall_start
                    outcome_record.fill(out, head, payload, start, shift)
                    out.wall_start = out.wall_start or wall  # cut before it went out: unsent
                else:  # the journal forwards the record as it came
                    outcome_record.fill(out, head, payload, start, tails=False)
                    out.packed = payload[start:end]
                phase = out.phase
                done_by[phase] = done_by.get(phase, 0) + 1
                wake.add(done, paced=paced)
        finally:
            if count is not None:
                for phase, n in done_by.items():
                    count(self.index, phase, n)

    def lose_all(self, why: str, count: Callable[[int, str, int], None] | None) -> int:
        """The worker is gone: what it held is recorded once, as lost."""
        lost = list(self.pending.values())
        self.pending.clear()
        self.outbox.clear()  # never sent: they are lost too
        end = now_ns()
        for out, done, _ in lost:
            out.error, out.error_detail = ErrorKind.WORKER_LOST, why
            out.end_ns = out.end_ns or end
            if count is not None:
                count(self.index, out.phase, 1)
            _wake_one(done, None)
        return len(lost)

    async def clock_check(self) -> tuple[int, int]:
        """(offset, round trip) in ns, from the fastest of a few pings."""
        assert self.writer is not None
        best = (0, 1 << 62)
        loop = asyncio.get_running_loop()
        for _ in range(CLOCK_PINGS):
            self._pong = loop.create_future()
            self.writer.write(wire.frame(wire.PING, wire.pack_clock(now_ns(), 0)))
            t0, t1 = await asyncio.wait_for(self._pong, READY_TIMEOUT_S)
            t2 = now_ns()
            if t2 - t0 < best[1]:
                best = (t1 - (t0 + t2) // 2, t2 - t0)
        return best

    def pong(self, payload: bytes) -> None:
        if self._pong is not None and not self._pong.done():
            self._pong.set_result(wire.unpack_clock(payload))


@dataclass(frozen=True, slots=True)
class WorkerNow:
    """One sender process, as /status and the live view show it."""

    worker: int
    pid: int | None
    up: bool
    in_flight: int  # requests it holds now


class WorkerPool:
    """The sender processes, started, watched, restarted and stopped together."""

    def __init__(
        self,
        n: int,
        targets: list[TargetConfig],
        run_id: str,
        log_dir: Path,
        metrics: WorkerMetrics | None = None,
        no_reuse: NoReuse | None = None,
        workload: Workload | None = None,
    ) -> None:
        self.workers = [Worker(i) for i in range(n)]
        self._names = [t.name for t in targets]
        self._no_reuse = no_reuse
        # what a worker builds its requests' text from (soakd/workload/build.py): the
        # workload, and every calibration so far (a restarted worker gets them all)
        self._calibrations: list[dict[str, Any]] = []
        self._hello = {
            "run_id": run_id,
            "targets": [t.model_dump(mode="json") for t in targets],
            "workload": (workload or Workload()).model_dump(mode="json"),
            "calibrations": self._calibrations,
        }
        self._log_dir = log_dir
        self._metrics = metrics
        self._count = metrics.count if metrics is not None else None
        self._wakeups = Wakeups()
        self._up: list[Worker] = []
        self._rr = 0
        self._next_id = 0
        self._closing = False
        self._restarts: set[asyncio.Task[None]] = set()
        self.restarts = 0
        self.lost = 0

    def calibrate(self, cal: Calibration) -> None:
        """Size what the workers build from ``cal.from_seq`` on by ``cal``: written at once,
        ahead of this turn's SEND batch (no request of that seq or later was planned before
        it), and in every later HELLO."""
        doc = wire.calibration_doc(cal)
        self._calibrations.append(doc)
        for w in self.workers:  # started or starting: each got the HELLO before this
            if w.writer is not None and not w.writer.is_closing():
                w.writer.write(wire.json_frame(wire.CALIBRATE, doc))

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start every worker; RuntimeError (with the log's tail) when one cannot start."""
        await asyncio.gather(*(self._start(w) for w in self.workers))

    async def _start(self, w: Worker) -> None:
        ours, theirs = socket_pair()
        path = self._log_dir / f"worker-{w.index}.log"
        with theirs:
            fd = theirs.fileno()
            w.proc = await spawn_module(
                "soakd.workers.child", str(fd), log_path=path, pass_fds=(fd,)
            )
        reader, w.writer = await asyncio.open_connection(sock=ours)
        w.writer.write(wire.json_frame(wire.HELLO, {"index": w.index, **self._hello}))
        try:
            await asyncio.wait_for(_ready(reader), READY_TIMEOUT_S)
            w.reader_task = asyncio.create_task(self._read(w, reader))
            offset, rtt = await w.clock_check()
        except (TimeoutError, OSError, wire.WireError) as exc:
            await self._kill(w)
            tail = path.read_text(errors="replace")[-400:] if path.exists() else ""
            raise RuntimeError(
                f"worker {w.index} did not start ({exc or 'timeout'}): {tail}"
            ) from None
        # One kernel's CLOCK_MONOTONIC is the same in every process: an offset within half
        # the round trip is the measurement's own noise, and applying it would add error.
        w.shift = -offset if abs(offset) * 2 > rtt else 0
        w.writer.write(wire.frame(wire.CLOCK, wire.pack_clock(w.shift, 0)))
        if self._metrics is not None:
            self._metrics.offset.labels(str(w.index)).set(offset / 1e9)
        w.flusher = asyncio.create_task(w.outbox.flush_forever(w.writer))
        w.started = time.monotonic()
        w.up = True
        self._up.append(w)
        self._gauge()
        log.info(
            "worker_started", worker=w.index, pid=w.proc.pid, clock_offset_ns=offset, rtt_ns=rtt
        )

    async def _read(self, w: Worker, reader: asyncio.StreamReader) -> None:
        why = "its socket closed"
        try:
            while (got := await wire.read_frame(reader)) is not None:
                kind, payload = got
                if kind == wire.OUTCOMES:
                    w.finished(payload, self._count, self._wakeups)
                elif kind == wire.PONG:
                    w.pong(payload)
                elif kind == wire.CLOSES and self._no_reuse is not None:
                    target, status, closes = wire.unpack_closes(payload)
                    if target < len(self._names):
                        self._no_reuse.learned(self._names[target], w.index, status, closes)
        except (OSError, wire.WireError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if not self._closing:
            self._died(w, why)

    def _died(self, w: Worker, why: str) -> None:
        w.up = False
        if w in self._up:
            self._up.remove(w)
        lost = w.lose_all(f"worker {w.index} died", self._count)
        self.lost += lost
        if self._no_reuse is not None:
            self._no_reuse.forget(w.index)  # its pools are gone; the next one learns again
        self._gauge()
        lived = time.monotonic() - w.started
        log.error(
            "worker_died", worker=w.index, why=why, lost_in_flight=lost, lived_s=round(lived, 1)
        )
        task = asyncio.get_running_loop().create_task(self._restart(w, lived))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, w: Worker, lived: float) -> None:
        await self._kill(w)
        delay = w.backoff.died(lived)
        while not self._closing:
            await asyncio.sleep(delay)
            if self._closing:
                return
            try:
                await self._start(w)
            except RuntimeError as exc:
                log.warning("worker_restart_failed", worker=w.index, error=str(exc)[:300])
                delay = w.backoff.failed()
                continue
            self.restarts += 1
            if self._metrics is not None:
                self._metrics.restarts.inc()
            return

    async def _kill(self, w: Worker) -> None:
        for task in (w.flusher, w.reader_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if w.writer is not None:
            w.writer.close()
        if w.proc is not None and w.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()

    async def aclose(self) -> None:
        """Stop every worker: its socket closes, it cuts what is left (the drain is over by
        now), hands it back and exits; one that does not within the grace is killed."""
        self._closing = True
        for task in list(self._restarts):
            task.cancel()
        for w in self.workers:
            if w.flusher is not None:
                w.flusher.cancel()
            if w.writer is not None:
                with contextlib.suppress(OSError):
                    w.writer.write_eof()
        procs = [w.proc for w in self.workers if w.proc is not None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), STOP_GRACE_S)
        for w in self.workers:
            if w.reader_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(w.reader_task, 1.0)
            self.lost += w.lose_all(f"worker {w.index} stopped", self._count)
            await self._kill(w)
            w.up = False
        self._up.clear()
        self._gauge()

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.up.set(len(self._up))

    # --- sending ------------------------------------------------------------------------

    @property
    def up(self) -> int:
        return len(self._up)

    def status(self) -> tuple[WorkerNow, ...]:
        """Per worker, for /status: pid, up, requests it holds now."""
        return tuple(
            WorkerNow(w.index, w.proc.pid if w.proc is not None else None, w.up, len(w.pending))
            for w in self.workers
        )

    async def send(self, target: int, spec: RequestSpec, out: Outcome) -> None:
        """Hand one request to the next worker that is up; return once it came back."""
        up = self._up
        if not up:  # every worker died since the runner's gate looked: it never left
            raise NotSent(MissReason.NO_WORKER)
        self._rr += 1
        w = up[self._rr % len(up)]
        rid = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        out.wall_start = time.time()  # the row's stamp if the worker never reports
        try:
            await w.submit(rid, target, spec, out)
        except asyncio.CancelledError:
            # the drain deadline: the worker cuts it and hands back what arrived, which
            # fills ``out`` through a new waiter (the cancelled one is gone)
            if rid in w.pending:
                again = asyncio.get_running_loop().create_future()
                w.pending[rid] = (out, again, False)
                w.cancel(rid)
                with contextlib.suppress(TimeoutError, NotSent):
                    await asyncio.wait_for(again, CANCEL_WAIT_S)
            raise


async def _ready(reader: asyncio.StreamReader) -> None:
    got = await wire.read_frame(reader)
    if got is None or got[0] != wire.READY:
        raise wire.WireError("it exited before it was ready")


class RemoteTarget:
    """A Target whose requests a worker sends (the Target protocol, soakd/types.py)."""

    def __init__(self, name: str, index: int, pool: WorkerPool) -> None:
        self.name = name
        self._index = index
        self._pool = pool

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        out = outcome if outcome is not None else Outcome.planned(spec)
        await self._pool.send(self._index, spec, out)
        return out

    async def aclose(self) -> None:
        """The pool is closed once, by its owner."""


class WorkerGate:
    """A target's send gate with the workers in it: no worker up pauses the target
    (reason ``no_worker``); otherwise the target's own gate decides."""

    def __init__(self, pool: WorkerPool, inner: SendGate | None) -> None:
        self._pool = pool
        self._inner = inner

    def delay_s(self) -> float:
        if not self._pool.up:
            return 0.05
        return self._inner.delay_s() if self._inner is not None else 0.0

    def sent(self) -> None:
        if self._inner is not None:
            self._inner.sent()

    @property
    def pause_reason(self) -> MissReason:
        if not self._pool.up or self._inner is None:
            return MissReason.NO_WORKER
        return self._inner.pause_reason
