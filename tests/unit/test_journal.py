"""The journal: rows, totals and histograms as Metrics counts them, resume state, refusals,
a full disk, a full queue, retention, secrets. Real SQLite files in tmp_path; no network."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from array import array
from pathlib import Path

import pytest

from soakd import journal as journal_mod
from soakd.config import JournalConfig
from soakd.journal import (
    Journal,
    JournalError,
    JournalReader,
    config_doc,
    pack_itl,
    read_resume_state,
    records,
    unpack_itl,
)
from soakd.journal import store as store_mod
from soakd.journal.metrics import JournalMetrics
from soakd.measure.fold import Fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Sample
from tests.journal_fixtures import (
    MS,
    FakeClock,
    StoreHarness,
    config,
    make_outcomes,
    open_test_journal,
    outcome,
    resumed_equals_live,
    run_info,
    written,
)
from tests.scraping import continued, scraped


def test_itl_packs_to_four_bytes_a_gap() -> None:
    gaps = array("q", [1_000, 2_500_000, 17_000, 0, 5_000_000_000_000])
    blob = pack_itl(gaps)
    assert len(blob) == 4 * len(gaps)
    assert list(unpack_itl(blob)) == [1, 2500, 17, 0, 0xFFFFFFFF]  # microseconds, capped


def test_rows_totals_and_histograms_match_what_metrics_counted(tmp_path: Path) -> None:
    cfg = config()
    clock = FakeClock(offset_s=20)
    live = Metrics()
    for t in ("alpha", "beta"):
        live.add_target(t, ["warm", "hot"])
    exact = JournalConfig(flush_interval=0.05, itl="exact")  # compact: test_journal_size.py
    j = open_test_journal(tmp_path, cfg, clock, forward=(live,), journal_cfg=exact)
    outcomes = make_outcomes(clock, 600)
    for o in outcomes:
        j.record(o)
    j.close()

    with JournalReader(tmp_path) as r:
        rows = list(r.request_rows())
        totals = r.totals()
    assert [row["seq"] for row in rows] == [o.seq for o in outcomes]
    for row, o in zip(rows, outcomes, strict=True):
        assert row["target"] == o.target
        assert row["ttft_ns"] == o.ttft_ns
        assert row["e2e_ns"] == o.e2e_ns
        assert row["tpot_ns"] == o.tpot_ns
        assert row["lag_ns"] == o.dispatch_lag_ns
        assert row["end_ns"] == o.end_ns - clock.origin_ns
        assert row["error"] == (o.error.value if o.error else None)
        assert [g * 1000 for g in unpack_itl(row["itl"])] == list(o.itl_ns)
        if o.itl_ns:
            assert row["itl_max_ns"] == max(o.itl_ns)
    assert sum(t[4] for t in totals) == len(outcomes)
    oks = sum(1 for o in outcomes if o.ok)
    assert sum(t[4] for t in totals if t[2] == "ok") == oks

    # a fresh registry restored from the journal equals the one that counted live
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    info, _ = run_info(cfg)
    j2 = Journal(tmp_path / "journal.db", info, resume=state)
    j2.start()
    j2.close()
    assert j2.restored is not None
    restored = Metrics()
    for t in ("alpha", "beta"):
        restored.add_target(t, ["warm", "hot"])
    assert restored.restore(j2.restored.totals, j2.restored.histograms) == []
    before, after = continued(scraped(live, "soakd_")), continued(scraped(restored, "soakd_"))
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key] == pytest.approx(value, rel=1e-9), key


def test_prometheus_never_counts_what_the_journal_does_not_hold(tmp_path: Path) -> None:
    """Outcomes reach Metrics only after their commit: a scrape can never be ahead of the
    journal, so counters restored on resume never step back (a fake 'reset')."""
    clock = FakeClock(offset_s=5)
    db = tmp_path / "journal.db"
    seen: list[tuple[int, int]] = []

    class Checking:
        def __init__(self) -> None:
            self.n = 0

        def apply(self, f: Fold) -> None:
            self.n += f.requests
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                committed = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
            seen.append((self.n, committed))

    j = Journal(db, run_info(config())[0], JournalConfig(flush_interval=0.02), forward=[Checking()])
    j.start()
    j.attach(clock)
    for o in make_outcomes(clock, 200):
        j.record(o)
        time.sleep(0.0005)
    j.close()
    assert seen[-1][0] == 200
    assert all(n <= committed for n, committed in seen)


def test_full_queue_drops_are_counted_forwarded_and_totalled(tmp_path: Path) -> None:
    cfg = config()
    clock = FakeClock(offset_s=5)
    info, _ = run_info(cfg)
    live = Metrics()
    for t in ("alpha", "beta"):
        live.add_target(t, ["warm", "hot"])
    jm = JournalMetrics(live.registry)
    j = Journal(
        tmp_path / "journal.db", info, JournalConfig(queue_size=100), metrics=jm, forward=[live]
    )
    j.attach(clock)
    outcomes = make_outcomes(clock, 150)
    for o in outcomes:  # the writer is not running yet: the queue fills
        j.record(o)
    assert (
        live.registry.get_sample_value("soakd_journal_dropped_records_total", {"kind": "request"})
        == 50
    )
    counted = sum(v for (n, _), v in scraped(live, "soakd_requests_total").items())
    assert counted == 50  # the dropped ones went to Metrics at once
    j.start()
    j.close()
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == 100
        assert sum(t[4] for t in r.totals()) == 150  # totals still match the counters
    counted = sum(v for (n, _), v in scraped(live, "soakd_requests_total").items())
    assert counted == 150
    # the dropped ones are in no histogram, the journal's nor the exporter's
    e2e = scraped(live, "soakd_request_duration_seconds_count")
    assert sum(e2e.values()) == sum(1 for o in outcomes[:100] if o.ok)
    resumed_equals_live(tmp_path, live)


def fill_disk(h: StoreHarness) -> None:
    """The database capped at its size now: SQLITE_FULL, as on a full disk."""
    conn = h.store._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


def free_disk(h: StoreHarness) -> None:
    h.store._conn.execute("PRAGMA max_page_count = 1000000")


def live_metrics() -> tuple[Metrics, JournalMetrics]:
    live = Metrics()
    for t in ("alpha", "beta"):
        live.add_target(t, ["warm", "hot"])
    return live, JournalMetrics(live.registry)


def test_a_full_disk_keeps_measuring_loses_nothing_written_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's commit rule (soakd/journal/store.py), driven here: a batch the disk
    refuses goes to the metrics at once and is retried; once written, never counted twice."""
    monkeypatch.setattr(store_mod, "RETRY_MAX_S", 0.0)  # every cycle retries
    clock = FakeClock(offset_s=5)
    live, jm = live_metrics()
    h = StoreHarness(tmp_path, config(), clock, forward=[live], metrics=jm)
    h.add(make_outcomes(clock, 100, seed=1))
    h.cycle()
    assert written(live) == 100
    fill_disk(h)
    second = make_outcomes(clock, 300, seed=2)
    for i in range(0, 200, 20):  # the last free bytes of a page may take a batch or two
        h.add(second[i : i + 20])
        h.cycle()
    assert (live.registry.get_sample_value("soakd_journal_write_errors_total") or 0) >= 1
    before = written(live)
    # still measuring: Metrics got the batch the disk refused, and the next one at once
    assert sum(scraped(live, "soakd_requests_total").values()) == 300
    h.add(second[200:])
    h.cycle()
    assert sum(scraped(live, "soakd_requests_total").values()) == 400
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == before  # what was written is intact
    free_disk(h)  # space again
    h.cycle()
    assert written(live) == 400
    h.close()
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == 400
        assert sum(t[4] for t in r.totals()) == 400
        assert r.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert sum(scraped(live, "soakd_requests_total").values()) == 400  # not forwarded twice
    assert False in [c for _, c in h.applied]  # handed over before its commit
    resumed_equals_live(tmp_path, live)


