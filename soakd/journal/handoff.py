"""Journal hand-off room: the one queue between the event loop and the writer, both ways.

No lock on the loop's side:

- **loop -> writer**: ``records``, a deque of ``Outcome``, ``Sample`` or ``Stamped`` (an
  event of records.py, stamped when it happened). Only the loop appends, only the writer
  pops (``take``); a deque's append and popleft are thread-safe (the deque's documented
  guarantee). The bound is the loop's own length check against ``limit``
  (``Journal.record`` tallies beyond it); ``wake`` rouses the writer early once ``wake_at``
  records wait. ``tallies``: the folds of the outcomes the loop could not queue (counted,
  no row), for the journal's totals.
- **writer -> loop**: ``give_back`` hands a batch's ``Fold`` (soakd/measure/fold.py), once
  it is committed (or at once when the disk fails: measuring never waits for it), to the
  loop that opened the journal, where every ``forward`` sink applies it in one callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from soakd.journal.records import Stamped
from soakd.measure.fold import Fold
from soakd.model import Outcome, Sample

Queued = Outcome | Sample | Stamped
"""What the loop queues for the journal: a request, a probe reading, an event."""


class FoldSink(Protocol):
    """What applies a batch's fold: ``Metrics`` and ``RunStats``, on the event loop."""

    def apply(self, f: Fold) -> None: ...


class HandOff:
    """The journal's queue, both ways (see the module's docstring)."""

    def __init__(self, limit: int, wake_at: int, forward: Sequence[FoldSink]) -> None:
        self.records: deque[Queued] = deque()
        self.tallies: deque[Fold] = deque()
        self.limit = limit
        self.wake_at = wake_at
        self.wake = threading.Event()
        self.forward = tuple(forward)
        self.loop: asyncio.AbstractEventLoop | None = None

    def take(self, most: int) -> list[Queued]:
        """Writer: up to ``most`` records, oldest first."""
        q = self.records
        return [q.popleft() for _ in range(min(len(q), most))]

    def take_tallies(self) -> Fold | None:
        """Writer: the tallied outcomes' folds handed over so far, merged."""
        if not self.tallies:
            return None
        merged = Fold()
        while self.tallies:
            merged.merge(self.tallies.popleft())
        return merged

    def give_back(self, f: Fold) -> None:
        """Writer: a batch's fold to the sinks, on the loop (now when there is none)."""
        if not f or not self.forward:
            return
        loop = self.loop
        if loop is None:
            self.apply(f)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing reads it
            loop.call_soon_threadsafe(self.apply, f)

    def apply(self, f: Fold) -> None:
        for sink in self.forward:
            sink.apply(f)
