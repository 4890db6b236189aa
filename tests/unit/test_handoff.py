"""HandOff, the journal's queue between the event loop and the writer, driven directly:
what each side may rely on (soakd/journal/handoff.py's docstring)."""

from __future__ import annotations

import asyncio
import threading

from soakd.journal.handoff import HandOff
from soakd.measure.fold import Fold
from soakd.model import ErrorKind, Outcome
from tests.waiting import until


def outcome(seq: int, target: str = "t", error: ErrorKind | None = None) -> Outcome:
    o = Outcome(target, "p", seq, 0, sent_ns=1, end_ns=2, status=200, output_tokens=3)
    o.error = error
    return o


def tallied(*outcomes: Outcome) -> Fold:
    f = Fold()
    for o in outcomes:
        f.tally(o)
    return f


class Applied:
    """A FoldSink that remembers each fold and the thread it was applied on."""

    def __init__(self) -> None:
        self.folds: list[Fold] = []
        self.threads: list[int] = []

    def apply(self, f: Fold) -> None:
        self.folds.append(f)
        self.threads.append(threading.get_ident())


def test_take_gives_the_oldest_first_and_leaves_the_rest() -> None:
    h = HandOff(limit=100, wake_at=50, forward=())
    h.records.extend(range(10))
    assert h.take(4) == [0, 1, 2, 3]
    assert h.take(0) == []
    assert h.take(100) == [4, 5, 6, 7, 8, 9]  # fewer than asked: what there is
    assert h.take(3) == []
    assert not h.records


def test_take_tallies_merges_every_fold_handed_over_and_empties_the_queue() -> None:
    h = HandOff(limit=100, wake_at=50, forward=())
    assert h.take_tallies() is None  # nothing tallied: nothing to write
    h.tallies.append(tallied(outcome(0), outcome(1)))
    h.tallies.append(tallied(outcome(2, error=ErrorKind.HTTP_5XX)))
    h.tallies.append(tallied(outcome(3, target="u")))
    merged = h.take_tallies()
    assert merged is not None
    assert merged.requests == 4
    stats = merged.tallied
    assert (stats[("t", "p")].requests, stats[("t", "p")].ok) == (3, 2)
    assert stats[("t", "p")].errors == {ErrorKind.HTTP_5XX.value: 1}
    assert stats[("u", "p")].requests == 1
    assert not h.tallies
    assert h.take_tallies() is None  # handed over once, never twice


def test_give_back_without_a_loop_applies_at_once_to_every_sink_in_order() -> None:
    order: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

        def apply(self, f: Fold) -> None:
            order.append(self.name)

    h = HandOff(limit=10, wake_at=5, forward=[Named("metrics"), Named("stats")])
    h.give_back(tallied(outcome(0)))
    assert order == ["metrics", "stats"]


def test_give_back_skips_an_empty_fold_and_a_handoff_with_no_sinks() -> None:
    sink = Applied()
    HandOff(limit=10, wake_at=5, forward=[sink]).give_back(Fold())
    assert sink.folds == []
    HandOff(limit=10, wake_at=5, forward=()).give_back(tallied(outcome(0)))  # no error


async def test_give_back_from_the_writer_thread_applies_on_the_loop() -> None:
    """The sinks (Metrics, RunStats) are the loop's: a fold the writer thread gives back is
    applied on the loop's thread, never on the writer's, and in the order given."""
    sink = Applied()
    h = HandOff(limit=10, wake_at=5, forward=[sink])
    h.loop = asyncio.get_running_loop()
    folds = [tallied(outcome(i)) for i in range(5)]
    writer = threading.Thread(target=lambda: [h.give_back(f) for f in folds])
    writer.start()
    await asyncio.to_thread(writer.join)
    await until(lambda: len(sink.folds) >= len(folds), what="every fold applied")
    assert sink.folds == folds
    assert set(sink.threads) == {threading.get_ident()}
    assert writer.ident not in sink.threads


def test_give_back_after_the_loop_closed_is_dropped_quietly() -> None:
    sink = Applied()
    h = HandOff(limit=10, wake_at=5, forward=[sink])
    loop = asyncio.new_event_loop()
    h.loop = loop
    loop.close()
    h.give_back(tallied(outcome(0)))  # the run is over: nothing reads it, no error
    assert sink.folds == []


def test_one_appender_and_one_taker_on_two_threads_lose_and_repeat_nothing() -> None:
    """The loop appends, the writer takes, with no lock: every record arrives once, in
    order, however the two interleave."""
    h = HandOff(limit=1 << 30, wake_at=64, forward=())
    n = 200_000
    got: list[int] = []
    done = threading.Event()

    def writer() -> None:
        while not done.is_set() or h.records:
            got.extend(h.take(64))

    taker = threading.Thread(target=writer)
    taker.start()
    for i in range(n):
        h.records.append(i)
    done.set()
    taker.join(30)
    assert not taker.is_alive()
    assert got == list(range(n))
