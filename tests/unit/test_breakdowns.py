"""Latency by context length and by turn: each request's conversation and turn journaled
(from soakd's own process and from a sender worker's record), exported, migrated into a v5
journal; the report's tables read from a journal with a few conversations; the /metrics
families with their bounded labels (soakd/measure/breakdown.py)."""

from __future__ import annotations

import asyncio
import csv
import json
import random
import sqlite3
from pathlib import Path

from soakd.journal import JournalReader
from soakd.journal.schema import SCHEMA_VERSION
from soakd.measure.breakdown import CONTEXT_LABELS, TURN_LABELS, context_of, turn_of
from soakd.measure.fold import Fold, fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from soakd.report import build_report
from soakd.report.breakdowns import context_table, turn_tables
from soakd.report.export import export
from soakd.report.markdown import render_markdown
from soakd.workers import wire
from soakd.workers.pool import Wakeups, Worker
from tests.journal_fixtures import FakeClock, before_v6, config, open_test_journal, outcome
from tests.scraping import scraped

MS = 1_000_000


def via_worker(sent: Outcome) -> Outcome:
    """``sent`` packed by a sender worker and read by soakd's pool, as a run gets it."""
    buf = bytearray()
    wire.pack_outcome(buf, 7, sent)

    async def go() -> Outcome:
        w = Worker(0)
        out = Outcome(sent.target, sent.phase, sent.seq, sent.scheduled_ns)
        done = asyncio.get_running_loop().create_future()
        w.pending[7] = (out, done, False)
        w.finished(bytes(buf), None, Wakeups())
        await done
        return out

    return asyncio.run(go())


def conversations(clock: FakeClock, n: int, turns: int, seed: int = 1) -> list[Outcome]:
    """``n`` conversations of ``turns`` turns on alpha: each turn's context 600 tokens
    longer than the last, its TTFT 10 ms a 100 tokens of it; then as many single
    requests on beta. One turn-3 request of each conversation fails (a 5xx)."""
    rng = random.Random(seed)
    out = []
    seq = 0
    for c in range(n):
        for t in range(turns):
            o = outcome(rng, clock, "alpha", "warm", seq, 10 + seq * 0.01)
            o.conversation, o.turn = c, t
            o.prompt_tokens = 100 + 600 * t
            o.first_token_ns = o.sent_ns + o.prompt_tokens // 10 * MS
            if t == 3:
                o.error, o.status, o.first_token_ns = ErrorKind.HTTP_5XX, 503, None
            out.append(o)
            seq += 1
    for _ in range(n):
        out.append(outcome(rng, clock, "beta", "warm", seq, 10 + seq * 0.01))
        seq += 1
    return out


def test_keys_are_bounded() -> None:
    assert context_of(None) is None
    assert context_of(0) is None
    assert [context_of(n) for n in (1, 128, 129, 4096, 4097, 131072, 131073)] == [
        "128",
        "128",
        "256",
        "4096",
        "8192",
        "131072",
        "+Inf",
    ]
    assert turn_of(-1, 0) is None
    assert [turn_of(5, t) for t in (0, 15, 16, 400)] == ["0", "15", "16+", "16+"]
    assert len(CONTEXT_LABELS) == 12
    assert len(TURN_LABELS) == 17


