"""The parent <-> worker wire: what goes over is what comes back, field for field."""

from __future__ import annotations

import asyncio
import json
import typing
from array import array
from dataclasses import asdict, replace

import pytest

from soakd import outcome_record
from soakd.model import ErrorKind, Finished, Outcome, RequestSpec
from soakd.types import NotSent
from soakd.workers import wire
from soakd.workers.pool import WAKE_SLICE, Wakeups, Worker, WorkerGate
from soakd.workers.reuse import NoReuse
from soakd.workload.calibration import Calibration
from soakd.workload.runner import Runner
from tests.waiting import until


def filled(error: ErrorKind | None) -> Outcome:
    o = Outcome("t", "p", 7, 1_000)
    o.sent_ns, o.wall_start, o.first_byte_ns, o.first_token_ns = 2_000, 1.7e9, 3_000, 4_000
    o.last_token_ns, o.end_ns, o.status, o.error = 9_000, 9_500, 503 if error else 200, error
    o.error_detail, o.oom, o.prompt_tokens, o.output_tokens = "überlastet", True, 12, 3
    o.usage_reported, o.content_chunks, o.retry_after_s = True, 3, 2.5
    o.usage_delta = -1  # -1 is a delta, not "none"
    o.retry_after_unreadable = error is not None
    o.usage_rejected = "implausible" if error is not None else ""
    o.itl_ns = array("q", [1, 2, 5_000_000_000])  # a gap over 4.29 s survives
    return o


def through_the_wire(sent: Outcome, shift: int = 0) -> Outcome:
    """``sent`` packed by a worker, unpacked by the parent into its planned Outcome."""
    buf = bytearray()
    wire.pack_outcome(buf, 41, sent)
    payload = bytes(buf)
    ((rid, head, start, end),) = wire.unpack_outcomes(payload)
    assert (rid, end) == (41, len(payload))
    got = Outcome(sent.target, sent.phase, sent.seq, sent.scheduled_ns)
    outcome_record.fill(got, head, payload, start, shift)
    return got


@pytest.mark.parametrize("error", [None, ErrorKind.HTTP_5XX, ErrorKind.SHED_QUEUE_TIMEOUT])
def test_outcome_round_trip_every_field(error: ErrorKind | None) -> None:
    sent = filled(error)
    assert asdict(through_the_wire(sent)) == asdict(sent)
    empty = Outcome("t", "p", 8, 0)  # the empty one: Nones stay None
    got = through_the_wire(empty)
    empty.itl_keys = None  # no gaps, no buckets
    assert asdict(got) == asdict(empty)


def test_token_counts_past_32_bits_travel() -> None:
    """The parser bounds a server's counts to 64 bits (a factor of max_tokens), not 32."""
    sent = filled(None)
    sent.output_tokens, sent.prompt_tokens, sent.content_chunks = 2**40, 2**33, 2**35
    sent.usage_delta = 2**40 - 2**35
    assert asdict(through_the_wire(sent)) == asdict(sent)


def test_clock_shift_moves_every_instant_and_nothing_else() -> None:
    sent = filled(None)
    got = through_the_wire(sent, 100)
    assert (got.sent_ns, got.first_byte_ns, got.first_token_ns) == (2_100, 3_100, 4_100)
    assert (got.last_token_ns, got.end_ns) == (9_100, 9_600)
    assert got.ttft_ns == sent.ttft_ns
    assert list(got.itl_ns) == list(sent.itl_ns)


def spec(
    seq: int, prompt: str, scheduled: int, deadline: int = 0, planned: bool = False
) -> RequestSpec:
    return RequestSpec("t", "p", seq, prompt, 3, 64, 0.7, scheduled, deadline, planned)


