"""The plan clock crosses to the journal's link thread as the loop's snapshots only.

The runner is the loop's: its phase, seq numbers and ledger change at every send. The
journal's link thread packs what the loop queued every 0.1 s; it must never read the runner
itself (a read from another thread would rest on the GIL making dict copies atomic). The
loop publishes a frozen ``ClockState`` (``Journal.publish``) and the thread reads that.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

from soakd.journal import open_journal, read_resume_state
from tests.journal_fixtures import FakeClock, config, outcome, run_info

PLAN_CLOCK = frozenset({"origin_ns", "phase", "finished", "stopping", "next_seq", "missed"})


@dataclass
class LoopOnlyClock(FakeClock):
    """A runner stand-in that notes which threads read its plan clock."""

    readers: set[str] = field(default_factory=set)

    def __getattribute__(self, name: str) -> object:
        if name in PLAN_CLOCK:
            object.__getattribute__(self, "readers").add(threading.current_thread().name)
        return object.__getattribute__(self, name)


async def test_the_link_thread_reads_only_what_the_loop_published(tmp_path: Path) -> None:
    cfg = config()
    info, _ = run_info(cfg)
    clock = LoopOnlyClock(offset_s=5)
    journal = await open_journal(tmp_path, info, cfg.journal)
    journal.attach(clock)
    rng = random.Random(5)
    for i in range(400):
        target = ("alpha", "beta")[i % 2]
        clock.next_seq[target] = i // 2 + 1  # the runner numbers a send...
        journal.record(outcome(rng, clock, target, "warm", i // 2, 1 + i * 0.01))  # ...ends it
        if i % 50 == 49:
            await asyncio.sleep(0.03)  # the loop turns: the writer packs, the loop publishes
    clock.missed[("beta", "warm", "late")] = 7  # the ledger's count, just before the stop
    await journal.aclose(completed=False)

    assert clock.readers == {threading.current_thread().name}  # the loop's thread only
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    assert state.next_seq == {"alpha": 200, "beta": 200}  # the final snapshot's
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 400
        assert conn.execute("SELECT * FROM missed").fetchall() == [("beta", "warm", "late", 7)]
