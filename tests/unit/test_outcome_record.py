"""The outcome record (soakd/outcome_record.py): every field of ``Outcome`` carried, and the
same bytes on both hops (a worker to soakd, soakd to the journal's writer)."""

from __future__ import annotations

import asyncio
import dataclasses
from array import array
from itertools import count
from typing import Any

import pytest

from soakd import outcome_record
from soakd.journal.batch import Batch
from soakd.measure.analysis import itl_keys
from soakd.model import ErrorKind, Outcome
from soakd.workers import wire
from soakd.workers.pool import Wakeups, Worker

# A value for a field by its declared type (never its default): a field added to Outcome
# with a type not here fails every test below until it is carried and given a sample.
_N = count(3)
SAMPLES: dict[str, Any] = {
    "str": lambda: f"ünïcode-{next(_N)}",
    "str | None": lambda: f"an ånswer\n{next(_N)}",  # the answer kept
    "int": lambda: 1_000_000_007 * next(_N),
    "int | None": lambda: 2**40 + next(_N),  # past 32 bits
    "float": lambda: 1.7e9 + next(_N) / 8,
    "float | None": lambda: 2.5 + next(_N),
    "bool": lambda: True,
    "ErrorKind | None": lambda: ErrorKind.SHED_QUEUE_TIMEOUT,
    "array[int]": lambda: array("q", [1, 2, 5_000_000_000, next(_N)]),  # a gap over 4.29 s
    "dict[int, int] | None": lambda: None,  # the ITL buckets: counted from the gaps below
    "tuple[str, str] | None": lambda: (f"gpt-x-{next(_N)}", "fp_ü"),  # a kept answer's identity
}
BY_NAME: dict[str, Any] = {
    "status": 503,  # uint16
    "usage_rejected": "implausible",  # one of USAGE_REJECTED_REASONS
    "usage_delta": -1,  # -1 is a delta, not None
    "turn": 70_000,  # uint32: past 16 bits
}


def every_field_set() -> Outcome:
    """An Outcome whose every carried field differs from its default."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Outcome):
        if f.name in outcome_record.NOT_CARRIED:
            continue
        if f.name in BY_NAME:
            values[f.name] = BY_NAME[f.name]
            continue
        make = SAMPLES.get(str(f.type))
        if make is None:
            pytest.fail(
                f"Outcome.{f.name} ({f.type}): carry it in soakd/outcome_record.py, then give "
                "it a sample here"
            )
        values[f.name] = make()
    o = Outcome(**values)
    itl_keys(o)  # the buckets, as the worker that timed it counts them
    for f in dataclasses.fields(Outcome):
        if f.name not in outcome_record.NOT_CARRIED:
            default = f.default_factory() if callable(f.default_factory) else f.default
            assert getattr(o, f.name) != default, f.name
    return o


def carried(o: Outcome) -> dict[str, Any]:
    return {
        f.name: getattr(o, f.name)
        for f in dataclasses.fields(Outcome)
        if f.name not in outcome_record.NOT_CARRIED
    }


def via_worker(sent: Outcome, shift: int = 0) -> tuple[Outcome, bytes]:
    """``sent`` packed by a worker and read by soakd's pool into the runner's planned
    Outcome; and the record as it came on the wire."""
    buf = bytearray()
    wire.pack_outcome(buf, 7, sent)
    payload = bytes(buf)

    async def go() -> Outcome:
        w = Worker(0)
        w.shift = shift
        out = Outcome(sent.target, sent.phase, sent.seq, sent.scheduled_ns)
        done = asyncio.get_running_loop().create_future()
        w.pending[7] = (out, done, False)
        w.finished(payload, None, Wakeups())
        await done
        return out

    return asyncio.run(go()), payload[4:]  # the request id, then the record


def via_journal(o: Outcome) -> tuple[Outcome, Batch]:
    batch = Batch()
    batch.add(o)
    (got,) = Batch.decode(batch.encode()).outcomes()
    return got, batch


def test_every_field_survives_worker_to_soakd_to_the_writer() -> None:
    sent = every_field_set()
    parent, _ = via_worker(sent)
    assert parent.packed is not None  # forwarded, not packed again
    written, _ = via_journal(parent)
    assert carried(written) == carried(sent)


def test_every_field_survives_the_journal_from_soakd_own_process() -> None:
    """``run.workers: 1``: the Outcome is built in soakd's process and packed there."""
    sent = every_field_set()
    written, _ = via_journal(sent)
    assert carried(written) == carried(sent)
    sent.itl_keys = None  # not counted yet: the writer counts them
    written, _ = via_journal(sent)
    assert written.itl_keys is None
    assert list(written.itl_ns) == list(sent.itl_ns)


def test_the_parent_reads_what_the_runner_needs_and_forwards_the_rest() -> None:
    sent = every_field_set()
    parent, _ = via_worker(sent)
    tails = {"itl_ns", "itl_keys"}
    assert {k: v for k, v in carried(parent).items() if k not in tails} == {
        k: v for k, v in carried(sent).items() if k not in tails
    }
    assert (len(parent.itl_ns), parent.itl_keys) == (0, None)  # left in the record


def test_a_record_is_the_same_bytes_on_the_wire_and_in_the_journal() -> None:
    sent = every_field_set()
    parent, on_wire = via_worker(sent)
    _, forwarded = via_journal(parent)
    _, packed_here = via_journal(sent)
    ident = outcome_record.IDENT.size
    assert bytes(forwarded.records) == bytes(packed_here.records)
    assert bytes(forwarded.records)[ident:] == on_wire[ident:]
    assert outcome_record.IDENT.unpack_from(forwarded.records) == (
        0,
        1,
        sent.seq,
        sent.scheduled_ns,
    )
    assert outcome_record.IDENT.unpack_from(on_wire)[:2] == (
        outcome_record.NO_NAME,
        outcome_record.NO_NAME,
    )


def test_a_clock_shift_is_unpacked_and_packed_again() -> None:
    sent = every_field_set()
    parent, _ = via_worker(sent, shift=100)
    assert parent.packed is None
    written, _ = via_journal(parent)
    moved = {"sent_ns", "first_byte_ns", "first_token_ns", "last_token_ns", "end_ns"}
    for name, value in carried(sent).items():
        assert getattr(written, name) == (value + 100 if name in moved else value), name


def test_the_empty_outcome_keeps_its_nones() -> None:
    empty = Outcome("t", "p", 0, 0)
    written, _ = via_journal(empty)
    assert carried(written) == carried(empty)


def test_a_cut_or_miscounted_batch_is_refused() -> None:
    batch = Batch()
    batch.add(every_field_set())
    batch.add(Outcome("t", "p", 0, 0))
    data = batch.encode()
    with pytest.raises(ValueError, match="cut short"):
        Batch.decode(data[:-3]).outcomes()
    with pytest.raises(ValueError, match="version"):
        Batch.decode(b"\x01" + data[1:])
    wrong = Batch.decode(data)
    wrong.count = 3
    with pytest.raises(ValueError, match="3"):
        wrong.outcomes()
