"""Journal writer room, soakd's side: ``Journal``, the sink the run records to, and the link to
the journal's writer process (process.py, store.py).

The event loop only appends to a bounded deque (``record``, ``sample``, ``event``: a length
check and an append, never IO, never a lock wait). A link thread takes what is queued every
``SEND_EVERY_S``, puts the outcomes' records in a batch (batch.py: a worker's record is
copied as it came, soakd/outcome_record.py) and sends them, with the samples,
the events and a snapshot of the plan clock, as one numbered packet (messages.py); it reads what
the writer sends back: each committed batch's fold (soakd/measure/fold.py), applied to
``Metrics`` and ``RunStats`` in one callback on the loop, the writer's own counts (into
``JournalMetrics``) and its log events (logged here as soakd's own). The writer's Python
(rows, folds, SQLite) never holds soakd's GIL; what soakd's process does per outcome is the
append and copying its record.

What can go wrong, and what is counted (docs/journal.md):

- **Metrics count what the journal holds**: a fold comes back after its commit (store.py),
  or at once while the disk fails, never twice.
- **A full queue** (the writer cannot keep up, or is down): an outcome the deque cannot take
  is tallied (``Fold.tally``), applied to the metrics at once, and its tally travels in the
  next packet into the journal's totals: counted, without a row or a histogram bucket.
- **The writer dies** (a crash, the OOM killer): logged (``journal_writer_died``), counted
  (``soakd_journal_writer_restarts_total``), started again with a back-off (0.25 s, doubling
  to 30 s: soakd/spawn.py's ``Backoff``, the workers' too); it continues the same session,
  tells which packets the dead one committed, and soakd sends it the others again (those
  whose folds soakd applied already are written, not sent back). Meanwhile the queue fills,
  then tallies. Packets soakd applied while the disk failed are kept for this at most
  ``journal.queue_size`` outcomes' worth; older ones, if the writer then died too, are in
  the metrics and not in the journal's totals.
- **soakd is SIGKILLed**: the writer gets SIGTERM and ends at once; lost is what it had not
  committed (at most one flush interval) and the packet soakd had not sent (``SEND_EVERY_S``).
- One soakd per run dir: soakd holds the ``flock`` on ``journal.lock`` and the writer holds it
  too (the same open file), so the lock lasts until both are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import os
import select
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from soakd.childlog import relog
from soakd.config import JournalConfig
from soakd.journal import messages as m
from soakd.journal.batch import Batch
from soakd.journal.handoff import FoldSink, HandOff
from soakd.journal.messages import Restored, RunInfo
from soakd.journal.progress import ClockState, PlanClock
from soakd.journal.records import Event, EventRow, RunStopped, Stamped
from soakd.journal.resume import ResumeState, take_lock
from soakd.journal.schema import JOURNAL_FILE, JournalError
from soakd.journal.store import MAX_BATCH
from soakd.measure.fold import Fold, fold
from soakd.metrics.run import JournalMetrics
from soakd.model import Outcome, Sample
from soakd.spawn import SOCKET_BUFFER, Backoff, reap, socket_pair, start_module

log = structlog.get_logger()

SEND_EVERY_S = 0.1
"""How often the link thread sends what is queued (sooner when ``MAX_PACKET`` records are):
a SIGKILL of soakd loses at most this much that the writer never got, besides what the
writer had not committed (``journal.flush_interval``, 0.5 s). Each packet costs both ends a
wake-up and the writer a decode and a fold of its own: at 500 requests a second on one core
(16-core H200 host), 20 ms packets cost the writer 0.08-0.10 ms and the link thread 0.02 ms
a request, 100 ms ones 0.056-0.07 and 0.01 ms (bench/results/manycore-16c-i28-ab.json)."""
CLOCK_EVERY_S = 0.1
"""With nothing queued, a packet of the plan clock alone this often."""
MAX_PACKET = 2000
"""Records in one packet."""
OUT_LIMIT = 8 << 20
"""Bytes waiting to be written to the writer; beyond, the queue waits (and fills)."""
YIELD_EVERY = 64
"""Outcomes packed between two ``os.sched_yield()`` calls: the loop's turn for the GIL
(it stamps tokens with ``run.workers: 1``)."""
START_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 120.0
"""How long closing waits for the writer's last commit before it kills it."""
WRITER_LOG = "journal-writer.log"


