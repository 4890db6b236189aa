"""The runner with send guards: a capped target stops sending, a paused one waits (closed
loop) or skips and counts (open loop). Fake targets, real clock, no network."""

from __future__ import annotations

import structlog

from soakd.config import RateLimit, SpendGuard
from soakd.model import ErrorKind, Outcome, RequestSpec
from soakd.shapes import Closed, Constant, LoadShape
from soakd.types import NotSent
from soakd.workload.guard import Guards, TargetGuard
from soakd.workload.runner import Runner
from tests.fakes import FakeTarget, Prompts, Sink, plan_of


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


class AlwaysBroken:
    """A reader with a bug: raises on every outcome (its message holds a secret)."""

    def record(self, outcome: Outcome) -> None:
        raise ValueError("sk-secret-in-a-message")


async def test_a_raising_sink_hides_no_429_from_the_guard_nor_the_other_sinks() -> None:
    target = RateLimitedTarget("cloud", delay_s=0.001)
    guard = TargetGuard("cloud", SpendGuard(), RateLimit())
    guards, sink = Guards([guard]), Sink()
    runner = Runner(
        plan_of(("p", 500, {"cloud": Closed(1)})),
        {"cloud": target},
        Prompts(),
        [AlwaysBroken(), sink],
        guards=guards,
        max_tokens=8,
        temperature=0.7,
        gates=guards.by_target,
    )
    with structlog.testing.capture_logs() as logs:
        await runner.run()
        await runner.drain(1.0)
    first, second = sink.outcomes[0], sink.outcomes[1]
    assert first.error is ErrorKind.HTTP_429
    assert (second.sent_ns - first.end_ns) / 1e9 >= 0.28  # the guard saw the 429: paused
    assert len(sink.outcomes) > 20  # sending went on, every outcome recorded
    # the guard read every outcome's tokens too, the 429 (no tokens) included
    assert guard.tokens == sum((o.prompt_tokens or 0) + o.output_tokens for o in sink.outcomes)
    assert guard.tokens > 20
    n = len(sink.outcomes)
    assert runner.sink_failures == {"AlwaysBroken": n}
    failed = [e for e in logs if e["event"] == "sink_failed"]
    # rate-limited: the first failure, then one line at each power of two
    assert [e["failures"] for e in failed] == [2**k for k in range(n.bit_length())]
    assert all(e["sink"] == "AlwaysBroken" and e["error"] == "ValueError" for e in failed)
    assert "sk-secret" not in repr(logs)


async def test_guards_see_each_outcome_before_the_sinks() -> None:
    seen: list[str] = []

    class Reader:
        def __init__(self, name: str) -> None:
            self.name = name

        def record(self, outcome: Outcome) -> None:
            seen.append(self.name)

    runner = Runner(
        plan_of(("p", 100, {"a": Closed(1)})),
        {"a": FakeTarget("a", delay_s=0.02)},
        Prompts(),
        [Reader("journal"), Reader("notes")],
        guards=Reader("guards"),
        max_tokens=8,
        temperature=0.7,
    )
    await runner.run()
    await runner.drain(1.0)
    assert len(seen) >= 6
    assert seen == ["guards", "journal", "notes"] * (len(seen) // 3)


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
