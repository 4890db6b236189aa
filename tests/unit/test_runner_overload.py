"""The open loop past soakd's own capacity: every planned instant is sent or counted as
missed (with its reason), the loop stays responsive, and the in-flight cap holds at the
spawn. Fake targets, no network; the counts are exact for the constant shape."""

from __future__ import annotations

import asyncio
import gc
import random

from soakd.model import Outcome, RequestSpec
from soakd.shapes import Closed, Constant, LoadShape
from soakd.workload.arrivals import arrivals
from soakd.workload.runner import Runner
from soakd.workload.timer import sleep_until_ns
from tests.fakes import MS, FakeTarget, Prompts, Sink, plan_of


def planned(shape: LoadShape, ms: int) -> int:
    return sum(1 for _ in arrivals(shape, ms * MS, random.Random(0)))


async def run_plan(runner: Runner, ms: int) -> int:
    """Run the plan while a heartbeat task counts its own turns (the loop's liveness)."""
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            await asyncio.sleep(0.005)
            beats += 1

    hb = asyncio.create_task(heartbeat())
    await runner.run()
    await runner.drain(5)
    hb.cancel()
    return beats


async def test_a_rate_far_past_capacity_is_counted_not_hung() -> None:
    target = FakeTarget("a", delay_s=0.001)
    shape = Constant(rate=2_000_000, max_in_flight=64, max_lateness_ns=20 * MS)
    plan = plan_of(("flood", 300, {"a": shape}))
    sink = Sink()
    runner = Runner(plan, {"a": target}, Prompts(), [sink], max_tokens=8, temperature=0.7)
    beats = await run_plan(runner, 300)
    offered = planned(shape, 300)  # 600,000 instants
    missed = runner.ledger.by_target()["a"]
    assert len(sink.outcomes) + sum(missed.values()) == offered  # none lost, none twice
    assert missed["late"] > offered // 2  # most could not be made, and say so
    assert target.peak <= 64  # the cap is counted at the spawn
    assert beats >= 5  # the loop kept turning: other tasks ran throughout


async def test_a_full_in_flight_cap_misses_sends_instead_of_queueing_them() -> None:
    target = FakeTarget("a", delay_s=0.2)  # slow: the cap stays full
    shape = Constant(rate=200, max_in_flight=3)
    plan = plan_of(("capped", 300, {"a": shape}))
    sink = Sink()
    runner = Runner(plan, {"a": target}, Prompts(), [sink], max_tokens=8, temperature=0.7)
    await run_plan(runner, 300)
    missed = runner.ledger.by_target()["a"]
    assert target.peak == 3
    assert missed.get("in_flight_cap", 0) > 0
    assert len(sink.outcomes) + sum(missed.values()) == planned(shape, 300)
    # what was sent went out on time: a send that finds the cap full is not made late
    assert max(o.dispatch_lag_ns for o in sink.outcomes) < 100 * MS


class GateTarget(FakeTarget):
    """Holds every request until ``release`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name, delay_s=0)
        self.release = asyncio.Event()

    async def send(self, spec, outcome=None):  # type: ignore[no-untyped-def]
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self.release.wait()
        finally:
            self.active -= 1
        return await super().send(spec, outcome)


async def test_a_huge_closed_loop_grows_without_holding_the_loop() -> None:
    target = GateTarget("a")
    plan = plan_of(("wide", 600_000, {"a": Closed(5000)}))
    sink = Sink()
    runner = Runner(plan, {"a": target}, Prompts(), [sink], max_tokens=8, temperature=0.7)
    run = asyncio.create_task(runner.run())
    turns_while_growing = 0
    while target.active < 5000:  # every worker started, and this task ran in between
        await asyncio.sleep(0)
        turns_while_growing += 1
    assert turns_while_growing > 5000 // 64 // 2  # the pool grew a batch per loop turn
    assert runner.in_flight == {"a": 5000}
    runner.stop()
    target.release.set()
    await run
    assert await runner.drain(5) == 0
    assert len(sink.outcomes) == 5000  # the ones in flight finished; none after the stop
    assert runner.in_flight == {"a": 0}


class AheadTarget(FakeTarget):
    """Takes requests early and sends each at its instant, as a worker process does."""

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        await sleep_until_ns(spec.scheduled_ns)
        return await super().send(spec, outcome)


async def test_requests_handed_over_ahead_are_not_in_flight_for_the_cap() -> None:
    """With a 100 ms lead, ten requests wait for their instants at any moment; the cap of
    4 is compared with what was really sent (about one at a time here), so nothing is
    missed. Counted with the waiting ones, the cap would miss nearly every send; only a
    loop stalled for over 30 ms (four instants due at once) could fill it honestly."""
    target = AheadTarget("a", delay_s=0.001)
    shape = Constant(rate=100, max_in_flight=4)
    gc.disable()  # a full collection late in a long pytest process can stall the loop 30 ms
    try:
        await _run_ahead(target, shape)
    finally:
        gc.enable()


async def _run_ahead(target: AheadTarget, shape: LoadShape) -> None:
    plan = plan_of(("ahead", 500, {"a": shape}))
    sink = Sink()
    runner = Runner(
        plan, {"a": target}, Prompts(), [sink], max_tokens=8, temperature=0.7, lead_ns=100 * MS
    )
    await run_plan(runner, 500)
    assert runner.ledger.by_target().get("a", {}) == {}
    assert len(sink.outcomes) == planned(shape, 500)
    assert target.peak <= 4
