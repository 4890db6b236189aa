"""The journal's writer in a process of its own (soakd/journal/process.py): a writer that is
killed mid-run is started again and loses nothing soakd sent it; one that cannot open the
journal is a one-line error; soakd's SIGKILL ends it. Real processes, real SQLite files."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from soakd.config import JournalConfig
from soakd.journal import Journal, JournalError, JournalReader, records
from soakd.journal.metrics import JournalMetrics
from soakd.metrics.run import Metrics
from tests.journal_fixtures import (
    FakeClock,
    config,
    make_outcomes,
    open_test_journal,
    resumed_equals_live,
    run_info,
)
from tests.scraping import scraped
from tests.waiting import wait_until


def live() -> tuple[Metrics, JournalMetrics]:
    m = Metrics()
    for t in ("alpha", "beta"):
        m.add_target(t, ["warm", "hot"])
    return m, JournalMetrics(m.registry)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def committed_rows(run_dir: Path) -> int:
    """Request rows the writer has committed, read as another process would (0 before
    the journal or its table exists)."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)
        ) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_a_killed_writer_is_started_again_and_loses_nothing_sent(tmp_path: Path) -> None:
    """SIGKILL the writer between packets and during them: the next one continues the
    session, the packets the dead one had not committed are sent again, and every outcome
    is one row, counted once."""
    metrics, jm = live()
    clock = FakeClock(offset_s=30)
    j = open_test_journal(
        tmp_path,
        config(),
        clock,
        forward=[metrics],
        metrics=jm,
        journal_cfg=JournalConfig(flush_interval=0.2),
    )
    outcomes = make_outcomes(clock, 900)
    try:
        for i in range(0, 900, 30):
            for o in outcomes[i : i + 30]:
                j.record(o)
            if i in (300, 600):
                pid = j.link.pid
                assert pid is not None
                restarts = j.restarts
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda n=restarts: j.restarts > n, 15, "a restart")
            time.sleep(0.01)
        # the requests counted from the folds: a writer killed between its commit and its
        # Stats takes that batch's soakd_journal_records_total with it (docs/journal.md)
        wait_until(
            lambda: sum(scraped(metrics, "soakd_requests_total").values()) == 900,
            20,
            "every row written and counted",
        )
    finally:
        j.close()
    get = metrics.registry.get_sample_value
    assert get("soakd_journal_writer_restarts_total") == 2
    assert sum(scraped(metrics, "soakd_requests_total").values()) == 900  # counted once
    with JournalReader(tmp_path) as r:
        rows = list(r.request_rows(itl=False))
        assert sorted((row["target"], row["seq"]) for row in rows) == sorted(
            (o.target, o.seq) for o in outcomes
        )
        assert sum(t[4] for t in r.totals()) == 900
        assert sum(x.stats.requests for x in r.rollups()) == 900
        assert [s.session for s in r.sessions()] == [1]  # the same session, continued
        assert sum(isinstance(e.event, records.WriterRestarted) for e in r.events()) == 2
    resumed_equals_live(tmp_path, metrics)


def test_a_journal_the_writer_cannot_open_is_a_one_line_error(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        conn.execute("CREATE TABLE x (y)")
    j = Journal(tmp_path / "journal.db", run_info(config())[0])
    with pytest.raises(JournalError, match=r"journal\.db: not a soakd journal$"):
        j.start()
    j2 = Journal(tmp_path / "journal.db", run_info(config())[0])  # the lock was let go
    with pytest.raises(JournalError, match="not a soakd journal"):
        j2.start()


SCRIPT = """
import sys, time
from tests.journal_fixtures import FakeClock, config, make_outcomes, open_test_journal

clock = FakeClock(offset_s=5)
j = open_test_journal(__import__("pathlib").Path(sys.argv[1]), config(), clock)
for o in make_outcomes(clock, 100):
    j.record(o)
print(j.link.pid, flush=True)
time.sleep(60)
"""


def test_soakds_sigkill_ends_its_writer_and_frees_the_run_dir(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    writer = int(proc.stdout.readline())
    assert alive(writer)
    wait_until(lambda: committed_rows(tmp_path) == 100, 10, "the 100 rows committed")
    proc.kill()
    proc.wait()
    wait_until(lambda: not alive(writer), 5, "the writer's end")
    j = open_test_journal(tmp_path, config(), FakeClock(offset_s=5))  # the lock is free
    j.close()
    with JournalReader(tmp_path) as r:  # what was committed before the kill is intact
        assert len(list(r.request_rows(itl=False))) == 100
