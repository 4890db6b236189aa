"""A journal soakd cannot trust is named, never papered over: damaged pages (a resume, a
report and an export each say so in one line, exit 2; ``--salvage`` reads what is
readable and says what it lost first), commits a damaged write-ahead log dropped (counted
against the mark the writer leaves outside the database; the resume says so and goes on
from where the run had got to)."""

from __future__ import annotations

import random
import shutil
import sqlite3
from functools import partial
from pathlib import Path

import pytest

from soakd.cli import main
from soakd.journal import (
    MARK_FILE,
    JournalDamaged,
    JournalReader,
    read_resume_state,
)
from soakd.journal.budget import RESERVE_FILE
from soakd.journal.integrity import read_mark
from soakd.report import build_report
from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome, write_hour_run
from tests.waiting import wait_until

PAGE = 16384


def pages_of(db: Path, table: str, kind: str = "leaf") -> list[int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        try:
            rows = conn.execute(
                "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY pageno",
                (table, kind),
            ).fetchall()
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no dbstat table")
    return [r[0] for r in rows]


def flip_page(db: Path, page: int) -> None:
    """Flip bytes across one page, as a bad sector or a stray write would."""
    data = bytearray(db.read_bytes())
    start = (page - 1) * PAGE
    for i in range(64):
        data[start + 8 + i * 97 % (PAGE - 8)] ^= 0x5A
    db.write_bytes(data)


@pytest.fixture(scope="module")
def hour_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hour_run(tmp_path_factory.mktemp("hour") / "run")


def damaged_copy(src: Path, dst: Path, table: str) -> tuple[Path, int]:
    shutil.copytree(src, dst)
    db = dst / "journal.db"
    leaves = pages_of(db, table)
    page = leaves[len(leaves) // 2]
    flip_page(db, page)
    return db, page


def test_a_flipped_page_is_one_line_everywhere_and_salvage_reads_the_rest(
    hour_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: report, export and resume ended in a traceback (sqlite3.DatabaseError:
    database disk image is malformed), exit 1."""
    with JournalReader(hour_run) as whole:
        rows = whole.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    run = tmp_path / "run"
    db, _ = damaged_copy(hour_run, run, "requests")

    with pytest.raises(JournalDamaged, match=r"is damaged: requests cannot be read whole"):
        JournalReader(run)
    with pytest.raises(JournalDamaged, match=r"a damaged journal is not continued"):
        read_resume_state(db)
    for argv in (["report", str(run)], ["export", str(run)]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.count("\n") == 1
        assert err.startswith(f"soakd: error: {db} is damaged: requests cannot be read whole")
        assert f"soakd report {run} --salvage" in err

    # --salvage: what is readable, said first, with the counts
    assert main(["export", str(run), "--salvage", "-o", str(tmp_path / "rows.csv")]) == 0
    err = capsys.readouterr().err
    exported = len((tmp_path / "rows.csv").read_text().splitlines()) - 1
    assert 0 < exported < rows
    assert f"requests {exported:,} (about {rows - exported:,} lost)" in err
    rep = build_report(run, salvage=True)
    assert rep.warnings[0].startswith("read with --salvage: journal.db is damaged; rows read:")
    assert f"requests {exported:,} (about {rows - exported:,} lost)" in rep.warnings[0]
    assert (run / "journal.salvaged.db").exists()
    assert main(["report", str(run), "--salvage", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("> **Warning:** read with --salvage")  # first


def test_a_damaged_rollup_page_loses_its_windows_and_says_how_many_requests(
    hour_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    damaged_copy(hour_run, run, "rollups")
    whole = build_report(hour_run, slowest_n=0)
    rep = build_report(run, salvage=True, slowest_n=0)
    counted = sum(r.requests for r in whole.overall.values())
    kept = sum(r.requests for r in rep.overall.values())
    assert kept < counted
    assert any(
        w.startswith(f"{counted - kept:,} of the {counted:,} requests measured are not in")
        and "the damaged pages held their windows" in w
        for w in rep.warnings
    ), rep.warnings


def test_nothing_to_salvage_without_the_run_record(hour_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(hour_run, run)
    flip_page(run / "journal.db", pages_of(run / "journal.db", "meta")[0])
    with pytest.raises(JournalDamaged, match=r"nothing can be salvaged|beyond salvage"):
        JournalReader(run, salvage=True)


def journal_with_wal(run: Path, n: int, checkpoint_at: int = 0) -> None:
    """A journal a killed soakd would leave: its commits still in the WAL (no checkpoint),
    copied from a live writer (the mark first: a copy is never behind its mark)."""
    clock = FakeClock(offset_s=600)
    live = run.parent / "live"
    j = open_test_journal(live, config(), clock)

    def committed(k: int) -> bool:
        mark = read_mark(live)
        return mark is not None and mark.last_id >= k

    rng = random.Random(3)
    for i in range(n):
        target = ("alpha", "beta")[i % 2]
        clock.next_seq[target] = i // 2 + 1  # as the runner numbers its sends
        j.publish()  # as soakd's loop does (every 0.1 s, here every send)
        j.record(outcome(rng, clock, target, "warm", i // 2, 1 + 590 * i / n))
        if i % 300 == 299:  # commits of a few hundred rows: many WAL frames
            wait_until(partial(committed, i + 1), 20, "the writer's commit")
        if i + 1 == checkpoint_at:  # what a checkpoint moved into journal.db stays there
            with sqlite3.connect(live / "journal.db") as other:
                other.execute("PRAGMA wal_checkpoint(PASSIVE)")
    wait_until(lambda: committed(n), 20, "the writer's last commit")
    run.mkdir()
    for name in (MARK_FILE, "journal.db", "journal.db-wal"):
        shutil.copy(live / name, run / name)
    j.close()


def damage_wal(run: Path, fraction: float) -> None:
    wal = run / "journal.db-wal"
    data = bytearray(wal.read_bytes())
    frames = (len(data) - 32) // (24 + PAGE)
    k = int(frames * fraction)
    data[32 + k * (24 + PAGE) + 24 + 100] ^= 0xFF  # a byte of the page: its checksum fails
    wal.write_bytes(data)


def test_commits_a_damaged_wal_dropped_are_counted_and_the_resume_says_so(
    tmp_path: Path,
) -> None:
    """Before: the rows after the damage were gone, the resume carried on from the older
    heartbeat (reusing the lost seq numbers) and nothing said so."""
    run = tmp_path / "run"
    journal_with_wal(run, 3000)
    mark = read_mark(run)
    assert mark is not None
    assert mark.last_id == 3000
    with JournalReader(run) as whole:
        assert whole.loss is None  # a whole journal: no loss invented
    damage_wal(run, 0.5)
    with JournalReader(run) as reader:
        held = reader.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        loss = reader.loss
    assert 0 < held < 3000
    assert loss is not None
    assert (loss.rows, loss.requests) == (3000 - held, 3000 - held)
    rep = build_report(run, slowest_n=0)
    assert rep.warnings[0].startswith(
        f"the journal lost {3000 - held:,} request row(s) and {3000 - held:,} request(s)"
    )
    assert "write-ahead log (journal.db-wal) was damaged, truncated or removed" in rep.warnings[0]

    state = read_resume_state(run / "journal.db")
    assert state is not None
    assert state.loss == loss
    assert state.next_seq == {"alpha": 1500, "beta": 1500}  # the lost seq numbers not reused
    assert state.offset_ns == mark.offset_ns  # the plan goes on from where it had got to


def test_a_wal_deleted_whole_is_a_loss_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    journal_with_wal(run, 900, checkpoint_at=300)
    (run / "journal.db-wal").unlink()
    with JournalReader(run) as reader:
        held = reader.conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        assert reader.loss is not None
    assert 300 <= held < 900  # what the checkpoint had moved
    assert reader.loss.rows == 900 - held


def test_a_wal_deleted_before_any_checkpoint_takes_the_whole_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    journal_with_wal(run, 300)
    (run / "journal.db-wal").unlink()
    for read in (lambda: JournalReader(run), lambda: read_resume_state(run / "journal.db")):
        with pytest.raises(JournalDamaged, match=r"holds none of the run: its write-ahead log"):
            read()


def test_the_reserve_is_held_while_writing_and_given_back_at_the_end(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=10)
    j = open_test_journal(tmp_path, config(), clock)
    try:
        reserve = tmp_path / RESERVE_FILE
        assert reserve.stat().st_blocks * 512 >= 4 << 20  # real blocks, not a sparse file
    finally:
        j.close()
    assert not reserve.exists()
    assert read_mark(tmp_path) is not None
