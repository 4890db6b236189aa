"""Journal link room: ``WriterLink``, soakd's side of the journal's writer process: the link
thread and the process it starts, watches and starts again.

The loop only queues (``Journal``, writer.py, and the hand-off's deque, handoff.py). The
link thread takes what is queued every ``SEND_EVERY_S``, puts the outcomes' records in a
batch (batch.py: a worker's record is copied as it came, soakd/outcome_record.py) and sends
them, with the samples, the events and the loop's last snapshot of the plan clock
(``clock``), as one numbered ``Packet`` (messages.py). It reads what the writer sends back:
each batch's fold, handed to the loop (``HandOff.give_back``) once committed, or at once
while the disk fails; the writer's own counts (into ``JournalMetrics``) and its log events
(logged here as soakd's own). The writer's Python (rows, folds, SQLite) never holds soakd's
GIL.

The writer process (process.py) is started with soakd/spawn.py's ``start_module`` (from this
thread: it ties itself to soakd, soakd/lifeline.py) and holds the run dir's lock with soakd
(the same open file). When it dies it is logged (``journal_writer_died``), counted
(``soakd_journal_writer_restarts_total``) and started again after soakd/spawn.py's
``Backoff``, the workers' own; the new one continues the session and says which packets
the dead one committed (``Ready.packet_seq``): their folds, which never came back, are
applied here, the others are sent again (``counted``: their folds were applied already,
the disk failing; written, not sent back). What no writer will write is tallied into the
metrics (``_lose_rest``) and counted as ``unwritten``.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from soakd import framing
from soakd.childlog import relog
from soakd.journal import messages as m
from soakd.journal.batch import Batch
from soakd.journal.handoff import HandOff
from soakd.journal.metrics import JournalMetrics
from soakd.journal.progress import ClockState
from soakd.journal.records import EventRow
from soakd.journal.schema import JournalError
from soakd.measure.fold import Fold, fold
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


@dataclass(slots=True)
class _Writer:
    """One writer process, ready, and its socket."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    frames: framing.Frames
    started: float  # monotonic
    out: bytearray = field(default_factory=bytearray)  # to send, in order


