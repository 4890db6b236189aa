"""The runner against a fake target: phases, load shapes, drain. No network."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise

import pytest
import structlog

from soakd.model import ErrorKind, Outcome, Plan, RequestSpec
from soakd.shapes import Closed, Constant, Idle
from soakd.workload.runner import Runner
from tests.fakes import MS, FakeTarget, Prompts, Sink, plan_of
from tests.waiting import until


def runner_for(plan: Plan, *targets: FakeTarget) -> tuple[Runner, Sink]:
    sink = Sink()
    runner = Runner(
        plan, {t.name: t for t in targets}, Prompts(), [sink], max_tokens=8, temperature=0.7
    )
    return runner, sink


async def test_closed_loop_phases_and_concurrency() -> None:
    a, b = FakeTarget("a"), FakeTarget("b")
    plan = plan_of(
        ("warm", 200, {"a": Closed(2), "b": Idle()}),
        (
            "hot",
            200,
            {"a": Closed(6), "b": Closed(3)},
        ),
    )
    runner, sink = runner_for(plan, a, b)
    await runner.run()
    await runner.drain(5)
    assert runner.finished
    phases_b = {o.phase for o in sink.outcomes if o.target == "b"}
    assert phases_b == {"hot"}
    assert a.peak == 6
    assert b.peak == 3
    assert all(o.ok for o in sink.outcomes)
    # every target gets the same prompt sequence, in order, from 0
    assert sorted(a.seqs) == list(range(len(a.seqs)))
    assert sorted(b.seqs) == list(range(len(b.seqs)))


async def test_open_loop_rate_and_lag() -> None:
    target = FakeTarget("a", delay_s=0.001)
    plan = plan_of(("steady", 1000, {"a": Constant(rate=200)}))
    runner, sink = runner_for(plan, target)
    await runner.run()
    await runner.drain(5)
    assert len(sink.outcomes) == pytest.approx(200, abs=2)
    # the schedule is the plan's (200 req/s: one every 5 ms, whenever each was sent), and
    # each send's lag is measured from it (its size here: bench/micro.py dispatch)
    scheduled = sorted(o.scheduled_ns for o in sink.outcomes)
    assert {b - a for a, b in pairwise(scheduled)} <= {5 * MS - 1, 5 * MS, 5 * MS + 1}
    assert all(o.sent_ns >= o.scheduled_ns for o in sink.outcomes)
    assert len({o.sent_ns - o.scheduled_ns for o in sink.outcomes}) > 1  # measured, not set


async def stop_with_in_flight(
    target: FakeTarget, streams: int, drain_s: float
) -> tuple[Runner, Sink, int]:
    """A closed loop of ``streams`` on ``target``, stopped once all are in flight, then
    drained within ``drain_s``: the runner, its sink and how many the drain cut."""
    plan = plan_of(("long", 60_000, {"a": Closed(streams)}))
    runner, sink = runner_for(plan, target)
    task = asyncio.create_task(runner.run())
    await until(lambda: target.active == streams)
    runner.stop()
    await task
    return runner, sink, await runner.drain(drain_s)


async def test_stop_drains_in_flight_requests() -> None:
    target = FakeTarget("a", delay_s=0.3)
    runner, sink, cancelled = await stop_with_in_flight(target, 4, 5)
    assert cancelled == 0
    assert not runner.finished
    assert len(sink.outcomes) == 4  # the four in flight finished; none started after stop
    assert all(o.ok for o in sink.outcomes)


async def test_drain_deadline_cancels_and_records() -> None:
    target = FakeTarget("a", delay_s=10)
    runner, sink, cancelled = await stop_with_in_flight(target, 3, 0.1)
    assert cancelled == 3
    assert [o.error for o in sink.outcomes] == [ErrorKind.CANCELLED] * 3
    assert runner.in_flight == {"a": 0}


class EndedTarget(FakeTarget):
    """Fills the Outcome as a worker's answer does (ended, ok), then waits to be woken, as
    a finished request waits for its turn among the parent's wake-ups."""

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = outcome or Outcome.planned(spec)
        o.sent_ns = time.perf_counter_ns()
        o.first_token_ns = o.end_ns = o.sent_ns + MS
        o.status, o.output_tokens = 200, 1
        self.active += 1
        await asyncio.sleep(10)  # not woken before the drain deadline
        return o


async def test_a_request_that_ended_before_the_drain_cut_keeps_its_outcome() -> None:
    """The cut reaches it between its end and its waking: it is counted as it ended, not
    as cancelled."""
    _, sink, _ = await stop_with_in_flight(EndedTarget("a"), 2, 0.1)
    assert [(o.error, o.status) for o in sink.outcomes] == [(None, 200)] * 2


async def test_resume_mid_plan_skips_finished_phases() -> None:
    target = FakeTarget("a")
    plan = plan_of(
        ("one", 200, {"a": Closed(1)}),
        ("two", 200, {"a": Closed(1)}),
    )
    runner, sink = runner_for(plan, target)
    await runner.run(start_offset_ns=250 * MS)
    await runner.drain(5)
    assert {o.phase for o in sink.outcomes} == {"two"}
    # nothing scheduled before the resume point; the session sent for the remaining
    # 150 ms of "two" only (plan time, the basis of every rate)
    assert min(o.scheduled_ns for o in sink.outcomes) >= runner.origin_ns + 250 * MS
    assert runner.active_s() == pytest.approx(0.15)


