"""Runner: drives the plan. Phases in order, one load driver per target, every outcome to the sinks.

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
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import structlog

from soakd.model import ErrorKind, LoadShape, Outcome, Phase, Plan, RequestSpec
from soakd.types import OutcomeSink, SendGate, Target
from soakd.workload.arrivals import arrivals
from soakd.workload.prompts import PromptSource
from soakd.workload.timer import sleep_until_ns

log = structlog.get_logger()


_UNREACHABLE = frozenset(
    {ErrorKind.CONNECT_REFUSED, ErrorKind.CONNECT_ERROR, ErrorKind.TIMEOUT_CONNECT}
)


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
        max_tokens: int,
        temperature: float,
        seed: int = 0,
        on_phase: Callable[[Phase | None], None] | None = None,
        start_seq: dict[str, int] | None = None,
        gates: Mapping[str, SendGate] | None = None,
    ) -> None:
        self.plan = plan
        self.targets = targets
        self.prompts = prompts
        self._record = [s.record for s in sinks]
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self._on_phase = on_phase
        self.origin_ns = 0  # monotonic instant of plan offset 0
        self._start_offset_ns = 0  # plan offset this session started at (a resume: > 0)
        self.phase: Phase | None = None
        self.finished = False
        self._stop = asyncio.Event()
        self._seq = dict.fromkeys(targets, 0)  # a resumed run continues its numbers
        self._seq.update({k: v for k, v in (start_seq or {}).items() if k in targets})
        self._busy = dict.fromkeys(targets, 0)  # in flight per target
        self._freed = {name: asyncio.Event() for name in targets}  # a request of it ended
        self._pools = {name: _Pool() for name in targets}  # closed-loop workers
        self._drivers: set[asyncio.Task[None]] = set()  # open-loop dispatchers
        self._requests: set[asyncio.Task[Any]] = set()  # requests and closed-loop workers
        self._gates = dict(gates or {})  # spend caps and Retry-After pauses, per target

    # --- clock --------------------------------------------------------------------------

    def offset_ns(self) -> int:
        """Plan time elapsed (real ns since offset 0; resumes start past 0)."""
        return now_ns() - self.origin_ns if self.origin_ns else 0

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def next_seq(self) -> dict[str, int]:
        """The next prompt seq per target (the journal stores it for a resume)."""
        return self._seq

    @property
    def in_flight(self) -> dict[str, int]:
        """Requests sent and not finished, per target (read by the in-flight gauge)."""
        return self._busy

    # --- control ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop sending. In-flight requests go on; ``drain`` waits for them."""
        if not self._stop.is_set():
            self._stop.set()
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
        self._enter(None)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for in-flight requests, then cancel the rest.

        Returns how many had to be cancelled (they are recorded as ``cancelled``)."""
        self.stop()
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
        pool.want = shape.concurrency if shape.mode == "closed" else 0
        # only the missing workers are started: the ones still finishing the previous
        # phase's request carry on, so concurrency never overshoots at a boundary
        for _ in range(pool.want - pool.workers):
            pool.workers += 1
            self._spawn(self._requests, self._closed_worker(name, pool))
        if shape.mode in ("constant", "poisson", "ramp"):
            self._spawn(self._drivers, self._open_loop(name, shape, phase))

    def _spawn(self, into: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    def _spec(self, name: str, phase: Phase, scheduled_ns: int) -> RequestSpec:
        seq = self._seq[name]
        self._seq[name] = seq + 1
        prompt, tokens = self.prompts.spec_fields(seq)
        return RequestSpec(
            name, phase.name, seq, prompt, tokens, self.max_tokens, self.temperature, scheduled_ns
        )

    async def _one(self, name: str, spec: RequestSpec) -> Outcome:
        self._busy[name] += 1
        outcome = Outcome.planned(spec)
        try:
            await self.targets[name].send(spec, outcome)
        except asyncio.CancelledError:
            # only past the drain deadline: keep what arrived, say it was cut, let go
            outcome.error = ErrorKind.CANCELLED
            outcome.end_ns = outcome.end_ns or now_ns()
            for record in self._record:
                record(outcome)
            raise
        finally:
            self._busy[name] -= 1
            self._freed[name].set()
        for record in self._record:
            record(outcome)
        return outcome

    async def _closed_worker(self, name: str, pool: _Pool) -> None:
        """Send, wait, send again, while the pool wants this many workers.

        After a connection failure the worker pauses (50 ms doubling to 1 s) before its
        next send: a dead target is then probed a few times a second, not hammered
        thousands of times (every failure is still recorded)."""
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
                outcome = await self._one(name, self._spec(name, pool.phase, now_ns()))
                if outcome.error in _UNREACHABLE:
                    pause = min(1.0, pause * 2 or 0.05)
                    await self._sleep_until(now_ns() + int(pause * 1e9))
                else:
                    pause = 0.0
        finally:
            pool.workers -= 1

    async def _open_loop(self, name: str, shape: LoadShape, phase: Phase) -> None:
        """Send at the planned instants. Never skips one: when soakd falls behind, the
        requests go out late and the lag is measured (no coordinated omission)."""
        start_abs = self.origin_ns + phase.start_ns
        # a resumed run enters mid-phase: skip the instants already past
        # (the resume point, not "now": the driver task starts a little after the phase,
        # and a busy loop later still; an instant it finds past is sent late, not skipped)
        skip_before = max(0, self.origin_ns + self._start_offset_ns - start_abs)
        # the same instants for every target with the same shape: a fair A/B
        rng = random.Random(f"{self.seed}/{phase.index}")
        cap = shape.max_in_flight
        gate = self._gates.get(name)
        for offset in arrivals(shape, phase.duration_ns, rng):
            if offset < skip_before:
                continue
            due = start_abs + offset
            await sleep_until_ns(due)  # sub-ms (timerfd); asyncio.sleep wakes 0-1 ms late
            while cap and self._busy[name] >= cap:  # late, and the lag will say so
                freed = self._freed[name]
                freed.clear()
                await freed.wait()
            if gate is not None:
                if gate.delay_s() > 0:  # paused: this send is not made, and counted as such
                    gate.skipped()
                    continue
                gate.sent()
            self._spawn(self._requests, self._one(name, self._spec(name, phase, due)))