def test_specs_round_trip_with_their_history_and_no_text() -> None:
    """A request travels as its numbers; a conversation's turn with the answers its server
    gave before (any text, empty ones too). No prompt text crosses but a text given outright
    (a check's, which the parent chose): the worker builds the rest."""
    buf = bytearray()
    specs = [
        (1, 0, spec(5, "", 123, 2_000_123)),
        (2, 3, spec(6, "", -1, planned=True)),  # its answer length planned: asked whole
        # a conversation's third turn, its answer kept for the next
        (3, 1, replace(
            spec(7, "", 50), conversation=12, turn=2, keep_answer=True,
            history=("héllo\nworld ✓", ""),
        )),
    ]  # fmt: skip
    for rid, target, s in specs:
        wire.pack_spec(buf, rid, target, s)
    # a check: its own few words, kept answer, at temperature 0
    wire.pack_spec(buf, 4, 0, replace(spec(8, "Write 42 in wörds", 1), keep_answer=True))
    names = ["a", "b", "c", "d"]
    got = list(wire.unpack_specs(bytes(buf), names, shift=20))
    # the worker's own: its target's name, no phase, no planned prompt length, its clock
    assert got == [
        (rid, target, replace(
            s,
            target=names[target],
            phase="",
            prompt_tokens_hint=0,
            scheduled_ns=s.scheduled_ns - 20,
            deadline_ns=s.deadline_ns - 20 if s.deadline_ns else 0,
        ))
        for rid, target, s in specs
    ] + [(4, 0, replace(
        spec(8, "Write 42 in wörds", -19), target="a", phase="", prompt_tokens_hint=0,
        keep_answer=True,
    ))]  # fmt: skip


def test_a_calibration_travels_whole() -> None:
    cal = Calibration("tokenize", "a", (1, 2, 1), 1.25, 3.0, 77)
    doc = json.loads(json.dumps(wire.calibration_doc(cal)))
    assert wire.read_calibration(doc) == cal
    with pytest.raises(wire.WireError):
        wire.read_calibration({**doc, "scale": -1})


def test_a_not_sent_record_carries_its_reason_and_nothing_else() -> None:
    buf = bytearray()
    wire.pack_not_sent(buf, 9, "late")
    wire.pack_outcome(buf, 10, filled(None))
    payload = bytes(buf)
    (rid, head, start, _), (rid2, head2, *_) = wire.unpack_outcomes(payload)
    assert (rid, head.error, outcome_record.detail(payload, start, head)) == (
        9,
        wire.NOT_SENT,
        "late",
    )
    assert (head.n_gaps, head.n_keys) == (0, 0)
    assert rid2 == 10
    assert head2.error != wire.NOT_SENT


def test_a_cut_batch_is_a_wire_error() -> None:
    buf = bytearray()
    wire.pack_spec(buf, 1, 0, spec(5, "hello", 123))
    with pytest.raises(wire.WireError):
        list(wire.unpack_specs(bytes(buf[:-2])))
    out = bytearray()
    wire.pack_outcome(out, 1, filled(None))
    with pytest.raises(wire.WireError):
        list(wire.unpack_outcomes(bytes(out[:-3])))


async def test_frames_read_back_and_a_torn_frame_is_an_error() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(wire.frame(wire.PING, wire.pack_clock(5, 6)) + wire.frame(wire.CANCEL))
    reader.feed_data(wire.frame(wire.SEND, b"abc")[:4])
    reader.feed_eof()
    assert await wire.read_frame(reader) == (wire.PING, wire.pack_clock(5, 6))
    assert await wire.read_frame(reader) == (wire.CANCEL, b"")
    with pytest.raises(wire.WireError):
        await wire.read_frame(reader)
    empty = asyncio.StreamReader()
    empty.feed_eof()
    assert await wire.read_frame(empty) is None


class _Pool:
    up = 0


class _Paused:
    pause_reason = "spend_cap"

    def __init__(self) -> None:
        self.sends = 0

    def delay_s(self) -> float:
        return 3.0

    def sent(self) -> None:
        self.sends += 1


def test_gate_no_worker_up_pauses_with_its_own_reason() -> None:
    pool, inner = _Pool(), _Paused()
    gate = WorkerGate(pool, inner)  # type: ignore[arg-type]
    assert gate.delay_s() > 0
    assert gate.pause_reason == "no_worker"
    pool.up = 2
    assert gate.delay_s() == 3.0  # the target's own pause decides once workers are up
    assert gate.pause_reason == "spend_cap"
    gate.sent()
    assert inner.sends == 1
    assert WorkerGate(pool, None).delay_s() == 0.0  # type: ignore[arg-type]


class _Writer:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    async def drain(self) -> None:
        pass