class DeadTarget(FakeTarget):
    """Fails every request after a millisecond, the same way."""

    def __init__(self, name: str, error: ErrorKind = ErrorKind.CONNECT_REFUSED, status: int = 0):
        super().__init__(name)
        self.error, self.status = error, status

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = outcome or Outcome.planned(spec)
        o.sent_ns = time.perf_counter_ns()
        await asyncio.sleep(0.001)
        o.end_ns = time.perf_counter_ns()
        o.error, o.status = self.error, self.status
        self.seqs.append(spec.seq)
        return o


@pytest.mark.parametrize(
    ("error", "status"),
    [(ErrorKind.CONNECT_REFUSED, 0), (ErrorKind.HTTP_AUTH, 401), (ErrorKind.HTTP_4XX, 404)],
)
async def test_closed_loop_backs_off_from_a_dead_or_misconfigured_target(
    error: ErrorKind, status: int
) -> None:
    target = DeadTarget("a", error, status)
    plan = plan_of(("p", 500, {"a": Closed(2)}))
    runner, sink = runner_for(plan, target)
    await runner.run()
    await runner.drain(5)
    # 50 + 100 + 200 ms pauses fit in 0.5 s: a handful of probes per worker, not thousands
    assert 4 <= len(sink.outcomes) <= 12
    assert all(o.error == error for o in sink.outcomes)


async def test_closed_loop_does_not_back_off_from_answers_about_one_request() -> None:
    """A 400 (this prompt too long) or a 5xx is the server's answer: the loop goes on."""
    target = DeadTarget("a", ErrorKind.HTTP_4XX, 400)
    plan = plan_of(("p", 200, {"a": Closed(2)}))
    runner, sink = runner_for(plan, target)
    await runner.run()
    await runner.drain(5)
    assert len(sink.outcomes) > 12  # more than the backed-off loop above sends in 0.5 s


class FailingSink(Sink):
    """Raises on its ``fail_at``-th outcome (a bug in a reader), records the others."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.seen = 0

    def record(self, outcome: Outcome) -> None:
        self.seen += 1
        if self.seen == self.fail_at:
            raise RuntimeError("sink bug")
        self.outcomes.append(outcome)


class CountingTarget(FakeTarget):
    """Remembers how many requests were in flight when each one was sent."""

    def __init__(self, name: str) -> None:
        super().__init__(name, delay_s=0.01)
        self.active_at_send: list[int] = []

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        self.active_at_send.append(self.active + 1)
        return await super().send(spec, outcome)


class BrokenTarget(CountingTarget):
    """Raises on its ``fail_at``-th send: a target that broke its contract (never raise)."""

    def __init__(self, name: str, fail_at: int) -> None:
        super().__init__(name)
        self.fail_at = fail_at

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        if len(self.active_at_send) + 1 == self.fail_at:
            self.active_at_send.append(self.active + 1)
            raise RuntimeError("target bug")
        return await super().send(spec, outcome)


async def test_a_worker_whose_target_raises_is_logged_and_replaced() -> None:
    target = BrokenTarget("a", fail_at=8)
    plan = plan_of(("p", 400, {"a": Closed(4)}))
    runner = Runner(plan, {"a": target}, Prompts(), [Sink()], max_tokens=8, temperature=0.7)
    with structlog.testing.capture_logs() as logs:
        await runner.run()
        await runner.drain(5)
    failed = [e for e in logs if e["event"] == "worker_failed"]
    assert [e["target"] for e in failed] == ["a"]
    assert runner.failures == {"a": 1}
    # after the failure the pool is whole again: four requests in flight, not three
    after = target.active_at_send[8:]
    assert len(after) > 20
    assert max(after) == 4
    assert after.count(4) > len(after) // 2


async def test_a_sink_that_raises_costs_only_itself() -> None:
    target = CountingTarget("a")
    plan = plan_of(("p", 300, {"a": Closed(4)}))
    broken, after = FailingSink(fail_at=8), Sink()
    exported: list[str] = []
    runner = Runner(
        plan,
        {"a": target},
        Prompts(),
        [broken, after],
        max_tokens=8,
        temperature=0.7,
        on_sink_failure=exported.append,
    )
    with structlog.testing.capture_logs() as logs:
        await runner.run()
        await runner.drain(5)
    sent = len(target.active_at_send)
    assert len(after.outcomes) == sent  # the sink after it missed nothing
    assert len(broken.outcomes) == sent - 1  # the one it raised on, only
    assert runner.failures == {}  # no worker died of it: the pool never shrank
    assert runner.sink_failures == {"FailingSink": 1}
    assert exported == ["FailingSink"]  # soakd_sink_failures_total{sink}
    failed = [e for e in logs if e["event"] == "sink_failed"]
    assert [(e["sink"], e["failures"], e["error"]) for e in failed] == [
        ("FailingSink", 1, "RuntimeError")
    ]
    assert failed[0]["at"].startswith("test_runner.py:")
    assert "sink bug" not in repr(failed)  # the message may hold data: never logged