@dataclass(slots=True)
class _Sent:
    """A packet sent and not yet committed (sent again if the writer dies)."""

    packet: m.Packet
    outcomes: int
    counted: bool = False  # its fold came back (the disk failing): applied already


class Journal:
    """The run's journal: an OutcomeSink (``record``), a sample sink (``sample``), events.

    ``forward``: what applies each batch's fold (``Metrics``, ``RunStats``), on the loop that
    opened the journal, once the batch is committed."""

    def __init__(
        self,
        path: Path,
        run: RunInfo,
        cfg: JournalConfig | None = None,
        *,
        metrics: JournalMetrics | None = None,
        forward: Sequence[FoldSink] = (),
        resume: ResumeState | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.run = run
        self.cfg = cfg or JournalConfig()
        self.metrics = metrics
        self._resume = resume
        self._wall = wall
        limit = self.cfg.queue_size
        self._handoff = HandOff(limit, min(MAX_PACKET, limit // 2), forward)
        self._q = self._handoff.records  # the hot path's one attribute lookup
        self._closed = False
        self._tally = Fold()  # outcomes the queue could not take, not yet applied
        self._tally_due = False
        self._drop_logged = False
        self._clock: PlanClock | None = None  # the runner: read on the loop only
        self._state: ClockState | None = None  # its last snapshot: what the link thread reads
        self._publisher: asyncio.TimerHandle | None = None
        self.restored: Restored | None = None
        self.session = 0
        self.unwritten = 0  # records the journal could not write at all (set by close)
        # the link thread's state
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._open_error: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock_fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._frames = m.frames()
        self._out = bytearray()
        self._unacked: deque[_Sent] = deque()
        self._seq = 0
        self._last_packet = 0.0
        self._restart_at = 0.0
        self._backoff = Backoff()
        self._started = 0.0
        self._close_sent = False
        self._close_deadline = 0.0
        self._finished = False
        self.restarts = 0

    # --- lifecycle (loop side) ---------------------------------------------------------------

    def start(self) -> None:
        """Take the run dir's lock, start the writer process and open (or create) the
        database there; raises JournalError."""
        if self._handoff.loop is None:
            with contextlib.suppress(RuntimeError):
                self._handoff.loop = asyncio.get_running_loop()
        fd = self._lock_fd = take_lock(self.path.parent)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        ctx = contextvars.copy_context()  # the run's log context, for the writer's lines
        self._thread = threading.Thread(target=ctx.run, args=(self._run,), name="soakd-journal")
        self._thread.daemon = True
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            self._thread.join()
            self._unlock()
            raise JournalError(self._open_error)
        m, restored = self.metrics, self.restored
        if m is not None:
            m.queue_depth.set_function(self._q.__len__)
            if restored is not None:  # continue the run's own counters too
                m.downtime.inc(restored.downtime_s)
                m.resumes.inc(restored.resumes + (self._resume is not None))

    def attach(self, clock: PlanClock) -> None:
        """Read the plan clock from the runner: offsets of rows, heartbeats, seq numbers.

        The runner is the loop's: only the loop reads it. The loop publishes a frozen
        snapshot (``ClockState``) every ``SEND_EVERY_S``, at each event and at the close;
        the link thread reads the last one published, and nothing else of the loop's."""
        self._clock = clock
        self.publish()
        with contextlib.suppress(RuntimeError):  # no loop (a script): at events and close
            self._publisher = asyncio.get_running_loop().call_later(SEND_EVERY_S, self._republish)

    def publish(self) -> None:
        """Loop side: snapshot the plan clock for the link thread (one reference stored)."""
        if self._clock is not None:
            self._state = ClockState.of(self._clock)

    def _republish(self) -> None:
        if self._closed:
            return
        self.publish()
        loop = asyncio.get_running_loop()
        self._publisher = loop.call_later(SEND_EVERY_S, self._republish)

    def close(self, completed: bool = False) -> None:
        """Write everything still queued, the final heartbeat and the stop event; blocks."""
        if self._closed:
            return
        self._apply_tally()
        self._last_words(completed)
        self._shut()

    async def aclose(self, completed: bool = False) -> None:
        """``close`` off the loop; the folds the writer hands back at its end are applied on
        the loop before this returns."""
        if self._closed:
            return
        self._apply_tally()
        self._last_words(completed)
        await asyncio.to_thread(self._shut)

    def _last_words(self, completed: bool) -> None:
        """Loop side, before the link thread's last packet: the stop event and the plan
        clock's final snapshot (it carries the last seq numbers and misses)."""
        if self._publisher is not None:
            self._publisher.cancel()
        self.event(RunStopped(completed))  # publishes

    def _shut(self) -> None:
        self._closed = True
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- the hot path (loop side) --------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        """OutcomeSink: enqueue; or (queue full, journal closed) tally it, applied at once."""
        q = self._q
        n = len(q)
        h = self._handoff
        if n < h.limit and not self._closed:
            q.append(outcome)
            if n == h.wake_at:
                self._wake()
            return
        if not self._closed:
            self._drop("request")
        self._tally.tally(outcome)
        if not self._tally_due:
            self._tally_due = True
            loop = h.loop
            if loop is None or self._closed:
                self._apply_tally()
            else:
                loop.call_soon(self._apply_tally)

    def _apply_tally(self) -> None:
        """The tallied outcomes: to the sinks now, and to the writer for the totals."""
        self._tally_due = False
        f = self._tally
        if not f:
            return
        self._tally = Fold()
        self._handoff.apply(f)
        if not self._closed:  # after the run: nothing left to journal it
            self._handoff.tallies.append(f)

    def sample(self, sample: Sample) -> None:
        """A probe reading (the probes' ``emit``)."""
        if len(self._q) < self._handoff.limit and not self._closed:
            self._q.append(sample)
        else:
            self._drop("sample")

    def event(self, event: Event) -> None:
        """A run event (phase change, stop...). Events are rare: never dropped."""
        if self._closed:
            return
        clock = self._clock
        offset = time.perf_counter_ns() - clock.origin_ns if clock and clock.origin_ns else None
        self.publish()  # the packet that carries the event carries the clock as it is now
        self._q.append(Stamped(self._wall(), offset, event))

    def _drop(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.dropped.labels(kind).inc()
        if not self._drop_logged:
            self._drop_logged = True
            log.error(
                "journal_queue_full",
                kind=kind,
                queue=len(self._q),
                note="records are dropped from the journal (counted in the totals and "
                "the metrics); the journal's writer cannot keep up, or is down",
            )

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # --- the link thread: the writer process and its socket ----------------------------------

    def _run(self) -> None:
        try:
            ok = self._connect()
        except Exception as exc:  # handed to start(), which raises it
            self._open_error = f"{self.path}: cannot start the journal's writer: {exc}"
            ok = False
        self._ready.set()
        if not ok:
            return
        try:
            while not self._finished:
                self._turn()
        except Exception:
            log.exception("journal_link_failed")
            self._lose_rest("journal_link_failed")
        finally:
            self._disconnect(kill=False)
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _connect(self) -> bool:
        """Start a writer and wait for it to open the journal; False (the reason in
        ``_open_error``, or logged when it is a restart) when it does not."""
        first = self.session == 0
        ours, theirs = socket_pair()
        assert self._lock_fd is not None
        with theirs:
            fd = theirs.fileno()
            self._proc = start_module(
                "soakd.journal.process",
                str(fd),
                str(os.getpid()),  # it dies with soakd (soakd/lifeline.py)
                log_path=self.path.parent / WRITER_LOG,
                pass_fds=(fd, self._lock_fd),  # the lock lasts while it runs
            )
        self._started = time.monotonic()
        resume = self._resume
        hello = m.Hello(
            str(self.path),
            self.run,
            m.WriterConfig.of(self.cfg),
            None if resume is None else m.Resume.of(resume),
            self.session,
        )
        ours.settimeout(START_TIMEOUT_S)
        frames = m.frames()
        answer: m.Ready | m.Failed | None = None
        try:
            ours.sendall(m.encode(hello))
            while answer is None:
                data = ours.recv(SOCKET_BUFFER)
                if not data:
                    break
                for kind, payload in frames.feed(data):
                    msg = m.decode(kind, payload)
                    if isinstance(msg, m.Log):
                        relog(msg.level, msg.event, msg.fields)
                    elif isinstance(msg, m.Ready | m.Failed):
                        answer = msg
                        break
        except (OSError, m.LinkError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            why = "it exited before it was ready"
        if not isinstance(answer, m.Ready):
            reason = answer.error if answer is not None else f"{why}: {self._log_tail()}"
            ours.close()
            self._reap(kill=True)
            if first:
                self._open_error = reason
            else:
                log.error("journal_writer_restart_failed", error=reason[:300])
            return False
        ours.setblocking(False)
        self._sock, self._frames = ours, frames
        if first:
            self.restored = answer.restored
            self.session = answer.session
        else:
            self._rejoined(answer.packet_seq)
        return True

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.path.parent / WRITER_LOG).read_text(errors="replace").strip()[-300:]
        return ""

    def _turn(self) -> None:
        """One turn of the link: read, write, pack what is queued."""
        sock = self._sock
        now = time.monotonic()
        if sock is None:  # the writer is down
            if self._stopping.is_set() or now >= self._restart_at:
                if not self._restart():
                    if self._stopping.is_set():
                        self._lose_rest("the journal's writer could not be started again")
                    return
            else:
                ready, _, _ = select.select(
                    [self._wake_r], [], [], min(SEND_EVERY_S, self._restart_at - now)
                )
                if ready:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
                return
            sock = self._sock
            assert sock is not None
        fd = sock.fileno()
        wait = [fd] if self._out else []
        readable, writable, _ = select.select([fd, self._wake_r], wait, [], SEND_EVERY_S)
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError, OSError):
                os.read(self._wake_r, 4096)
        if fd in readable and not self._read(sock):
            return
        if writable or self._out:
            try:
                sent = sock.send(self._out)
                del self._out[:sent]
            except BlockingIOError:
                pass
            except OSError as exc:
                self._died(f"{type(exc).__name__}: {exc}")
                return
        now = time.monotonic()
        stopping = self._stopping.is_set()
        if len(self._out) < OUT_LIMIT and not self._close_sent:
            due = now - self._last_packet >= SEND_EVERY_S or len(self._q) >= MAX_PACKET
            if stopping or (due and (self._q or self._handoff.tallies)):
                self._pack()
            elif now - self._last_packet >= CLOCK_EVERY_S:
                self._pack()  # the plan clock alone
        if stopping and not self._close_sent and not self._q and not self._handoff.tallies:
            self._out += m.encode(m.Close())
            self._close_sent = True
            self._close_deadline = now + CLOSE_TIMEOUT_S
        if self._close_sent and now > self._close_deadline:
            self._disconnect(kill=True)
            self._lose_rest(f"the journal's writer did not finish in {CLOSE_TIMEOUT_S:g} s")

    def _read(self, sock: socket.socket) -> bool:
        """What the writer sent; False when it is gone (handled)."""
        try:
            data = sock.recv(SOCKET_BUFFER)
        except BlockingIOError:
            return True
        except OSError as exc:
            self._died(f"{type(exc).__name__}: {exc}")
            return False
        if not data:
            if self._finished:
                return False
            self._died("its socket closed")
            return False
        try:
            frames = self._frames.feed(data)
        except m.LinkError as exc:
            self._died(str(exc))
            return False
        try:
            msgs = [m.decode(kind, payload) for kind, payload in frames]
        except m.LinkError as exc:
            self._died(str(exc))
            return False
        for msg in msgs:
            self._dispatch(msg)
        return True

    def _dispatch(self, msg: m.Message) -> None:
        if isinstance(msg, m.Folded):
            through = msg.through
            self._handoff.give_back(msg.fold)
            if msg.committed:
                self._acked(through)
            else:
                for sent in self._unacked:
                    if sent.packet.seq <= through:
                        sent.counted = True
                self._trim_counted()
        elif isinstance(msg, m.Committed):
            self._acked(msg.through)
        elif isinstance(msg, m.Stats):
            if self.metrics is not None:
                self.metrics.add(msg)
        elif isinstance(msg, m.Log):
            relog(msg.level, msg.event, msg.fields)
        elif isinstance(msg, m.Closed):
            self.unwritten = msg.unwritten
            self._finished = True

    def _acked(self, through: int) -> None:
        unacked = self._unacked
        while unacked and unacked[0].packet.seq <= through:
            unacked.popleft()

    def _trim_counted(self) -> None:
        """Packets applied while the disk fails are kept for a restart of the writer, at
        most ``queue_size`` outcomes' worth (the rows a failing writer keeps)."""
        unacked = self._unacked
        kept = sum(s.outcomes for s in unacked)
        while kept > self.cfg.queue_size and unacked and unacked[0].counted:
            kept -= unacked.popleft().outcomes

    def _pack(self) -> None:
        """Take what is queued (up to MAX_PACKET records) and append it as one packet."""
        items = self._handoff.take(MAX_PACKET)
        tally = self._handoff.take_tallies()
        batch = Batch()
        samples: list[Sample] = []
        events: list[EventRow] = []
        every = YIELD_EVERY
        for i, item in enumerate(items, 1):
            if isinstance(item, Outcome):
                batch.add(item)
                if not i % every:
                    os.sched_yield()  # the loop's turn (YIELD_EVERY)
            elif isinstance(item, Sample):
                samples.append(item)
            else:
                events.append(item.row())
        self._seq += 1
        records = batch.encode() if len(batch) else b""
        state = self._state  # the plan clock: the loop's last snapshot (attach)
        packet = m.Packet(self._seq, state, tuple(samples), tuple(events), tally, False, records)
        self._unacked.append(_Sent(packet, len(batch)))
        self._out += m.encode(packet)
        self._last_packet = time.monotonic()

    def _died(self, why: str) -> None:
        """The writer is gone: log it, start another after the back-off; what it had not
        committed is sent again then."""
        code = self._disconnect(kill=True)
        delay = self._backoff.died(time.monotonic() - self._started)
        self._restart_at = time.monotonic() + delay
        log.error(
            "journal_writer_died",
            why=why,
            code=code,
            not_committed=sum(s.outcomes for s in self._unacked),
            restart_in_s=delay,
            log=self._log_tail()[-200:] or None,
        )

    def _disconnect(self, *, kill: bool) -> int | None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        self._out.clear()
        self._frames = m.frames()
        return self._reap(kill=kill)

    def _reap(self, *, kill: bool) -> int | None:
        proc, self._proc = self._proc, None
        return None if proc is None else reap(proc, 0.5 if kill else 10.0)

    def _restart(self) -> bool:
        if not self._connect():
            self._restart_at = time.monotonic() + self._backoff.failed()
            return False
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.writer_restarts.inc()
        return True

    def _rejoined(self, committed: int) -> None:
        """A new writer continues the session; the dead one committed the packets up to
        ``committed``: their folds never came back (applied here), the others go again."""
        for sent in list(self._unacked):
            packet = sent.packet
            if packet.seq <= committed:
                if not sent.counted and packet.records:
                    outcomes = Batch.decode(packet.records).outcomes()
                    self._handoff.give_back(fold(outcomes))
                self._unacked.popleft()
            else:
                self._out += m.encode(dataclasses.replace(packet, counted=sent.counted))
        log.warning(
            "journal_writer_restarted",
            session=self.session,
            sent_again=len(self._unacked),
            committed_by_the_last=committed,
        )

    def _lose_rest(self, why: str) -> None:
        """No writer will write what is left: its outcomes are tallied into the metrics (not
        journaled), and the link ends."""
        lost = Fold()
        for sent in self._unacked:
            if not sent.counted and sent.packet.records:
                for o in Batch.decode(sent.packet.records).outcomes():
                    lost.tally(o)
        self._unacked.clear()
        while self._q:
            item = self._q.popleft()
            if type(item) is Outcome:
                lost.tally(item)
        self._handoff.give_back(lost)
        self.unwritten += lost.requests
        log.error("journal_close_incomplete", why=why, unwritten=lost.requests)
        self._finished = True


async def open_journal(
    run_dir: Path,
    run: RunInfo,
    cfg: JournalConfig | None = None,
    *,
    metrics: JournalMetrics | None = None,
    forward: Sequence[FoldSink] = (),
    resume: ResumeState | None = None,
) -> Journal:
    """Open or create ``run_dir/journal.db`` and start its writer (async factory)."""
    journal = Journal(
        run_dir / JOURNAL_FILE, run, cfg, metrics=metrics, forward=forward, resume=resume
    )
    journal._handoff.loop = asyncio.get_running_loop()  # committed folds come back here
    await asyncio.to_thread(journal.start)  # opening may fold a crashed session's rows in
    return journal


__all__ = ["MAX_BATCH", "Journal", "RunInfo", "open_journal"]
