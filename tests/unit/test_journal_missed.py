"""Sends not made are journaled: the ledger's counts reach the `missed` table at each
commit, a resume continues them, the report reads them, and a v1 journal (before the
table) is read and continued."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from soakd.journal import SCHEMA_VERSION, JournalReader
from soakd.report import build_report
from tests.journal_fixtures import FakeClock, config, open_test_journal


def test_missed_sends_are_journaled_and_restored(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=60)
    clock.missed = {("alpha", "warm", "late"): 120, ("beta", "warm", "spend_cap"): 3}
    j = open_test_journal(tmp_path, config(), clock)
    j.close()
    with JournalReader(tmp_path) as reader:
        assert reader.missed() == clock.missed
    # the next session starts its ledger from them, and adds to them
    j = open_test_journal(tmp_path, config(), clock)
    assert j.restored is not None
    assert j.restored.missed == clock.missed
    clock.missed = {**clock.missed, ("alpha", "hot", "in_flight_cap"): 7}
    j.close()
    rep = build_report(tmp_path)
    alpha = rep.overall["alpha"]
    assert alpha.missed == 127
    assert alpha.missed_by_reason == {"late": 120, "in_flight_cap": 7}
    assert alpha.offered == alpha.requests + 127
    assert rep.by_phase["warm"]["beta"].missed_by_reason == {"spend_cap": 3}
    assert any("CLIENT-LIMITED" in n and "alpha" in n for n in rep.notes)


def test_a_v1_journal_is_read_and_continued(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=10)
    open_test_journal(tmp_path, config(), clock).close()
    with sqlite3.connect(tmp_path / "journal.db") as conn:  # as soakd before the ledger
        conn.execute("DROP TABLE missed")
        conn.execute("PRAGMA user_version = 1")
    with JournalReader(tmp_path) as reader:
        assert reader.missed() == {}
    assert build_report(tmp_path).overall["alpha"].missed == 0
    clock.missed = {("alpha", "warm", "late"): 5}
    open_test_journal(tmp_path, config(), clock).close()  # continued: migrated to v2, v3
    with JournalReader(tmp_path) as reader:
        assert reader.missed() == {("alpha", "warm", "late"): 5}
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
