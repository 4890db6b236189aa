"""The simulator's scheduler model, driven in virtual time (no network, no clock)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakd.profiles import PROFILES, Profile, get_profile
from soakd.sim.engine import Engine, Step

EDGE = get_profile("edge-4gb")


def run_until_idle(engine: Engine, max_steps: int = 100_000) -> list[Step]:
    steps = []
    while engine.has_work():
        steps.append(engine.step())
        assert len(steps) < max_steps, "engine did not drain"
    return steps


def ttft(profile: Profile, prompt_tokens: int) -> float:
    """Virtual seconds from submit to the first token of a lone request."""
    engine = Engine(profile)
    engine.submit(prompt_tokens, 4)
    t = 0.0
    while True:
        step = engine.step()
        t += step.duration_s
        if step.tokens:
            return t


def test_ttft_grows_with_prompt_length() -> None:
    short, medium, long_ = ttft(EDGE, 10), ttft(EDGE, 500), ttft(EDGE, 1900)
    assert short < medium < long_
    # ~ one decode step plus prompt / prefill rate
    assert medium == pytest.approx(0.025 + 499 / 2000, rel=0.05)


def test_long_prompt_is_prefilled_in_chunks() -> None:
    profile = dataclasses.replace(EDGE, max_num_batched_tokens=512)
    engine = Engine(profile)
    engine.submit(1500, 2)
    steps = run_until_idle(engine)
    assert [len(s.tokens) for s in steps] == [0, 0, 1, 1]  # 512 + 512 + 476, then decode
    assert [s.batch_tokens for s in steps] == [512, 512, 476, 1]


def decode_step_s(profile: Profile, running: int) -> float:
    """Step time once ``running`` sequences have all finished their prefill."""
    engine = Engine(profile)
    for _ in range(running):
        engine.submit(20, 100)
    while True:
        step = engine.step()
        if step.batch_tokens == running:  # every sequence decodes one token
            return step.duration_s


def test_decode_slows_as_running_sequences_grow() -> None:
    one, eight, sixteen = (decode_step_s(EDGE, n) for n in (1, 8, 16))
    assert one == pytest.approx(0.025, rel=0.01)
    assert one < eight < sixteen
    assert sixteen == pytest.approx(0.025 * (1 + 0.03 * 15), rel=0.02)


def test_requests_past_max_num_seqs_wait_in_a_queue() -> None:
    engine = Engine(EDGE)
    ids = [engine.submit(50, 10) for _ in range(20)]
    first = engine.step()
    assert engine.num_running == 16
    assert engine.num_waiting == 4
    assert len(first.scheduled) == 16
    steps = run_until_idle(engine)
    later = [sid for s in steps for sid in s.scheduled]
    assert later == ids[16:]  # admitted in arrival order as slots free up
    counts: dict[int, int] = {}
    for s in (first, *steps):
        for ev in s.tokens:
            counts[ev.seq_id] = counts.get(ev.seq_id, 0) + 1
    assert counts == dict.fromkeys(ids, 10)


def test_kv_usage_is_the_share_of_blocks_in_use() -> None:
    engine = Engine(EDGE)
    assert engine.kv_usage == 0.0
    engine.submit(160, 5)  # 160 tokens = 10 blocks of 16
    engine.step()
    assert engine.kv_usage == pytest.approx(10 / EDGE.kv_cache_blocks)
    run_until_idle(engine)
    assert engine.kv_usage == 0.0


def test_full_kv_cache_preempts_and_every_request_still_completes() -> None:
    engine = Engine(EDGE)
    ids = [engine.submit(1500, 500) for _ in range(16)]  # 32k tokens > 20k of cache
    produced = dict.fromkeys(ids, 0)
    finishes = {}
    peak = 0.0
    while engine.has_work():
        step = engine.step()
        peak = max(peak, engine.kv_usage)
        assert 0.0 <= engine.kv_usage <= 1.0
        for ev in step.tokens:
            produced[ev.seq_id] += 1
            if ev.finish:
                finishes[ev.seq_id] = ev.finish
    assert engine.num_preemptions > 0
    assert peak > 0.95
    assert produced == dict.fromkeys(ids, 500)  # recompute does not repeat tokens
    assert set(finishes.values()) == {"length"}
    assert engine.kv_usage == 0.0


def test_abort_frees_the_cache_and_the_slot() -> None:
    engine = Engine(EDGE)
    a = engine.submit(300, 100)
    b = engine.submit(300, 100)
    engine.step()
    assert engine.num_running == 2
    assert engine.abort(a)
    assert not engine.abort(a)
    assert engine.num_running == 1
    steps = run_until_idle(engine)
    assert {ev.seq_id for s in steps for ev in s.tokens} == {b}
    assert engine.kv_usage == 0.0


def test_abort_of_a_waiting_request() -> None:
    engine = Engine(dataclasses.replace(EDGE, max_num_seqs=1))
    engine.submit(10, 3)
    waiting = engine.submit(10, 3)
    engine.step()
    assert engine.num_waiting == 1
    assert engine.abort(waiting)
    assert engine.num_waiting == 0


def test_random_eos_unless_ignored() -> None:
    profile = dataclasses.replace(EDGE, eos_probability=0.05, seed=7)
    engine = Engine(profile)
    early = [engine.submit(10, 200) for _ in range(10)]
    forced = [engine.submit(10, 200, ignore_eos=True) for _ in range(5)]
    lengths: dict[int, int] = {}
    reasons: dict[int, str] = {}
    for s in run_until_idle(engine):
        for ev in s.tokens:
            lengths[ev.seq_id] = lengths.get(ev.seq_id, 0) + 1
            if ev.finish:
                reasons[ev.seq_id] = ev.finish
    assert all(lengths[i] == 200 and reasons[i] == "length" for i in forced)
    assert any(reasons[i] == "stop" and lengths[i] < 200 for i in early)


def test_same_seed_same_run() -> None:
    profile = dataclasses.replace(EDGE, eos_probability=0.05, seed=3)

    def trace() -> list[tuple[float, tuple[tuple[int, str | None], ...]]]:
        engine = Engine(profile)
        for _ in range(5):
            engine.submit(40, 60, ignore_eos=False)
        return [
            (s.duration_s, tuple((e.seq_id, e.finish) for e in s.tokens))
            for s in run_until_idle(engine)
        ]

    assert trace() == trace()


def test_submit_checks_lengths() -> None:
    engine = Engine(EDGE)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit(2000, 100)
    with pytest.raises(ValueError, match=">= 1"):
        engine.submit(10, 0)
    with pytest.raises(RuntimeError):
        engine.step()


def test_profiles_are_consistent() -> None:
    assert {"edge-4gb", "fast", "h200"} <= set(PROFILES)
    for profile in PROFILES.values():
        assert profile.max_model_len <= profile.kv_cache_tokens
    with pytest.raises(ValueError, match="max_model_len"):
        dataclasses.replace(EDGE, kv_cache_tokens=1000)
    with pytest.raises(ValueError, match="error_rate"):
        get_profile("fast", error_rate=1.5)
    with pytest.raises(KeyError, match="known"):
        get_profile("nope")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("submit"), st.integers(1, 1500), st.integers(1, 500)),
            st.tuples(st.just("abort"), st.integers(0, 40), st.just(0)),
            st.tuples(st.just("step"), st.integers(1, 30), st.just(0)),
        ),
        max_size=40,
    )
)
def test_invariants_under_random_traffic(ops: list[tuple[str, int, int]]) -> None:
    engine = Engine(EDGE)
    want: dict[int, int] = {}
    got: dict[int, int] = {}
    finished: set[int] = set()
    aborted: set[int] = set()
    for op, a, b in ops:
        if op == "submit":
            b = min(b, EDGE.max_model_len - a)
            want[engine.submit(a, b)] = b
        elif op == "abort":
            if engine.abort(a):
                aborted.add(a)
        else:
            for _ in range(a):
                if not engine.has_work():
                    break
                for ev in engine.step().tokens:
                    assert ev.seq_id not in finished
                    assert ev.seq_id not in aborted
                    got[ev.seq_id] = got.get(ev.seq_id, 0) + 1
                    if ev.finish:
                        finished.add(ev.seq_id)
        assert 0.0 <= engine.kv_usage <= 1.0
        assert engine.num_running <= EDGE.max_num_seqs
    for s in run_until_idle(engine):
        for ev in s.tokens:
            got[ev.seq_id] = got.get(ev.seq_id, 0) + 1
    assert engine.kv_usage == 0.0
    for sid, n in want.items():
        if sid not in aborted:
            assert got[sid] == n


def test_every_profile_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "simulator.md").read_text()
    missing = [name for name in PROFILES if f"| `{name}` |" not in doc]
    assert not missing, f"docs/simulator.md has no row for: {missing}"
