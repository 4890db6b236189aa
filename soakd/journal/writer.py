"""Journal writer room, soakd's side: ``Journal``, the sink the run records to (its
outcomes, probe samples and events) on the event loop, and its lifecycle.

The event loop only appends to a bounded deque (``record``, ``sample``, ``event``: a length
check and an append, never IO, never a lock wait); what soakd's process does per outcome is
the append and, in the link thread, copying its record. Everything past the deque is
``WriterLink``'s (link.py): the link thread, the journal's writer process (process.py,
store.py), its restarts. The loop publishes a snapshot of the plan clock for it
(``publish``) and applies each committed batch's fold (soakd/measure/fold.py) to ``Metrics``
and ``RunStats`` in one callback (handoff.py).

What can go wrong, and what is counted (docs/journal.md):

- **Metrics count what the journal holds**: a fold comes back after its commit (store.py),
  or at once while the disk fails, never twice.
- **A full queue** (the writer cannot keep up, or is down): an outcome the deque cannot take
  is tallied (``Fold.tally``), applied to the metrics at once, and its tally travels in the
  next packet into the journal's totals: counted, without a row or a histogram bucket.
- **The writer dies** (a crash, the OOM killer): logged, counted, started again with a
  back-off, and what it had not committed is sent again (link.py). Meanwhile the queue
  fills, then tallies. Packets soakd applied while the disk failed are kept for this at
  most ``journal.queue_size`` outcomes' worth; older ones, if the writer then died too, are
  in the metrics and not in the journal's totals.
- **soakd is SIGKILLed**: the writer gets SIGTERM and ends at once; lost is what it had not
  committed (at most one flush interval) and the packet soakd had not sent (``SEND_EVERY_S``).
- One soakd per run dir: soakd holds the ``flock`` on ``journal.lock`` and the writer holds it
  too (the same open file), so the lock lasts until both are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from soakd.config import JournalConfig
from soakd.journal import messages as m
from soakd.journal.handoff import FoldSink, HandOff
from soakd.journal.link import MAX_PACKET, SEND_EVERY_S, WriterLink
from soakd.journal.messages import Restored, RunInfo
from soakd.journal.metrics import JournalMetrics
from soakd.journal.progress import ClockState, PlanClock
from soakd.journal.records import Event, RunStopped, Stamped
from soakd.journal.resume import ResumeState, take_lock
from soakd.journal.schema import JOURNAL_FILE
from soakd.journal.store import MAX_BATCH
from soakd.measure.fold import Fold
from soakd.model import Outcome, Sample

log = structlog.get_logger()


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
        self._resumed = resume is not None
        self._wall = wall
        limit = self.cfg.queue_size
        self._handoff = HandOff(limit, min(MAX_PACKET, limit // 2), forward)
        self._q = self._handoff.records  # the hot path's one attribute lookup
        self._closed = False
        self._tally = Fold()  # outcomes the queue could not take, not yet applied
        self._tally_due = False
        self._drop_logged = False
        self._clock: PlanClock | None = None  # the runner: read on the loop only
        self._publisher: asyncio.TimerHandle | None = None
        self._lock_fd: int | None = None
        self.restored: Restored | None = None  # what the journal held (start)
        self.session = 0
        hello = m.Hello(
            str(path),
            run,
            m.WriterConfig.of(self.cfg),
            None if resume is None else m.Resume.of(resume),
            0,  # a new session: the writer numbers it
        )
        self.link = WriterLink(hello, self._handoff, metrics)
        self._wake = self.link.wake

    @property
    def unwritten(self) -> int:
        """Records the journal could not write at all (known once closed)."""
        return self.link.unwritten

    @property
    def restarts(self) -> int:
        """How many times the writer process was started again."""
        return self.link.restarts

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
        try:
            ready = self.link.start(fd)
        except BaseException:
            self._unlock()
            raise
        restored = self.restored = ready.restored
        self.session = ready.session
        metrics = self.metrics
        if metrics is not None:
            metrics.downtime.inc(restored.downtime_s)  # continue the run's own counters too
            metrics.resumes.inc(restored.resumes + self._resumed)

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
            self.link.clock = ClockState.of(self._clock)

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
        self.link.stop()
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