def test_outbox_one_frame_per_kind_and_a_cut_never_overtakes_its_request() -> None:
    box = wire.Outbox()
    wire.pack_ids(box.buf(wire.CANCEL), 7)  # the cut queued first, in the same turn
    wire.pack_spec(box.buf(wire.SEND), 7, 0, spec(1, "a", 10))
    wire.pack_spec(box.buf(wire.SEND), 8, 0, spec(2, "b", 20))
    writer = _Writer()
    box.write_to(writer)  # type: ignore[arg-type]
    kinds = [wire.HEAD.unpack_from(f)[1] for f in writer.frames]
    assert kinds == [wire.SEND, wire.CANCEL]
    assert [r[0] for r in wire.unpack_specs(writer.frames[0][wire.HEAD.size :])] == [7, 8]
    assert wire.unpack_ids(writer.frames[1][wire.HEAD.size :]) == (7,)
    box.write_to(writer)  # nothing new: no empty frame
    assert len(writer.frames) == 2


def test_outbox_splits_a_turn_of_long_histories_into_frames_the_other_end_reads() -> None:
    """24 conversation turns, each after an answer of a million tokens (~7 MB), sent in one
    turn: one frame would be 160 MB, past MAX_FRAME, and the worker would drop the
    connection (seen with prompts, when they travelled: both workers died, 24 requests
    lost). Split, every frame is within it and every request arrives."""
    box = wire.Outbox()
    answer = "word " * 1_400_000
    for rid in range(24):
        turn = replace(spec(rid, "", 1_000_000), conversation=rid, turn=1, history=(answer,))
        wire.pack_spec(box.buf(wire.SEND), rid, 0, turn)
    writer = _Writer()
    box.write_to(writer)  # type: ignore[arg-type]
    sizes = [wire.HEAD.unpack_from(f)[0] for f in writer.frames]
    assert len(sizes) > 1
    assert max(sizes) <= wire.MAX_FRAME
    got = [r[0] for f in writer.frames for r in wire.unpack_specs(f[wire.HEAD.size :])]
    assert got == list(range(24))


async def test_outbox_lets_a_record_nobody_waits_for_travel_with_the_next() -> None:
    box = wire.Outbox()
    writer = _Writer()
    flusher = asyncio.create_task(box.flush_forever(writer))  # type: ignore[arg-type]
    try:
        wire.pack_not_sent(box.buf(wire.OUTCOMES, wait_ns=10**9), 1, "late")
        for _ in range(5):
            await asyncio.sleep(0)
        assert writer.frames == []  # it waits (up to 1 s) for company
        wire.pack_not_sent(box.buf(wire.OUTCOMES), 2, "late")  # someone waits for this one
        await until(lambda: len(writer.frames) == 1, 5, "the frame")
        records = list(wire.unpack_outcomes(writer.frames[0][wire.HEAD.size :]))
        assert [r[0] for r in records] == [1, 2]  # both, in one frame
        wire.pack_not_sent(box.buf(wire.OUTCOMES, wait_ns=20_000_000), 3, "late")
        await until(lambda: len(writer.frames) == 2, 5, "the lone record, once its wait ran out")
    finally:
        flusher.cancel()


async def test_finished_requests_wake_a_slice_per_loop_turn_so_timers_run_between() -> None:
    """A batch of finished requests must not hold the loop: a timer due meanwhile (the
    open loop's next hand-over) runs after one slice of woken waiters, not after all."""
    loop = asyncio.get_running_loop()
    wake = Wakeups()
    futures = [loop.create_future() for _ in range(3 * WAKE_SLICE + 2)]
    order: list[int] = []
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _f, i=i: order.append(i))
    futures[1].cancel()  # the drain deadline cut this one: skipped, never set
    for i, f in enumerate(futures):
        wake.add(f, NotSent("late") if i == 2 else None, paced=True)
    seen: list[int] = []
    loop.call_later(0, lambda: seen.append(sum(f.done() and not f.cancelled() for f in futures)))
    await until(lambda: not wake and all(f.done() for f in futures))
    # one slice taken when the timer ran (the cut one in it), the rest after it
    assert seen == [WAKE_SLICE - 1]
    assert order == [1, 0, *range(2, len(futures))]  # the cut one at its cut, then in order
    assert isinstance(futures[2].exception(), NotSent)
    assert futures[0].result() is None
    closed = loop.create_future()
    wake.add(closed, paced=False)  # a closed-loop stream's next send waits on it: now
    assert closed.done()


def test_a_target_closing_after_answers_round_trips() -> None:
    assert wire.unpack_closes(wire.pack_closes(3, 503, True)) == (3, 503, True)
    assert wire.unpack_closes(wire.pack_closes(0, 200, False)) == (0, 200, False)
    with pytest.raises(wire.WireError):
        wire.unpack_closes(b"\x00")


