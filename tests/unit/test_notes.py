"""Answer notes (soakd/measure/notes.py): usage not taken, usage off the stream, an unreadable
Retry-After. Each is counted per target the same in Metrics, the journal's notes table and
/status, named once in the log, continued by a resume, and written in the report; a v3
journal is read and continued as v6. And Retry-After is read as HTTP writes it."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.config import JournalConfig
from soakd.journal import SCHEMA_VERSION, Journal, JournalReader, read_resume_state, schema
from soakd.measure.notes import NOTES, Notes, describe, notes_of
from soakd.metrics.run import Metrics
from soakd.model import Outcome
from soakd.report import build_report
from soakd.report.export import export
from soakd.targets.errors import retry_after
from tests.journal_fixtures import (
    FakeClock,
    config,
    open_test_journal,
    outcome,
    output_not_null,
    run_info,
)


def noted(o: Outcome, i: int) -> Outcome:
    """Every fifth answer of alpha had usage -5; every seventh was 1 token of usage for its
    streamed ones; every eleventh of beta was a 429 with an unreadable Retry-After."""
    if o.target == "alpha" and i % 5 == 0:
        o.usage_reported, o.usage_rejected = False, "negative"
    elif o.target == "alpha" and i % 7 == 0:
        o.usage_delta = 1 - o.output_tokens
        o.output_tokens = 1
    elif o.target == "beta" and i % 11 == 0:
        o.status, o.retry_after_unreadable = 429, True
    return o


def outcomes(clock: FakeClock, n: int, seed: int) -> list[Outcome]:
    import random

    rng = random.Random(seed)
    return [
        noted(
            outcome(rng, clock, ("alpha", "beta")[i % 2], "warm", i // 2, 10 + i * 0.01),
            i,
        )
        for i in range(n)
    ]


def expected(outs: list[Outcome]) -> dict[tuple[str, str], int]:
    want: dict[tuple[str, str], int] = {}
    for o in outs:
        for note in notes_of(o):
            want[(o.target, note)] = want.get((o.target, note), 0) + 1
    return want


def metric_notes(m: Metrics) -> dict[tuple[str, str], int]:
    got = {}
    for t in ("alpha", "beta"):
        for name, note, labels in (
            ("soakd_usage_rejected_total", "usage_rejected:negative", {"reason": "negative"}),
            ("soakd_usage_mismatch_total", "usage_mismatch:below", {"direction": "below"}),
            ("soakd_usage_mismatch_total", "usage_mismatch:above", {"direction": "above"}),
            ("soakd_retry_after_unreadable_total", "retry_after_unreadable", {}),
        ):
            v = m.registry.get_sample_value(name, {"target": t, **labels})
            if v:
                got[(t, note)] = int(v)
    return got


def test_notes_are_counted_alike_everywhere_and_a_resume_continues_them(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=30)
    live = Metrics(CollectorRegistry())
    for t in ("alpha", "beta"):
        live.add_target(t, ["warm", "hot"])
    sink = Notes()
    j = open_test_journal(tmp_path, cfg, clock, forward=[live])
    first = outcomes(clock, 400, seed=1)
    with capture_logs() as logs:
        for o in first:
            j.record(o)
            sink.record(o)
    j.close()
    want = expected(first)
    assert want[("alpha", "usage_rejected:negative")] == 40
    assert want[("alpha", "usage_mismatch:below")] > 0
    assert want[("beta", "retry_after_unreadable")] > 0
    assert metric_notes(live) == want
    with JournalReader(tmp_path) as r:
        assert {(t, n): c for t, n, c in r.notes()} == want
        rows = list(r.request_rows(itl=False))
    assert sum(1 for row in rows if row["usage_rejected"] == "negative") == 40
    assert [row["usage_delta"] for row in rows] == [o.usage_delta for o in first]
    # /status: each target's counts; the log: each note once per target, at its first
    assert sink.row("alpha") == {
        "usage_mismatch:below": want[("alpha", "usage_mismatch:below")],
        "usage_rejected:negative": 40,
    }
    assert sorted((e["event"], e["target"]) for e in logs) == [
        ("retry_after_unreadable", "beta"),
        ("usage_mismatch", "alpha"),
        ("usage_rejected", "alpha"),
    ]
    # the report says it per target, in words
    rep = build_report(tmp_path)
    assert rep.answer_notes["alpha"]["usage_rejected:negative"] == 40
    assert any(
        n.startswith("alpha: usage not taken for 40 answers (40 negative)") for n in rep.notes
    )
    assert any(n.startswith("beta: ") and "Retry-After" in n for n in rep.notes)
    # a resume continues the counters from the journal, then counts on
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    info, _ = run_info(cfg)
    again = Metrics(CollectorRegistry())
    for t in ("alpha", "beta"):
        again.add_target(t, ["warm", "hot"])
    j2 = Journal(
        tmp_path / "journal.db", info, JournalConfig(flush_interval=0.05), forward=[again],
        resume=state,
    )  # fmt: skip
    j2.start()
    j2.attach(clock)
    assert j2.restored is not None
    again.restore_notes(j2.restored.notes)
    assert metric_notes(again) == want
    more = outcomes(clock, 100, seed=2)
    for o in more:
        j2.record(o)
    j2.close()
    both = expected(first + more)
    assert metric_notes(again) == both
    with JournalReader(tmp_path) as r:
        assert {(t, n): c for t, n, c in r.notes()} == both


def test_a_note_of_a_dropped_record_is_still_counted(tmp_path: Path) -> None:
    """A full queue drops the row, never the count (as the totals)."""
    cfg, clock = config(), FakeClock(offset_s=5)
    info, _ = run_info(cfg)
    live = Metrics(CollectorRegistry())
    for t in ("alpha", "beta"):
        live.add_target(t, ["warm", "hot"])
    j = Journal(tmp_path / "journal.db", info, JournalConfig(queue_size=100), forward=[live])
    j.attach(clock)
    outs = outcomes(clock, 300, seed=3)
    for o in outs:  # the writer is not running yet: the queue fills, 200 are dropped
        j.record(o)
    j.start()
    j.close()
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows(itl=False)) == 100
        assert {(t, n): c for t, n, c in r.notes()} == expected(outs)
    assert metric_notes(live) == expected(outs)


def _as_v3(db: Path) -> None:
    """The journal as soakd before the usage columns (schema v3) would have left it."""
    output_not_null(db)
    with sqlite3.connect(db) as conn:
        for column in ("usage_delta", "usage_rejected"):
            conn.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        conn.execute("DROP TABLE notes")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
        conn.execute("PRAGMA user_version = 3")


def test_a_v3_journal_is_read_exported_and_continued_as_v6(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    old = outcomes(clock, 100, seed=4)
    for o in old:
        j.record(o)
    j.close()
    db = tmp_path / "journal.db"
    _as_v3(db)
    with JournalReader(tmp_path) as r:
        assert r.version == 3
        assert r.notes() == []
        assert all(row["usage_delta"] is None for row in r.request_rows(itl=False))
    assert build_report(tmp_path).answer_notes == {}
    with (tmp_path / "v3.csv").open("w") as f:
        assert export(tmp_path, "csv", f) == 100
    assert read_resume_state(db) is not None
    j = open_test_journal(tmp_path, cfg, FakeClock(offset_s=40))
    new = outcomes(clock, 100, seed=5)
    for o in new:
        j.record(o)
    j.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    with JournalReader(tmp_path) as r:
        rows = list(r.request_rows(itl=False))
        assert {(t, n): c for t, n, c in r.notes()} == expected(new)  # counted from v4 on
    assert [row["usage_delta"] for row in rows] == [None] * 100 + [o.usage_delta for o in new]
    with (tmp_path / "v4.csv").open("w") as f:
        assert export(tmp_path, "csv", f) == 200
    header, *lines = (tmp_path / "v4.csv").read_text().splitlines()
    assert header.endswith("usage_delta,usage_rejected,conversation,turn,trace_id,source_record")
    assert sum(",negative," in line for line in lines) == sum(
        o.usage_rejected == "negative" for o in new
    )


def _as_v4(db: Path) -> None:
    """The journal as soakd before unknown output counts (schema v4) would have left it."""
    output_not_null(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
        conn.execute("PRAGMA user_version = 4")


def _output_nullable(db: Path) -> bool:
    with sqlite3.connect(db) as conn:
        (notnull,) = (
            c[3] for c in conn.execute("PRAGMA table_info(requests)") if c[1] == "output_tokens"
        )
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    return not notnull


def test_a_v4_journal_is_continued_as_v6_and_keeps_an_unknown_count(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    old = outcomes(clock, 50, seed=6)
    for o in old:
        j.record(o)
    j.close()
    db = tmp_path / "journal.db"
    _as_v4(db)
    assert not _output_nullable(db)
    with JournalReader(tmp_path) as r:
        assert r.version == 4
    # continued: the NOT NULL dropped in place, and a count soakd does not know is NULL
    j = open_test_journal(tmp_path, cfg, FakeClock(offset_s=40))
    unknown = outcome(random.Random(1), clock, "alpha", "hot", 99, 30.0)
    unknown.output_tokens, unknown.usage_reported = None, False
    unknown.usage_rejected = "negative"
    j.record(unknown)
    j.close()
    assert _output_nullable(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    with JournalReader(tmp_path) as r:
        rows = list(r.request_rows(itl=False))
    assert [row["output_tokens"] for row in rows] == [o.output_tokens for o in old] + [None]
    rep = build_report(tmp_path)
    assert rep.overall["alpha"].output_tokens == sum(
        o.output_tokens or 0 for o in old if o.target == "alpha"
    )
    with (tmp_path / "v5.csv").open("w") as f:
        assert export(tmp_path, "csv", f) == 51


def test_the_golden_v4_journal_migrates_without_a_row_rewritten(tmp_path: Path) -> None:
    """A journal v4 soakd wrote (tests/data/report-golden): migrated in place, its rows and
    pages as they were (the conversation columns NULL: no conversation), its
    output_tokens column now taking NULL."""
    db = tmp_path / "journal.db"
    shutil.copyfile(Path(__file__).parent.parent / "data/report-golden/journal.db", db)
    with sqlite3.connect(db) as conn:
        before = conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    assert not _output_nullable(db)
    conn = schema.connect(db, readonly=False)
    try:
        schema.migrate(conn)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
        after = conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
        assert after == [(*row, None, None) for row in before]
        assert conn.execute("PRAGMA page_count").fetchone()[0] == pages
    finally:
        conn.close()
    assert _output_nullable(db)


def test_describe_says_what_a_target_had() -> None:
    assert describe({}) == []
    lines = describe({"usage_rejected:negative": 3, "usage_rejected:implausible": 1})
    assert lines == [
        "usage not taken for 4 answers (1 implausible, 3 negative): their output tokens "
        "are the streamed count"
    ]


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({"Retry-After": "7"}, (7.0, False)),
        ({"Retry-After": " 0 "}, (0.0, False)),
        ({"retry-after-ms": "1500"}, (1.5, False)),
        ({"retry-after-ms": "x", "Retry-After": "2"}, (2.0, False)),
        ({}, (None, False)),
        # there, and not what HTTP writes: the default pause, counted
        ({"Retry-After": "\u00b2"}, (None, True)),  # "²".isdigit() is True; float() fails
        ({"Retry-After": "\u0663"}, (None, True)),  # Arabic-Indic 3: float() reads it
        ({"Retry-After": "-5"}, (None, True)),
        ({"Retry-After": "9" * 400}, (None, True)),  # float() reads it as inf
        ({"Retry-After": "99999999"}, (None, True)),  # over 10^7 s
        ({"Retry-After": "1e3"}, (None, True)),
        ({"Retry-After": "nan"}, (None, True)),
        ({"Retry-After": ""}, (None, True)),
        ({"Retry-After": "Mon, 32 Foo 2025 25:61:00 GMT"}, (None, True)),
        ({"Retry-After": "Wed, 21 Oct 99999 07:28:00 GMT"}, (None, True)),
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, (None, True)),  # ~8,000 years
        ({"retry-after-ms": "\u0661\u0662"}, (None, True)),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, (0.0, False)),  # past: now
    ],
)
def test_retry_after_is_read_as_http_writes_it(
    headers: dict[str, str], want: tuple[float | None, bool]
) -> None:
    assert retry_after(headers) == want


@pytest.mark.parametrize(
    ("delta", "want"),
    [
        (None, []),
        (0, []),
        (1, []),  # vLLM counts the stop token it does not stream
        (-1, []),
        (2, ["usage_mismatch:above"]),  # several tokens a chunk: vLLM under load
        (-2, ["usage_mismatch:below"]),  # fewer tokens than chunks: a miscount
    ],
)
def test_a_mismatch_says_its_direction(delta: int | None, want: list[str]) -> None:
    o = Outcome("t", "p", 0, 0)
    o.usage_delta = delta
    assert list(notes_of(o)) == want
    assert set(want) <= set(NOTES)  # the bounded set the journal and the labels use