def test_a_long_disk_failure_drops_rows_past_the_queue_but_counts_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While commits fail, the writer keeps folding what arrives (the metrics go on) and
    keeps at most ``queue_size`` rows for the retry; the rows past it are dropped and
    counted, their requests stay in the totals, the histograms and the rollups."""
    monkeypatch.setattr(store_mod, "RETRY_MAX_S", 0.0)
    clock = FakeClock(offset_s=5)
    live, jm = live_metrics()
    jcfg = JournalConfig(flush_interval=0.02, queue_size=150)
    h = StoreHarness(tmp_path, config(), clock, journal_cfg=jcfg, forward=[live], metrics=jm)
    h.add(make_outcomes(clock, 50, seed=1))
    h.cycle()
    fill_disk(h)
    second = make_outcomes(clock, 400, seed=2)
    before = 0
    for i in range(0, len(second), 50):
        h.add(second[i : i + 50])
        h.cycle()
        if not before and live.registry.get_sample_value("soakd_journal_write_errors_total"):
            before = written(live)  # what fitted before the disk was full (none since)
    assert sum(scraped(live, "soakd_requests_total").values()) == 450
    get = live.registry.get_sample_value
    dropped = get("soakd_journal_dropped_records_total", {"kind": "request"}) or 0
    assert 0 < dropped == 450 - before - 150  # kept for the retry: queue_size rows
    free_disk(h)
    h.cycle()
    assert written(live) == 450 - dropped
    h.close()
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == 450 - dropped
        assert sum(t[4] for t in r.totals()) == 450
        assert sum(x.stats.requests for x in r.rollups()) == 450
    assert sum(scraped(live, "soakd_requests_total").values()) == 450
    resumed_equals_live(tmp_path, live)


def test_resume_state_and_the_refusals(tmp_path: Path) -> None:
    cfg = config()
    clock = FakeClock(offset_s=1200)
    clock.next_seq = {"alpha": 77, "beta": 3}
    j = open_test_journal(tmp_path, cfg, clock)
    for o in make_outcomes(clock, 40):
        j.record(o)
    j.close(completed=False)
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    assert state.run_id == "syn-1"
    assert state.sessions == 1
    assert 1200e9 <= state.offset_ns < 1260e9
    assert state.next_seq == {"alpha": 77, "beta": 20}  # heartbeat vs rows: the larger
    _, plan = run_info(cfg)
    assert state.check(cfg, plan, force=False) == []

    changed = config(workload={"max_tokens": 99})
    with pytest.raises(JournalError, match=r"config differs .*workload\.max_tokens.*--force"):
        state.check(changed, plan, force=False)
    assert state.check(changed, plan, force=True) == ["workload.max_tokens"]
    # where it listens, logs, keeps data: not the experiment
    moved = config(exporter={"listen": "0.0.0.0:9999"}, journal={"keep_samples": "1d"})
    assert state.check(moved, plan, force=False) == []

    j = open_test_journal(tmp_path, cfg, clock)
    j.close(completed=True)
    with pytest.raises(JournalError, match="has finished; it is not restarted by accident"):
        read_resume_state(tmp_path / "journal.db")
    assert read_resume_state(tmp_path / "nothing.db") is None


def test_a_key_a_newer_soakd_added_is_no_config_change(tmp_path: Path) -> None:
    """Upgrading soakd mid-run resumes without --force: a key the stored config lacks takes
    its default; set away from it, it is a change like any other."""
    cfg = config()
    clock = FakeClock(offset_s=60)
    j = open_test_journal(tmp_path, cfg, clock)
    j.close(completed=False)
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    targets = state.stored.config_document["targets"]
    assert isinstance(targets, list)
    for target in targets:
        del target["max_output_factor"]  # as an older soakd stored it
    _, plan = run_info(cfg)
    assert state.check(cfg, plan, force=False) == []
    raised = config(
        targets=[
            {"name": "alpha", "base_url": "http://127.0.0.1:1", "cost": {"per_hour": 2.0}},
            {"name": "beta", "base_url": "http://127.0.0.1:2", "max_output_factor": 3},
        ]
    )
    with pytest.raises(JournalError, match=r"targets\[beta\]\.max_output_factor"):
        state.check(raised, plan, force=False)


def test_incompatible_and_foreign_files_get_a_clear_error(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=1)
    open_test_journal(tmp_path / "a", config(), clock).close()
    with sqlite3.connect(tmp_path / "a" / "journal.db") as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(JournalError, match=r"schema v99 .* newer than this soakd .* upgrade"):
        read_resume_state(tmp_path / "a" / "journal.db")
    with pytest.raises(JournalError, match="newer"):
        JournalReader(tmp_path / "a")

    (tmp_path / "b").mkdir()
    with sqlite3.connect(tmp_path / "b" / "journal.db") as conn:
        conn.execute("CREATE TABLE x (y)")
    with pytest.raises(JournalError, match="not a soakd journal"):
        read_resume_state(tmp_path / "b" / "journal.db")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "journal.db").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(JournalError, match="journal"):
        read_resume_state(tmp_path / "c" / "journal.db")


def test_one_writer_per_run_dir(tmp_path: Path) -> None:
    clock = FakeClock()
    j = open_test_journal(tmp_path, config(), clock)
    try:
        with pytest.raises(JournalError, match="in use by another soakd"):
            open_test_journal(tmp_path, config(), clock)
        with pytest.raises(JournalError, match=r"in use by another soakd \(pid \d+\)"):
            read_resume_state(tmp_path / "journal.db")  # refused before touching the dir
    finally:
        j.close()


def test_the_journal_holds_key_references_never_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-live-0123456789abcdef"
    monkeypatch.setenv("SOAKD_TEST_KEY", secret)
    cfg = config(
        targets=[
            {
                "name": "alpha",
                "base_url": "https://api.example.com/v1",
                # (a base URL takes no query: paths are appended to it)
                "metrics_url": f"https://api.example.com/metrics?key={secret}",
                "api_key_env": "SOAKD_TEST_KEY",
                "headers": {"X-Session-Token": secret, "X-Team": "t1"},
            }
        ],
        phases=[{"name": "p", "duration": "1m"}],
    )
    assert cfg.targets[0].api_key().get_secret_value() == secret  # type: ignore[union-attr]
    doc = config_doc(cfg)
    assert doc["targets"][0]["api_key_env"] == "SOAKD_TEST_KEY"
    assert doc["targets"][0]["headers"] == {"X-Session-Token": "<redacted>", "X-Team": "t1"}
    assert secret not in json.dumps(doc)
    clock = FakeClock(offset_s=1)
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(3)
    j.record(outcome(rng, clock, "alpha", "p", 0, 0.5, error=ErrorKind.HTTP_5XX))
    j.close()
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes(), f


def test_a_killed_writer_leaves_rows_the_reader_and_a_resume_fold_in(tmp_path: Path) -> None:
    """The rollups (the report's source) are written a window late; what a crash left
    unrolled is rebuilt from the rows, by the reader and by the next session."""
    cfg = config()
    clock = FakeClock(offset_s=30)
    j = open_test_journal(tmp_path, cfg, clock)
    outcomes = make_outcomes(clock, 300)
    for o in outcomes:
        j.record(o)
    j.close()
    db = tmp_path / "journal.db"
    with sqlite3.connect(db) as conn:  # as a SIGKILL would leave it: recent windows missing
        conn.execute("DELETE FROM rollups WHERE window >= 11")
        conn.execute("UPDATE progress SET stopped = 0, rollup_from_id = 1")
    with JournalReader(tmp_path) as r:
        assert sum(x.stats.requests for x in r.rollups()) == 300
    state = read_resume_state(db)
    j2 = Journal(db, run_info(cfg)[0], resume=state)
    j2.start()
    j2.close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE progress SET stopped = 1")
    with JournalReader(tmp_path) as r:  # persisted by the resume this time
        assert sum(x.stats.requests for x in r.rollups()) == 300
        assert r.sessions()[-1].session == 2


def test_retention_deletes_old_rows_but_keeps_the_aggregates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "RETENTION_EVERY_S", 0.0)  # after every commit
    clock = FakeClock(offset_s=60)
    jcfg = JournalConfig(flush_interval=0.02, keep_samples="1h", keep_requests="1h")
    h = StoreHarness(tmp_path, config(), clock, journal_cfg=jcfg)
    old = time.time() - 7200
    outcomes = make_outcomes(clock, 100)
    for i, o in enumerate(outcomes):
        o.wall_start = old if i < 60 else time.time()
    samples = [
        Sample(old + i if i < 30 else time.time(), "soakd_gpu_power_watts", 100.0, (("gpu", "0"),))
        for i in range(50)
    ]
    h.add(outcomes, samples)
    h.cycle()
    h.close()
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == 40
        assert sum(len(v) for v in r.samples(("soakd_gpu_power_watts",)).values()) == 20
        assert sum(x.stats.requests for x in r.rollups()) == 100
        assert sum(t[4] for t in r.totals()) == 100
        assert any(isinstance(e.event, records.Retention) for e in r.events())


def test_samples_and_events_round_trip(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=2)
    j = open_test_journal(tmp_path, config(), clock)
    j.sample(Sample(1.5, "soakd_gpu_memory_used_bytes", 3e9, (("gpu", "0"),)))
    j.sample(Sample(2.5, "soakd_gpu_memory_used_bytes", 3.1e9, (("gpu", "0"),)))
    j.sample(
        Sample(2.5, "soakd_target_oom_events_total", 1, (("source", "xid"), ("target", "alpha")))
    )
    j.event(records.Phase("warm", 0))
    j.close()
    with JournalReader(tmp_path) as r:
        series = r.series()
        got = r.samples(("soakd_gpu_memory_used_bytes", "soakd_target_oom_events_total"))
        names = {series[sid][0]: pts for sid, pts in got.items()}
        assert names["soakd_gpu_memory_used_bytes"] == [(1.5, 3e9), (2.5, 3.1e9)]
        labels = {series[sid][0]: series[sid][1] for sid in got}
        assert labels["soakd_target_oom_events_total"] == {"source": "xid", "target": "alpha"}
        events = [e.event for e in r.events()]
        assert [type(e) for e in events] == [records.RunStarted, records.Phase, records.RunStopped]
        assert events[1] == records.Phase("warm", 0)
        assert r.meta["soakd_version"]
        assert r.meta["schema_version"] == journal_mod.SCHEMA_VERSION


def test_recording_is_an_append_that_keeps_every_record(tmp_path: Path) -> None:
    """The hot path is an append: a burst far faster than the writer is queued whole and
    written whole, and the outcome is neither copied nor changed. (Its cost per call, a
    few µs, is a figure of bench/micro.py, not a budget here.)"""
    clock = FakeClock(offset_s=1)
    j = open_test_journal(tmp_path, config(), clock, journal_cfg=JournalConfig(queue_size=20_000))
    o = make_outcomes(clock, 1)[0]
    e2e = o.e2e_ns
    for _ in range(5_000):
        j.record(o)
    j.close()
    assert o.e2e_ns == e2e > MS  # the same object, recorded 5000 times, is never copied
    with JournalReader(tmp_path) as r:
        assert sum(1 for _ in r.request_rows()) == 5_000  # none dropped
        assert sum(t[4] for t in r.totals()) == 5_000