def test_no_reuse_holds_a_status_while_any_sender_learned_it() -> None:
    """Each worker learns for its own pool: a status is shown from the first that learned
    it until the last keeps its connections again or is gone; each change is heard once."""
    heard: list[tuple[str, int, bool]] = []
    no_reuse = NoReuse(lambda *change: heard.append(change))
    no_reuse.learned("a", 0, 200, True)
    no_reuse.learned("a", 1, 200, True)  # a second worker: no change
    no_reuse.learned("b", 1, 503, True)
    assert no_reuse.status() == {"a": [200], "b": [503]}
    no_reuse.learned("a", 0, 200, False)  # worker 1 still holds it
    assert no_reuse.status() == {"a": [200], "b": [503]}
    no_reuse.forget(1)  # worker 1 died: its pools are gone
    assert no_reuse.status() == {}
    assert heard == [("a", 200, True), ("b", 503, True), ("a", 200, False), ("b", 503, False)]


def test_a_frame_counts_what_it_woke_by_phase_even_when_it_breaks_halfway() -> None:
    """The worker counter is added to once per phase per frame, and never loses a count:
    a frame cut short still counts the outcomes it handed back before the cut."""
    buf = bytearray()
    for rid in (1, 2, 3):
        wire.pack_outcome(buf, rid, filled(None))
    wire.pack_not_sent(buf, 4, "late")  # not sent: counted as missed by the runner, not here
    wire.pack_outcome(buf, 5, filled(None))
    payload = bytes(buf[:-3])  # the last record cut short
    counted: list[tuple[int, str, int]] = []

    async def go() -> list[Outcome]:
        w = Worker(3)
        loop = asyncio.get_running_loop()
        outs = [Outcome("t", phase, 7, 1_000) for phase in ("p", "q", "p", "p", "p")]
        for rid, out in enumerate(outs, 1):
            w.pending[rid] = (out, loop.create_future(), False)
        with pytest.raises(wire.WireError):
            w.finished(payload, lambda *c: counted.append(c), Wakeups())
        assert sorted(w.pending) == [5]
        return outs

    outs = asyncio.run(go())
    assert sorted(counted) == [(3, "p", 2), (3, "q", 1)]
    assert [o.end_ns for o in outs] == [9_500, 9_500, 9_500, 0, 0]


FINISHED = sorted(n for n, v in vars(Finished).items() if isinstance(v, property))
"""What a sink reads of an outcome (soakd/model.py's ``Finished``)."""


@pytest.mark.parametrize("error", [None, ErrorKind.HTTP_5XX])
def test_a_sink_sees_one_shape_with_workers_or_without(error: ErrorKind | None) -> None:
    """With sender workers the parent's Outcome keeps the ITL gaps only in its record (for
    the journal), without them in ``itl_ns``: a sink reads the ``Finished`` view, which has
    neither, so it reads the same values whichever process timed the request."""
    timed_here = filled(error)
    buf = bytearray()
    wire.pack_outcome(buf, 41, timed_here)

    async def by_a_worker() -> Outcome:
        w = Worker(0)
        out = Outcome(timed_here.target, timed_here.phase, timed_here.seq, 1_000)
        w.pending[41] = (out, asyncio.get_running_loop().create_future(), False)
        w.finished(bytes(buf), None, Wakeups())
        return out

    timed_there = asyncio.run(by_a_worker())
    assert timed_there.packed is not None  # the journal forwards the record as it came
    assert list(timed_here.itl_ns)
    assert not timed_there.itl_ns  # its gaps: in the record only
    assert not {"itl_ns", "itl_keys", "packed"} & set(FINISHED)
    assert "e2e_ns" in FINISHED
    assert {n: getattr(timed_there, n) for n in FINISHED} == {
        n: getattr(timed_here, n) for n in FINISHED
    }


def test_every_sink_of_a_run_reads_the_finished_view() -> None:
    """The runner's readers: the journal alone takes the whole Outcome (OutcomeRecorder);
    every other one (the guards, goodput, probes, notes, prompt lengths) is an
    OutcomeSink, whose ``record`` takes the view (mypy holds each sink to it)."""
    from soakd.types import OutcomeRecorder, OutcomeSink

    assert typing.get_type_hints(OutcomeSink.record)["outcome"] is Finished
    assert typing.get_type_hints(OutcomeRecorder.record)["outcome"] is Outcome
    hints = typing.get_type_hints(Runner.__init__)
    assert hints["journal"] == OutcomeRecorder | None
    assert hints["guards"] == OutcomeSink | None
