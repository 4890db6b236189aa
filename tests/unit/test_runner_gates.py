"""The runner with send guards: a capped target stops sending, a paused one waits (closed
loop) or skips and counts (open loop). Fake targets, real clock, no network."""

from __future__ import annotations

from soakd.config import RateLimit, SpendGuard
from soakd.model import ErrorKind, Outcome, RequestSpec
from soakd.types import NotSent
from soakd.workload.guard import Guards, TargetGuard
from soakd.workload.runner import Runner
from soakd.workload.shapes import Closed, Constant, LoadShape
from tests.unit.test_runner import FakeTarget, Prompts, Sink, plan_of


class RateLimitedTarget(FakeTarget):
    """Answers 429 with Retry-After to its first request, then 200s."""

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = await super().send(spec, outcome)
        if spec.seq == 0:
            o.status, o.error, o.retry_after_s, o.output_tokens = 429, ErrorKind.HTTP_429, 0.3, 0
        return o


def run_with(
    guard: TargetGuard, target: FakeTarget, shape: LoadShape, ms: int
) -> tuple[Runner, Sink]:
    guards, sink = Guards([guard]), Sink()
    plan = plan_of(("p", ms, {target.name: shape}))
    runner = Runner(
        plan,
        {target.name: target},
        Prompts(),
        [sink, guards],
        max_tokens=8,
        temperature=0.7,
        gates=guards.by_target,
    )
    return runner, sink


async def test_request_cap_stops_a_closed_loop_exactly() -> None:
    target = FakeTarget("cloud", delay_s=0.005)
    guard = TargetGuard("cloud", SpendGuard(max_requests=7), RateLimit())
    runner, sink = run_with(guard, target, Closed(4), 400)
    await runner.run()
    await runner.drain(1.0)
    assert len(sink.outcomes) == 7  # four workers, never one more than the cap
    assert guard.paused == ("spend_cap",)


async def test_request_cap_in_open_loop_skips_and_counts() -> None:
    target = FakeTarget("cloud", delay_s=0.001)
    guard = TargetGuard("cloud", SpendGuard(max_requests=5), RateLimit())
    runner, sink = run_with(guard, target, Constant(rate=100), 300)
    await runner.run()
    await runner.drain(1.0)
    assert len(sink.outcomes) == 5
    # the 30 planned instants: 5 made, every other one counted under the pause's reason
    assert runner.ledger.counts == {("cloud", "p", "spend_cap"): 25}


async def test_retry_after_pauses_closed_loop_workers() -> None:
    target = RateLimitedTarget("cloud", delay_s=0.001)
    guard = TargetGuard("cloud", SpendGuard(), RateLimit())
    runner, sink = run_with(guard, target, Closed(1), 500)
    await runner.run()
    await runner.drain(1.0)
    first, second = sink.outcomes[0], sink.outcomes[1]
    assert first.error is ErrorKind.HTTP_429  # counted, not hidden
    gap_s = (second.sent_ns - first.end_ns) / 1e9
    assert gap_s >= 0.28  # the 0.3 s asked for, never less (the loop's clock granularity)
    assert len(sink.outcomes) > 20  # and sending went on afterwards


class SometimesUnsent(FakeTarget):
    """Every third request never leaves soakd (as when no sender process is up)."""

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        if spec.seq % 3 == 2:
            raise NotSent("no_worker")
        return await super().send(spec, outcome)


async def test_a_request_that_never_left_is_a_send_not_made_not_an_outcome() -> None:
    target = SometimesUnsent("edge", delay_s=0.001)
    sink = Sink()
    runner = Runner(
        plan_of(("p", 300, {"edge": Constant(rate=100)})),
        {"edge": target},
        Prompts(),
        [sink],
        max_tokens=8,
        temperature=0.7,
    )
    await runner.run()
    await runner.drain(1.0)
    unsent = runner.ledger.counts.get(("edge", "p", "no_worker"), 0)
    assert unsent == 10  # seq 2, 5, ... 29 of the 30 instants
    assert len(sink.outcomes) == 20  # offered = sent + not made, nothing counted twice
    assert all(o.seq % 3 != 2 for o in sink.outcomes)