def test_conversation_and_turn_are_journaled_and_exported(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    sent = conversations(clock, 2, 3)
    for i, o in enumerate(sent):  # every other one as a sender worker's record
        j.record(via_worker(o) if i % 2 else o)
    j.close()
    want = [(o.conversation, o.turn) if o.conversation >= 0 else (None, None) for o in sent]
    with JournalReader(tmp_path) as r:
        assert r.version == SCHEMA_VERSION == 6
        rows = list(r.request_rows(itl=False))
    assert [(row["conversation"], row["turn"]) for row in rows] == want
    out = tmp_path / "rows.csv"
    with out.open("w") as f:
        assert export(tmp_path, "csv", f) == len(sent)
    with out.open() as f:
        exported = [(r["conversation"], r["turn"]) for r in csv.DictReader(f)]
    assert exported == [("", "") if c is None else (str(c), str(t)) for c, t in want]
    with (tmp_path / "rows.jsonl").open("w") as f:
        export(tmp_path, "jsonl", f)
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert [(d["conversation"], d["turn"]) for d in map(json.loads, lines)] == want


def test_a_v5_journal_is_continued_as_v6(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    old = conversations(clock, 1, 2)
    for o in old:
        j.record(o)
    j.close()
    db = tmp_path / "journal.db"
    before_v6(db)
    with sqlite3.connect(db) as conn:
        before = conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
    with JournalReader(tmp_path) as r:  # read as it is
        assert r.version == 5
        assert {row["conversation"] for row in r.request_rows(itl=False)} == {None}
    assert build_report(tmp_path).breakdowns  # the context table needs no turn
    j = open_test_journal(tmp_path, cfg, FakeClock(offset_s=40))
    new = conversations(clock, 1, 2, seed=2)
    for o in new:
        j.record(o)
    j.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
        rows = conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
        turns = conn.execute("SELECT conversation, turn FROM requests ORDER BY id").fetchall()
    assert rows[: len(before)] == [(*row, None, None) for row in before]  # not rewritten
    assert turns[len(before) :] == [
        (o.conversation, o.turn) if o.conversation >= 0 else (None, None) for o in new
    ]


def test_the_report_breaks_latency_down_by_turn_and_by_context(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    sent = conversations(clock, 4, 5)
    for o in sent:
        j.record(o)
    j.close()
    rep = build_report(tmp_path)
    alpha = next(b for b in rep.breakdowns if b.target == "alpha" and b.phase is None)
    assert [r.key for r in alpha.by_turn] == ["0", "1", "2", "3", "4"]
    assert [r.requests for r in alpha.by_turn] == [4] * 5
    assert [r.errors for r in alpha.by_turn] == [0, 0, 0, 4, 0]
    assert [r.prompt_tokens_mean for r in alpha.by_turn] == [100, 700, 1300, 1900, 2500]
    turn3 = alpha.by_turn[3]
    assert turn3.ttft_p50_ms is None  # every turn 3 failed: no latency
    for r, want_ms in zip(alpha.by_turn[:3], (10, 70, 130), strict=True):
        assert r.ttft_p50_ms is not None
        assert abs(r.ttft_p50_ms - want_ms) <= 0.01 * want_ms  # the digests' 1 %
    # context: 100 -> 128, 700 -> 1024, 1300 and 1900 -> 2048, 2500 -> 4096
    assert [(r.key, r.requests) for r in alpha.by_context] == [
        ("128", 4),
        ("1024", 4),
        ("2048", 8),
        ("4096", 4),
    ]
    beta = next(b for b in rep.breakdowns if b.target == "beta" and b.phase is None)
    assert beta.by_turn == []  # single requests: no turn table
    assert [b.phase for b in rep.breakdowns if b.target == "alpha"] == [None, "warm"]
    # the tables the report shows
    (table,) = turn_tables(rep)
    assert table.title == "Latency by turn: alpha"
    assert [row[0].text for row in table.rows] == ["0", "1", "2", "3", "4"]
    assert [row[2].text for row in table.rows] == ["0", "0", "0", "4", "0"]
    ctx = context_table(rep)
    assert ctx is not None
    assert ctx.header[:4] == [
        "context (served prompt tokens)",
        "alpha requests",
        "alpha TTFT p50",
        "alpha TTFT p99",
    ]
    assert [row[0].text for row in ctx.rows][:2] == ["≤ 128", "≤ 256"]  # beta's 10-300
    page = render_markdown(rep)
    assert "## TTFT by context length" in page
    assert "## Latency by turn: alpha" in page
    assert "Latency by turn: beta" not in page


def test_a_run_without_conversations_has_no_turn_table(tmp_path: Path) -> None:
    cfg, clock = config(), FakeClock(offset_s=20)
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(3)
    for i in range(40):
        j.record(outcome(rng, clock, "alpha", "warm", i, 10 + i * 0.01))
    j.close()
    rep = build_report(tmp_path)
    assert turn_tables(rep) == []
    assert context_table(rep) is not None


def test_metrics_break_ttft_down_with_bounded_labels() -> None:
    clock = FakeClock(offset_s=20)
    sent = conversations(clock, 3, 20)  # turns past 15 fold into 16+
    for o in sent[:5]:
        o.prompt_tokens = 1_000_000  # past the last bound: +Inf
    m = Metrics()
    for t in ("alpha", "beta"):
        m.add_target(t, ["warm"])
    m.apply(fold(sent))
    counts = {
        key[1]: value
        for key, value in scraped(m, "soakd_turn_ttft_seconds_count").items()
        if ("target", "alpha") in key[1]
    }
    by_turn = {dict(labels)["turn"]: n for labels, n in counts.items()}
    assert set(by_turn) == set(TURN_LABELS) - {"3"}  # every turn 3 failed
    assert by_turn["16+"] == 3 * 4  # turns 16..19 of three conversations
    assert by_turn["0"] == 3
    assert not any(("target", "beta") in k[1] for k in scraped(m, "soakd_turn_ttft"))
    ctx = scraped(m, "soakd_ttft_by_context_seconds_count")
    contexts = {dict(k[1])["context"] for k in ctx}
    assert contexts <= set(CONTEXT_LABELS)
    assert "+Inf" in contexts
    ok = sum(1 for o in sent if o.ok and o.prompt_tokens)
    assert sum(ctx.values()) == ok
    # the turn histogram's buckets: a turn's TTFT is 10 ms a 100 tokens of its context
    le = scraped(m, "soakd_turn_ttft_seconds_bucket")
    turn0 = {dict(k[1])["le"]: v for k, v in le.items() if ("turn", "0") in k[1]}
    assert turn0["0.005"] == 0
    assert turn0["0.01"] == 3  # 100 tokens: 10 ms
    # as the journal's writer process sends its fold: the same counts
    sent_over = Metrics()
    for t in ("alpha", "beta"):
        sent_over.add_target(t, ["warm"])
    sent_over.apply(Fold.from_doc(json.loads(json.dumps(fold(sent).to_doc()))))
    for family in ("soakd_turn_ttft_seconds", "soakd_ttft_by_context_seconds"):
        assert scraped(sent_over, family) == scraped(m, family)
