"""Journal hand-off room: the one queue between the event loop and the writer thread.

Both directions, no lock on the loop's side:

- **loop -> thread**: ``records``, a deque of ``Outcome``, ``Sample`` or an event tuple
  ``("event", wall, offset_ns, kind, data)``. Only the loop appends, only the writer thread
  pops (``take``); a deque's append and popleft are atomic under the GIL. The bound is the
  loop's own length check against ``limit`` (``Journal.record`` drops and counts beyond
  it); ``wake`` rouses the thread early once ``wake_at`` records wait.
- **thread -> loop**: ``give_back`` queues committed outcomes in slices of ``PUMP_SLICE``
  and schedules ``pump_slice`` on the loop that opened the journal, which feeds them to
  ``forward`` (Metrics) one slice per callback. Outcomes the loop already forwarded while
  the disk was failing (``forward_early``) are not forwarded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import Any

from soakd.model import Outcome
from soakd.types import OutcomeSink

PUMP_SLICE = 8
"""Committed outcomes handed to Metrics per event-loop callback."""


class HandOff:
    """The journal's queue, both ways (see the module's docstring)."""

    def __init__(self, limit: int, wake_at: int, forward: OutcomeSink | None) -> None:
        self.records: deque[Any] = deque()
        self.limit = limit
        self.wake_at = wake_at
        self.wake = threading.Event()
        self.forward = forward
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done: deque[list[Outcome]] = deque()
        self._pump_scheduled = False
        self._early: set[int] = set()  # ids of outcomes forwarded before their commit

    # --- loop -> thread ---

    def take(self, most: int) -> list[Any]:
        """Writer thread: up to ``most`` records, oldest first."""
        q = self.records
        return [q.popleft() for _ in range(min(len(q), most))]

    def forward_early(self, outcome: Outcome) -> None:
        """Loop: forward now (the disk is failing: metrics must not wait for it, nor freeze
        until the queue fills); once committed, ``give_back`` does not count it twice."""
        assert self.forward is not None
        self._early.add(id(outcome))
        self.forward.record(outcome)

    # --- thread -> loop ---

    def give_back(self, outcomes: list[Outcome]) -> None:
        """Writer thread: give committed outcomes back to the loop."""
        early = self._early
        if early:  # forwarded by record() while the disk was failing
            kept = []
            for o in outcomes:
                if id(o) in early:
                    early.discard(id(o))
                else:
                    kept.append(o)
            outcomes = kept
        if not outcomes or self.forward is None:
            return
        for i in range(0, len(outcomes), PUMP_SLICE):
            self._done.append(outcomes[i : i + PUMP_SLICE])
        loop = self.loop
        if loop is None:
            self.pump()
            return
        if not self._pump_scheduled:
            self._pump_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: close() pumps
                loop.call_soon_threadsafe(self.pump_slice)

    def pump(self) -> None:
        """On the loop (or after the thread ended): every committed outcome to ``forward``."""
        self._pump_scheduled = False
        sink = self.forward
        while self._done:
            try:
                batch = self._done.popleft()
            except IndexError:  # emptied by a pump on another thread meanwhile
                return
            if sink is not None:
                for o in batch:
                    sink.record(o)

    def pump_slice(self) -> None:
        """On the loop: one slice of committed outcomes to Metrics, then yield.

        A whole commit (up to half a second of outcomes) in one callback held the loop
        ~5-10 ms at 500 req/s, stamping tokens read meanwhile late. Slices of 64 still
        held it up to 2.9 ms (TTFT p99 error 7-11 ms with the client on one core); slices
        of ``PUMP_SLICE`` = 8 took that to 1.5-2.0 ms (docs/benchmarks.md, "Many cores")."""
        self._pump_scheduled = False
        try:
            batch = self._done.popleft()
        except IndexError:
            return
        sink = self.forward
        if sink is not None:
            for o in batch:
                sink.record(o)
        if self._done and not self._pump_scheduled and self.loop is not None:
            self._pump_scheduled = True
            self.loop.call_soon(self.pump_slice)