class WriterLink:
    """The link thread and the writer process (see the module's doc). ``start`` once, from
    the loop's side; ``wake`` when the queue fills; ``stop`` to write everything and end."""

    def __init__(self, hello: m.Hello, handoff: HandOff, metrics: JournalMetrics | None) -> None:
        self.hello = hello  # its session: 0 until the first writer opened one
        self.handoff = handoff
        self.metrics = metrics
        self.clock: ClockState | None = None  # the loop's last snapshot (Journal.publish)
        self.restarts = 0
        self.unwritten = 0  # records the journal could not write at all
        self._log_path = Path(hello.path).parent / WRITER_LOG
        self._backoff = Backoff()
        self._thread: threading.Thread | None = None
        self._answered = threading.Event()
        self._first: m.Ready | m.Failed | None = None  # the first writer's answer
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock_fd = -1
        self._writer: _Writer | None = None  # None: down (started again at _restart_at)
        self._restart_at = 0.0
        self._unacked: deque[_Sent] = deque()
        self._seq = 0
        self._last_packet = 0.0
        self._close_by: float | None = None  # CLOSE sent: kill the writer after this
        self._finished = False

    @property
    def pid(self) -> int | None:
        """The writer process's pid while one is up."""
        w = self._writer
        return None if w is None else w.proc.pid

    def start(self, lock_fd: int) -> m.Ready:
        """Start the link thread and the first writer, which opens (or creates) the journal
        (it inherits ``lock_fd``, the run dir's lock); what it found, or JournalError."""
        self._lock_fd = lock_fd
        ctx = contextvars.copy_context()  # the run's log context, for the writer's lines
        thread = self._thread = threading.Thread(
            target=ctx.run, args=(self._run,), name="soakd-journal", daemon=True
        )
        thread.start()
        self._answered.wait()
        first = self._first
        if not isinstance(first, m.Ready):
            thread.join()
            raise JournalError(first.error if first is not None else "no answer")
        return first

    def wake(self) -> None:
        """Rouse the link thread now (the queue is filling, or closing)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def stop(self) -> None:
        """Send everything queued, close the writer (its last commit); blocks."""
        self._stopping.set()
        self.wake()
        if self._thread is not None:
            self._thread.join()

    # --- the link thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            try:
                self._connect()
            except Exception as exc:  # handed to start(), which raises it
                self._disconnect(kill=True)
                why = f"{self.hello.path}: cannot start the journal's writer: {exc}"
                self._first = m.Failed(why)
            self._answered.set()
            if not isinstance(self._first, m.Ready):
                return
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
        ``_first``, or logged when it is a restart) when it does not."""
        first = self._first is None
        ours, theirs = socket_pair()
        with theirs:
            fd = theirs.fileno()
            proc = start_module(
                "soakd.journal.process",
                str(fd),
                str(os.getpid()),  # it dies with soakd (soakd/lifeline.py)
                log_path=self._log_path,
                pass_fds=(fd, self._lock_fd),  # the lock lasts while it runs
            )
        started = time.monotonic()
        ours.settimeout(START_TIMEOUT_S)
        frames = m.frames()
        answer: m.Ready | m.Failed | None = None
        after: list[m.Message] = []  # what came with the answer
        try:
            ours.sendall(m.encode(self.hello))
            while answer is None:
                data = ours.recv(SOCKET_BUFFER)
                if not data:
                    break
                for msg in _decoded(frames.feed(data)):
                    if answer is not None:
                        after.append(msg)
                    elif isinstance(msg, m.Log):
                        relog(msg.level, msg.event, msg.fields)
                    elif isinstance(msg, m.Ready | m.Failed):
                        answer = msg
        except (OSError, m.LinkError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            why = "it exited before it was ready"
        if not isinstance(answer, m.Ready):
            reason = answer.error if answer is not None else f"{why}: {self._log_tail()}"
            ours.close()
            reap(proc, 0.5)
            if first:
                self._first = m.Failed(reason)
            else:
                log.error("journal_writer_restart_failed", error=reason[:300])
            return False
        ours.setblocking(False)
        self._writer = _Writer(proc, ours, frames, started)
        if first:
            self._first = answer
            self.hello = dataclasses.replace(self.hello, session=answer.session)
        else:
            self._rejoined(answer.packet_seq)
        for msg in after:
            self._dispatch(msg)
        return True

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self._log_path.read_text(errors="replace").strip()[-300:]
        return ""

    def _turn(self) -> None:
        """One turn of the link: read, write, pack what is queued."""
        w = self._writer
        now = time.monotonic()
        if w is None:  # the writer is down
            if self._stopping.is_set() or now >= self._restart_at:
                if not self._restart():
                    if self._stopping.is_set():
                        self._lose_rest("the journal's writer could not be started again")
                    return
            else:
                wait = min(SEND_EVERY_S, self._restart_at - now)
                ready, _, _ = select.select([self._wake_r], [], [], wait)
                if ready:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
                return
            w = self._writer
            assert w is not None  # _restart() connected one
        fd = w.sock.fileno()
        readable, writable, _ = select.select(
            [fd, self._wake_r], [fd] if w.out else [], [], SEND_EVERY_S
        )
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError, OSError):
                os.read(self._wake_r, 4096)
        if fd in readable and not self._read(w):
            return
        if writable or w.out:
            try:
                sent = w.sock.send(w.out)
                del w.out[:sent]
            except BlockingIOError:
                pass
            except OSError as exc:
                self._died(f"{type(exc).__name__}: {exc}")
                return
        self._send_more(w, time.monotonic())

    def _send_more(self, w: _Writer, now: float) -> None:
        """Pack what is queued (or the plan clock alone) while the writer keeps up; when
        stopping and nothing is left, CLOSE, and wait for CLOSED at most CLOSE_TIMEOUT_S."""
        stopping = self._stopping.is_set()
        q, tallies = self.handoff.records, self.handoff.tallies
        if self.metrics is not None:  # set here, by the one thread that drains the queue
            self.metrics.queue_depth.set(len(q))
        if len(w.out) < OUT_LIMIT and self._close_by is None:
            due = now - self._last_packet >= SEND_EVERY_S or len(q) >= MAX_PACKET
            if stopping or (due and (q or tallies)):
                self._pack(w)
            elif now - self._last_packet >= CLOCK_EVERY_S:
                self._pack(w)  # the plan clock alone
        if stopping and self._close_by is None and not q and not tallies:
            w.out += m.encode(m.Close())
            self._close_by = now + CLOSE_TIMEOUT_S
        if self._close_by is not None and now > self._close_by:
            self._disconnect(kill=True)
            self._lose_rest(f"the journal's writer did not finish in {CLOSE_TIMEOUT_S:g} s")

    def _read(self, w: _Writer) -> bool:
        """What the writer sent; False when it is gone (handled)."""
        try:
            data = w.sock.recv(SOCKET_BUFFER)
        except BlockingIOError:
            return True
        except OSError as exc:
            self._died(f"{type(exc).__name__}: {exc}")
            return False
        if not data:
            if not self._finished:
                self._died("its socket closed")
            return False
        try:
            msgs = _decoded(w.frames.feed(data))
        except m.LinkError as exc:
            self._died(str(exc))
            return False
        for msg in msgs:
            self._dispatch(msg)
        return True

    def _dispatch(self, msg: m.Message) -> None:
        if isinstance(msg, m.Folded):
            self.handoff.give_back(msg.fold)
            if msg.committed:
                self._acked(msg.through)
            else:
                for sent in self._unacked:
                    if sent.packet.seq <= msg.through:
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
        while kept > self.handoff.limit and unacked and unacked[0].counted:
            kept -= unacked.popleft().outcomes

    def _pack(self, w: _Writer) -> None:
        """Take what is queued (up to MAX_PACKET records) and append it as one packet."""
        items = self.handoff.take(MAX_PACKET)
        tally = self.handoff.take_tallies()
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
        clock = self.clock  # the loop's last snapshot (Journal.attach)
        packet = m.Packet(self._seq, clock, tuple(samples), tuple(events), tally, False, records)
        self._unacked.append(_Sent(packet, len(batch)))
        w.out += m.encode(packet)
        self._last_packet = time.monotonic()

    def _died(self, why: str) -> None:
        """The writer is gone: log it, start another after the back-off; what it had not
        committed is sent again then."""
        w = self._writer
        lived = time.monotonic() - w.started if w is not None else 0.0
        code = self._disconnect(kill=True)
        delay = self._backoff.died(lived)
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
        """Close the writer's socket and reap it (``kill``: at once); its exit code."""
        w, self._writer = self._writer, None
        if w is None:
            return None
        with contextlib.suppress(OSError):
            w.sock.close()
        return reap(w.proc, 0.5 if kill else 10.0)

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
        w = self._writer
        assert w is not None  # just connected
        for sent in list(self._unacked):
            packet = sent.packet
            if packet.seq <= committed:
                if not sent.counted and packet.records:
                    outcomes = Batch.decode(packet.records).outcomes()
                    self.handoff.give_back(fold(outcomes))
                self._unacked.popleft()
            else:
                w.out += m.encode(dataclasses.replace(packet, counted=sent.counted))
        log.warning(
            "journal_writer_restarted",
            session=self.hello.session,
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
        q = self.handoff.records
        while q:
            item = q.popleft()
            if type(item) is Outcome:
                lost.tally(item)
        self.handoff.give_back(lost)
        self.unwritten += lost.requests
        log.error("journal_close_incomplete", why=why, unwritten=lost.requests)
        self._finished = True


def _decoded(frames: list[tuple[int, bytes]]) -> list[m.Message]:
    """The messages of the frames read; LinkError when one is none."""
    return [m.decode(kind, payload) for kind, payload in frames]
