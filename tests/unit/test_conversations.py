"""Multi-turn conversations through the runner (soakd/workload/talks.py), the messages a
sender's Builder makes of each turn (soakd/workload/build.py). No network: a target here
builds each turn's messages as a sending process would, and answers with text of its own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from soakd.config import (
    ConfigError,
    Conversations,
    ThinkTime,
    TokenLength,
    TurnCount,
    Workload,
    config_from_dict,
    load_config,
)
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome, RequestSpec
from soakd.shapes import Closed, Constant
from soakd.workload.build import Builder, Message
from soakd.workload.conversations import conversation_key, make_conversations
from soakd.workload.runner import Runner
from tests.fakes import Prompts, Sink, plan_of


def workload(turns: int = 4, think: float = 0.0, on_failure: str = "end") -> Workload:
    return Workload(
        seed=7,
        conversations=Conversations(
            turns=TurnCount(mean=turns),
            user_tokens=TokenLength(dist="uniform", min=5, max=40),
            think_time=ThinkTime(mean=think),
            on_failure=on_failure,  # type: ignore[arg-type]
        ),
    )


class Talker:
    """A chat server in a box: builds each request's messages with a real Builder, answers
    with text naming itself and the seq; fails the turns in ``fail_turns``."""

    def __init__(self, name: str, wl: Workload, fail_turns: tuple[int, ...] = ()) -> None:
        self.name = name
        self.builder = Builder(wl)
        self.fail_turns = fail_turns
        self.seen: list[tuple[RequestSpec, list[Message]]] = []
        self.sent_at: dict[tuple[int, int], int] = {}
        self.answered_at: dict[tuple[int, int], int] = {}

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = outcome or Outcome.planned(spec)
        o.sent_ns = time.perf_counter_ns()
        self.sent_at[spec.conversation, spec.turn] = o.sent_ns
        self.seen.append((spec, self.builder.messages(spec)))
        await asyncio.sleep(0.002)
        o.first_token_ns = o.end_ns = time.perf_counter_ns()
        self.answered_at[spec.conversation, spec.turn] = o.end_ns
        if spec.turn in self.fail_turns:
            o.status, o.error = 500, ErrorKind.HTTP_5XX
            o.answer = "half an ans" if spec.keep_answer else None
            return o
        o.status, o.output_tokens = 200, 3
        o.answer = f"{self.name} answers seq {spec.seq}" if spec.keep_answer else None
        return o

    async def aclose(self) -> None:
        pass


def run(
    wl: Workload, loads: dict[str, Any], *targets: Talker, ms: int = 300
) -> tuple[Runner, Sink]:
    assert wl.conversations is not None
    sink = Sink()
    runner = Runner(
        plan_of(("p", ms, loads)),
        {t.name: t for t in targets},
        Prompts(),
        [sink],
        max_tokens=8,
        temperature=0.7,
        conversations=make_conversations(wl),
        on_failure=wl.conversations.on_failure,
    )
    return runner, sink


async def drive(runner: Runner) -> None:
    await runner.run()
    await runner.drain(5)


def by_conversation(t: Talker) -> dict[int, list[tuple[RequestSpec, list[Message]]]]:
    out: dict[int, list[tuple[RequestSpec, list[Message]]]] = {}
    for spec, msgs in t.seen:
        out.setdefault(spec.conversation, []).append((spec, msgs))
    return out


async def test_each_turn_sends_the_history_with_its_servers_answers() -> None:
    wl = workload(turns=4)
    a = Talker("a", wl)
    runner, sink = run(wl, {"a": Closed(2)}, a)
    await drive(runner)
    convs = by_conversation(a)
    whole = [turns for turns in convs.values() if len(turns) == 4]
    assert whole, "no conversation ran its four turns"
    for turns in whole:
        for t, (spec, msgs) in enumerate(turns):
            assert spec.turn == t
            # user0, assistant0, ..., user_t: the context grows two messages a turn
            assert [m["role"] for m in msgs] == ["user", "assistant"] * t + ["user"]
            answers = [m["content"] for m in msgs if m["role"] == "assistant"]
            # each answer as this server gave it to that earlier turn, in order
            assert answers == [f"a answers seq {s.seq}" for s, _ in turns[:t]]
            # the earlier user turns are the same text each time they are sent again
            earlier = turns[t - 1][1] if t else []
            assert msgs[: len(earlier)][::2] == earlier[::2]
            assert spec.keep_answer == (t < 3)  # the last answer is kept by nobody
    # every turn is a request of its own, numbered by the target's seq
    assert sorted(o.seq for o in sink.outcomes) == list(range(len(sink.outcomes)))
    counts = runner.conversation_counts["a"]
    assert counts.started == len(convs)
    assert counts.finished >= len(whole)
    assert counts.started == counts.finished + counts.ended_early
    # the next conversation number is kept beside the next seq (the journal stores both)
    assert runner.next_seq[conversation_key("a")] == len(convs)


async def test_two_targets_get_the_same_user_turns_and_planned_lengths() -> None:
    wl = workload(turns=3)
    a, b = Talker("a", wl), Talker("b", wl)
    runner, _ = run(wl, {"a": Closed(1), "b": Closed(3)}, a, b)
    await drive(runner)
    ca, cb = by_conversation(a), by_conversation(b)
    both = set(ca) & set(cb)
    assert len(both) >= 2
    for conv in both:
        for (sa, ma), (sb, mb) in zip(ca[conv], cb[conv], strict=False):
            assert sa.turn == sb.turn
            assert [m["content"] for m in ma if m["role"] == "user"] == [
                m["content"] for m in mb if m["role"] == "user"
            ]
            assert sa.max_tokens == sb.max_tokens
            # the answers in the history are each target's own
            assert all("a answers" in m["content"] for m in ma if m["role"] == "assistant")
            assert all("b answers" in m["content"] for m in mb if m["role"] == "assistant")


async def test_a_failed_turn_ends_the_conversation_and_is_counted() -> None:
    wl = workload(turns=4, on_failure="end")
    a = Talker("a", wl, fail_turns=(1,))
    runner, _ = run(wl, {"a": Closed(2)}, a)
    await drive(runner)
    assert {spec.turn for spec, _ in a.seen} == {0, 1}  # no turn after the failed one
    counts = runner.conversation_counts["a"]
    assert counts.finished == 0
    assert counts.ended[ErrorKind.HTTP_5XX.value] >= counts.started - 2  # the last may be cut
    assert counts.started == counts.ended_early


async def test_continue_goes_on_with_the_history_as_far_as_it_got() -> None:
    wl = workload(turns=3, on_failure="continue")
    a = Talker("a", wl, fail_turns=(1,))
    runner, _ = run(wl, {"a": Closed(1)}, a)
    await drive(runner)
    turns = by_conversation(a)[0]
    assert [s.turn for s, _ in turns] == [0, 1, 2]
    last = turns[2][1]
    # the failed turn's user message stays, with whatever of its answer arrived
    assert [m["content"] for m in last if m["role"] == "assistant"] == [
        f"a answers seq {turns[0][0].seq}",
        "half an ans",
    ]
    assert runner.conversation_counts["a"].finished >= 1


async def test_think_time_passes_between_an_answer_and_the_next_turn() -> None:
    wl = workload(turns=3, think=0.05)
    a = Talker("a", wl)
    runner, _ = run(wl, {"a": Closed(1)}, a, ms=400)
    await drive(runner)
    gaps = [
        a.sent_at[conv, turn] - a.answered_at[conv, turn - 1]
        for conv, turn in a.sent_at
        if turn > 0
    ]
    assert gaps
    assert min(gaps) >= 50_000_000


async def test_an_open_loop_arrival_starts_a_conversation() -> None:
    wl = workload(turns=3, think=0.01)
    a = Talker("a", wl)
    runner, sink = run(wl, {"a": Constant(rate=50)}, a, ms=400)
    await drive(runner)
    counts = runner.conversation_counts["a"]
    # 50 arrivals a second for 0.4 s: about 20 conversations, each of up to three turns
    assert 10 <= counts.started <= 30
    assert sum(1 for o in sink.outcomes if o.turn == 0) == counts.started
    assert len(sink.outcomes) > counts.started  # later turns followed their first
    # offered = started + missed, counted per conversation
    missed = sum(runner.missed.values())
    assert counts.started + missed >= 10
    # the conversations cut by the phase's end are counted so
    assert counts.started == counts.finished + counts.ended_early


def base_config(**workload: object) -> dict[str, Any]:
    return {
        "targets": [
            {"name": "a", "base_url": "http://127.0.0.1:9", "model": "m"},
            {"name": "b", "base_url": "http://127.0.0.1:9", "model": "m", "api": "completions"},
        ],
        "workload": {"conversations": {"turns": 3}, **workload},
        "phases": [{"name": "p", "duration": "1m"}],
    }


def test_a_completions_target_is_refused_in_one_line_naming_it() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(base_config())
    text = str(err.value)
    assert "workload.conversations: every target must speak api 'chat'" in text
    assert "but b speak 'completions'" in text
    assert len(text.splitlines()) == 1


def test_turns_and_think_time_take_a_bare_number_or_a_distribution() -> None:
    cfg = Conversations.model_validate({"turns": 6, "think_time": "500ms"})
    assert (cfg.turns.dist, cfg.turns.mean, cfg.think_time.mean) == ("fixed", 6, 0.5)
    with pytest.raises(ValueError, match="min"):
        Conversations.model_validate({"turns": {"dist": "uniform", "min": 5, "max": 2}})
    with pytest.raises(ValueError):
        Conversations.model_validate({"turns": 0})


def test_the_example_is_a_valid_config() -> None:
    cfg = load_config(Path(__file__).parents[2] / "examples" / "conversations.yaml", environ={})
    assert cfg.workload.conversations is not None


async def test_a_resumed_run_goes_on_with_new_conversation_numbers() -> None:
    wl = workload(turns=2)
    a = Talker("a", wl)
    assert wl.conversations is not None
    seqs = {"a": 40, conversation_key("a"): 17}  # as the journal stored them
    runner = Runner(
        plan_of(("p", 100, {"a": Closed(1)})),
        {"a": a},
        Prompts(),
        [],
        max_tokens=8,
        temperature=0.7,
        seqs=seqs,
        conversations=make_conversations(wl),
    )
    await drive(runner)
    first = a.seen[0][0]
    assert (first.seq, first.conversation, first.turn) == (40, 17, 0)
    assert seqs[conversation_key("a")] == 17 + runner.conversation_counts["a"].started


async def test_the_exporter_counts_what_the_runner_counted() -> None:
    wl = workload(turns=3, on_failure="end")
    a = Talker("a", wl, fail_turns=(2,))
    metrics = Metrics()
    runner = Runner(
        plan_of(("p", 200, {"a": Closed(2)})),
        {"a": a},
        Prompts(),
        [],
        max_tokens=8,
        temperature=0.7,
        conversations=make_conversations(wl),
        on_conversation=metrics.conversation,
    )
    await drive(runner)
    counts = runner.conversation_counts["a"]
    exported = {
        (s.labels["event"], s.labels["reason"]): s.value
        for family in metrics.registry.collect()
        if family.name == "soakd_conversations"
        for s in family.samples
        if s.name == "soakd_conversations_total"
    }
    assert exported[("started", "")] == counts.started > 0
    assert exported[("ended_early", "http_5xx")] == counts.ended["http_5xx"] > 0
    assert sum(v for (event, _), v in exported.items() if event == "ended_early") == (
        counts.ended_early
    )


async def test_an_open_loops_cap_counts_conversations_under_way() -> None:
    """max_in_flight caps the conversations under way, in a think time too: an arrival
    that finds them all under way is one conversation not started (offered = started +
    missed), and no admitted conversation's later turn is ever counted missed."""
    wl = workload(turns=3, think=0.05)
    a = Talker("a", wl)
    runner, sink = run(wl, {"a": Constant(rate=100, max_in_flight=2)}, a, ms=400)
    live: list[int] = []

    async def watch() -> None:
        while True:
            live.append(runner.under_way["a"])
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    await drive(runner)
    watcher.cancel()
    counts = runner.conversation_counts["a"]
    assert max(live) == 2
    missed = runner.missed[("a", "p", "in_flight_cap")]
    assert counts.started + missed + runner.missed.get(("a", "p", "late"), 0) == 40
    assert missed > counts.started  # 0.1 s a conversation, two at once: most arrivals miss
    # each admitted conversation sent its turns in order, none of them missed
    assert sum(1 for o in sink.outcomes if o.turn == 0) == counts.started


async def test_a_turn_cut_at_the_drain_deadline_ends_its_conversation_counted() -> None:
    wl = workload(turns=3)
    slow = Talker("a", wl)
    original = slow.send

    async def send(spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        if spec.turn == 1:
            await asyncio.sleep(30)  # past any drain deadline
        return await original(spec, outcome)

    slow.send = send  # type: ignore[method-assign]
    runner, _ = run(wl, {"a": Closed(2)}, slow, ms=100)
    await runner.run()
    assert await runner.drain(0.2) == 2  # the two turns in flight, cut
    counts = runner.conversation_counts["a"]
    assert counts.ended["stopped"] == 2
    assert counts.started == counts.finished + counts.ended_early == 2
