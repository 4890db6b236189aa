"""The journal's size: ITL gaps kept compactly (exact only when asked), a v2 journal read,
exported and continued as v6, and the disk budget (journal.max_bytes): near it the rows
stop, the rollups go on, and the report says so."""

from __future__ import annotations

import csv
import json
import random
import sqlite3
from array import array
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from soakd.config import JournalConfig
from soakd.journal import (
    SCHEMA_VERSION,
    JournalReader,
    pack_itl_hist,
    read_resume_state,
    records,
    row_itl_ns,
    unpack_itl,
    unpack_itl_hist,
)
from soakd.journal import budget as budget_mod
from soakd.journal.metrics import JournalMetrics
from soakd.measure.analysis import Digest, digest_key
from soakd.report import build_report, render_markdown
from soakd.report.export import export
from tests.journal_fixtures import (
    FakeClock,
    StoreHarness,
    config,
    make_outcomes,
    open_test_journal,
    outcome,
    output_not_null,
)
from tests.waiting import wait_until

MS = 1_000_000


def _buckets(gaps: array[int] | list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for g in gaps:
        out[digest_key(g)] = out.get(digest_key(g), 0) + 1
    return out


@pytest.mark.parametrize("spread", ["tight", "wide", "spiky"])
@pytest.mark.parametrize("tokens", [2, 16, 128, 512])
def test_compact_gaps_keep_every_bucket_in_about_a_byte_each(spread: str, tokens: int) -> None:
    rng = random.Random(tokens)
    if spread == "tight":
        gaps = [rng.randint(19_000, 21_000) * 1000 for _ in range(tokens - 1)]
    elif spread == "wide":
        gaps = [rng.randint(5_000, 60_000) * 1000 for _ in range(tokens - 1)]
    else:  # a few gaps hundreds of times longer, and sub-microsecond ones
        gaps = [rng.choice([20 * MS] * 20 + [5_000 * MS, 300]) for _ in range(tokens - 1)]
    blob = pack_itl_hist(array("q", gaps))
    back = unpack_itl_hist(blob)
    assert len(back) == len(gaps)
    assert list(back) == sorted(back)
    assert _buckets(back) == _buckets(gaps)  # the report's digests see the same buckets
    for got, want in zip(back, sorted(gaps), strict=True):
        assert got == pytest.approx(max(want, 1000), rel=0.011)
    assert len(blob) <= 2 + 2 * len(_buckets(gaps)) + 2  # a mode byte, key, ~1-2 B a bucket
    if tokens == 512:
        assert len(blob) < 140


def test_bytes_per_request_stay_under_300_at_512_tokens(tmp_path: Path) -> None:
    """The default journal of 512-token answers with widely spread gaps (the worst case
    for compact gaps); exact gaps cost 4 bytes each, as asked."""
    sizes = {}
    for mode, n in (("empty", 0), ("compact", 2000), ("exact", 2000)):
        run = tmp_path / mode
        clock = FakeClock(offset_s=30)
        itl = "exact" if mode == "exact" else "compact"
        j = open_test_journal(run, config(), clock, journal_cfg=JournalConfig(itl=itl))
        rng = random.Random(5)
        for i in range(n):
            o = outcome(rng, clock, "alpha", "warm", i, 10 + i * 0.01)
            o.itl_ns = array("q", [rng.randint(5_000, 60_000) * 1000 for _ in range(511)])
            o.output_tokens = 512
            j.record(o)
        j.close()
        sizes[mode] = (run / "journal.db").stat().st_size
    # 16 KiB pages: an empty journal is ~180 kB of tables, each one page
    assert (sizes["compact"] - sizes["empty"]) / 2000 < 300
    assert (sizes["exact"] - sizes["empty"]) / 2000 > 4 * 511


def test_default_rows_hold_compact_gaps_and_the_export_lists_them(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, config(), clock)
    outcomes = make_outcomes(clock, 200)
    for o in outcomes:
        j.record(o)
    j.close()
    with JournalReader(tmp_path) as r:
        rows = list(r.request_rows())
    for row, o in zip(rows, outcomes, strict=True):
        assert row["itl"] is None
        assert _buckets(row_itl_ns(row)) == _buckets(o.itl_ns)
        assert row["itl_count"] == len(o.itl_ns)
        if o.itl_ns:
            assert row["itl_max_ns"] == max(o.itl_ns)  # still exact
    out = tmp_path / "out.jsonl"
    with out.open("w") as f:
        assert export(tmp_path, "jsonl", f, itl=True) == 200
    first = json.loads(out.read_text().splitlines()[0])
    # compact rows have no order to give: named for what they are, sorted bucket middles
    assert first["itl_us"] is None
    assert len(first["itl_sorted_us"]) == len(outcomes[0].itl_ns)
    for got, want in zip(first["itl_sorted_us"], sorted(outcomes[0].itl_ns), strict=True):
        assert got * 1000 == pytest.approx(want, rel=0.011)


def _as_v2(db: Path) -> None:
    """The journal as soakd before compact gaps (schema v2) would have left it."""
    output_not_null(db)
    with sqlite3.connect(db) as conn:
        for column in ("itl_hist", "usage_delta", "usage_rejected"):
            conn.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        conn.execute("DROP TABLE notes")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("PRAGMA user_version = 2")


def test_a_v2_journal_is_read_exported_and_continued_as_v6(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock, journal_cfg=JournalConfig(itl="exact"))
    old = make_outcomes(clock, 100)
    for o in old:
        j.record(o)
    j.close()
    db = tmp_path / "journal.db"
    _as_v2(db)
    # read as it is: the report, the export (exact gaps) and the resume state
    with JournalReader(tmp_path) as r:
        assert r.version == 2
        rows = list(r.request_rows())
        assert [list(row_itl_ns(row)) for row in rows] == [list(o.itl_ns) for o in old]
        assert all(row["itl_hist"] is None for row in rows)
    assert build_report(tmp_path).overall["alpha"].requests == 50
    out = tmp_path / "v2.csv"
    with out.open("w") as f:
        assert export(tmp_path, "csv", f, itl=True) == 100
    with out.open() as f:  # exact rows: every gap in the order it came, in itl_us
        exported = list(csv.DictReader(f))
    assert [r["itl_us"] for r in exported] == [
        " ".join(str(g // 1000) for g in o.itl_ns) for o in old
    ]
    assert all(r["itl_sorted_us"] == "" for r in exported)
    assert read_resume_state(db) is not None
    # continued: migrated to v6 in place, old rows keep their exact gaps, new ones compact
    clock2 = FakeClock(offset_s=40)
    j = open_test_journal(tmp_path, cfg, clock2)
    new = make_outcomes(clock2, 100, seed=2)
    for o in new:
        j.record(o)
    j.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    with JournalReader(tmp_path) as r:
        assert r.meta["schema_version"] == 6
        rows = list(r.request_rows())
    assert len(rows) == 200
    assert [list(unpack_itl(row["itl"])) for row in rows[:100]] == [
        [g // 1000 for g in o.itl_ns] for o in old
    ]
    assert all(row["itl"] is None for row in rows[100:])
    assert [_buckets(row_itl_ns(row)) for row in rows[100:]] == [_buckets(o.itl_ns) for o in new]
    rep = build_report(tmp_path)
    assert rep.overall["alpha"].requests + rep.overall["beta"].requests == 200
    with out.open("w") as f:
        assert export(tmp_path, "csv", f, itl=True) == 200


def test_near_the_budget_rows_stop_and_the_rollups_keep_the_report_whole(
    tmp_path: Path,
) -> None:
    reg = CollectorRegistry()
    metrics = JournalMetrics(reg)
    cfg, clock = config(), FakeClock(offset_s=30)
    jcfg = JournalConfig(flush_interval=0.02, max_bytes=1_000_000, itl="exact")
    j = open_test_journal(tmp_path, cfg, clock, journal_cfg=jcfg, metrics=metrics)
    rng = random.Random(3)
    n = 4000  # ~520 bytes a row: twice the budget
    outcomes = []
    for i in range(n):
        o = outcome(rng, clock, ("alpha", "beta")[i % 2], "warm", i // 2, 10 + i * 0.01)
        o.itl_ns = array("q", [rng.randint(5_000, 60_000) * 1000 for _ in range(100)])
        outcomes.append(o)
        j.record(o)
        if i % 200 == 199:  # batches of at most 200: the budget is checked before each
            wait_until(lambda: not j._q, what="the queue sent to the writer")
    j.close()
    with JournalReader(tmp_path) as r:
        kept = sum(1 for _ in r.request_rows(itl=False))
        stopped = [e.event for e in r.events() if isinstance(e.event, records.RowsStopped)]
        assert sum(x.stats.requests for x in r.rollups()) == n
        assert sum(t[4] for t in r.totals()) == n
        whole = Digest()
        for x in r.rollups():
            whole.merge(x.stats.e2e)
    assert 0 < kept < n
    assert len(stopped) == 1
    assert stopped[0].max_bytes == 1_000_000
    assert (tmp_path / "journal.db").stat().st_size < 1_200_000
    assert reg.get_sample_value("soakd_journal_rows_kept") == 0
    assert reg.get_sample_value("soakd_journal_rows_dropped_total") == n - kept
    assert reg.get_sample_value("soakd_journal_max_bytes") == 1_000_000
    assert (reg.get_sample_value("soakd_journal_disk_free_bytes") or 0) > 0
    assert reg.get_sample_value("soakd_journal_records_total", {"kind": "request"}) == kept
    ok = sorted(o.e2e_ns for o in outcomes if o.ok)
    assert whole.count == len(ok)
    assert whole.quantile(0.99) == pytest.approx(ok[int(0.99 * (len(ok) - 1))], rel=0.02)
    rep = build_report(tmp_path)
    assert rep.overall["alpha"].requests + rep.overall["beta"].requests == n
    text = render_markdown(rep)
    assert "stopped writing per-request rows" in text
    assert "journal.max_bytes" in text


def test_a_kill_after_the_rows_stopped_loses_at_most_the_last_flush(tmp_path: Path) -> None:
    """Without rows nothing can rebuild a window: they are stored at every commit."""
    cfg, clock = config(), FakeClock(offset_s=30)
    jcfg = JournalConfig(flush_interval=0.02, max_bytes=1_000_000)
    h = StoreHarness(tmp_path, cfg, clock, journal_cfg=jcfg)
    h.store._budget.rows_kept = False  # as after the switch
    h.add(make_outcomes(clock, 300))
    h.cycle()
    h.close()
    with sqlite3.connect(tmp_path / "journal.db") as conn:  # as a SIGKILL leaves it
        conn.execute("UPDATE progress SET stopped = 0")
        assert conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 0
    with JournalReader(tmp_path) as r:
        assert sum(x.stats.requests for x in r.rollups()) == 300


def test_the_default_budget_is_half_the_free_space_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(budget_mod, "disk_free", lambda _: 8_000_000_000)
    clock = FakeClock(offset_s=5)
    h = StoreHarness(tmp_path, config(), clock)  # the writer's side, here: disk_free faked
    first = h.store._budget.max_bytes
    h.close()
    assert 4_000_000_000 <= first < 4_001_000_000
    monkeypatch.setattr(budget_mod, "disk_free", lambda _: 1_000_000_000)
    h = StoreHarness(tmp_path, config(), clock)  # a resume keeps it
    assert h.store._budget.max_bytes == first
    h.close()
    monkeypatch.setattr(budget_mod, "disk_free", lambda _: 10**13)
    h = StoreHarness(tmp_path / "big", config(), clock)
    assert h.store._budget.max_bytes == budget_mod.AUTO_CAP
    h.close()


def test_a_long_run_is_reported_from_merged_windows_with_the_same_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 2 h the report reads 5-minute windows merged as they are read (its jitter
    slices): every figure is what the journal's own windows give, in less memory."""
    phases = [
        {"name": "warm", "duration": "100m", "load": {"mode": "closed", "concurrency": 2}},
        {"name": "hot", "duration": "100m", "load": {"mode": "poisson", "rate": 5}},
    ]
    cfg = config(phases=phases)  # 200 min: 12 s windows
    clock = FakeClock(offset_s=3 * 3600)
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(9)
    for i in range(3000):
        end_s = 30 + i * 3.9  # over 3.25 h, both phases
        phase = "warm" if end_s < 6000 else "hot"
        o = outcome(
            rng, clock, ("alpha", "beta")[i % 2], phase, i // 2, end_s, slow=1 + (i % 97) / 30
        )
        j.record(o)
    j.close()
    with JournalReader(tmp_path) as r:
        assert r.window_ns == 12 * 10**9
        assert r.span_ns() == 300 * 10**9
        fine, merged = r.rollups(), r.rollups(span_ns=r.span_ns())
    assert len(merged) < len(fine) / 4
    assert sum(x.stats.requests for x in merged) == 3000
    rep = build_report(tmp_path)
    monkeypatch.setattr(JournalReader, "span_ns", lambda self: self.window_ns)
    ref = build_report(tmp_path)
    assert rep.slice_s == ref.slice_s == 300
    for key in ("alpha", "beta"):
        assert rep.overall[key] == ref.overall[key]
        for phase in ("warm", "hot"):
            assert rep.by_phase[phase][key] == ref.by_phase[phase][key]
    assert rep.overall["alpha"].jitter is not None
