"""The slowest requests and their trace ids, as the report and the export give them: checked
against the journal's rows ranked here independently (sorted, no digest)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.journal import JournalReader
from soakd.model import ErrorKind
from soakd.report import build_report, render_html, render_json, render_markdown
from soakd.report import slowest as slowest_mod
from soakd.report.slowest import slowest
from soakd.tracing import trace_id
from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome

HOUR = 3600.0
KINDS = [None] * 12 + [ErrorKind.HTTP_5XX, ErrorKind.TIMEOUT_TTFT, ErrorKind.CONNECT_REFUSED]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two phases; alpha is local (sends a traceparent), beta is a cloud (sends none);
    a few very slow failures among them; beta has too few requests in "hot" to estimate."""
    d = tmp_path_factory.mktemp("slow")
    cfg = config(
        targets=[
            {"name": "alpha", "base_url": "http://127.0.0.1:1"},
            {"name": "beta", "base_url": "https://api.example.com"},
        ]
    )
    clock = FakeClock(offset_s=HOUR + 1)
    j = open_test_journal(d, cfg, clock)
    rng = random.Random(16)
    seq = {"alpha": 0, "beta": 0}
    for _ in range(1500):
        target = rng.choice(("alpha", "alpha", "beta"))
        end = rng.uniform(1, HOUR - 1)
        phase = "warm" if end < 1800 else "hot"
        if target == "beta" and phase == "hot" and seq["beta"] % 5:
            continue  # a small group: every row of it is ranked
        error = rng.choice(KINDS)
        slow = 40.0 if error is ErrorKind.TIMEOUT_TTFT and rng.random() < 0.5 else 1.0
        j.record(outcome(rng, clock, target, phase, seq[target], end, slow=slow, error=error))
        seq[target] += 1
    j.close(completed=True)
    return d


def ranked_here(run_dir: Path, n: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    with JournalReader(run_dir) as r:
        rows = [dict(row) for row in r.request_rows(itl=False)]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["e2e_ns"] is not None:
            groups.setdefault((row["target"], row["phase"]), []).append(row)
    return {
        key: sorted(rows, key=lambda r: (-r["e2e_ns"], r["id"]))[:n] for key, rows in groups.items()
    }


@pytest.mark.parametrize("n", [1, 10, 40])
def test_the_slowest_are_the_slowest_rows(run_dir: Path, n: int) -> None:
    want = ranked_here(run_dir, n)
    with JournalReader(run_dir) as r:
        got = slowest(r, n)
    assert {(t, p) for t, by_phase in got.items() for p in by_phase} == set(want)
    for (target, phase), rows in want.items():
        listed = got[target][phase]
        assert [s.seq for s in listed] == [row["seq"] for row in rows]
        assert [s.e2e_s for s in listed] == [row["e2e_ns"] / 1e9 for row in rows]
        assert [s.outcome for s in listed] == [row["error"] or "ok" for row in rows]
        assert [s.wall for s in listed] == [row["wall"] for row in rows]


def test_failures_rank_with_the_rest(run_dir: Path) -> None:
    with JournalReader(run_dir) as r:
        got = slowest(r, 40)
    # the 40x slower TTFT timeouts are the slowest of their phase, successes follow
    listed = got["alpha"]["warm"]
    assert listed[0].outcome == "timeout_ttft"
    assert "ok" in {s.outcome for s in listed}


def test_a_digest_that_guesses_too_high_still_gives_the_exact_answer(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan's filter comes from the rollups' digests; when it lets fewer than N rows of a
    group through, that group is ranked again exactly."""
    monkeypatch.setattr(slowest_mod, "_MARGIN", 3.0)
    want = ranked_here(run_dir, 10)
    with JournalReader(run_dir) as r:
        got = slowest(r, 10)
    for (target, phase), rows in want.items():
        assert [s.seq for s in got[target][phase]] == [row["seq"] for row in rows]


def test_without_rollups_every_row_is_ranked(run_dir: Path) -> None:
    """Groups no rollup knows (the journal's totals name them) are ranked over all rows."""
    want = ranked_here(run_dir, 10)
    with JournalReader(run_dir) as r:
        got = slowest(r, 10, rollups=[])
    for (target, phase), rows in want.items():
        assert [s.seq for s in got[target][phase]] == [row["seq"] for row in rows]


def test_trace_ids_only_for_targets_that_sent_them(run_dir: Path) -> None:
    with JournalReader(run_dir) as r:
        run_id = r.meta["run_id"]
        got = slowest(r, 5)
    for s in got["alpha"]["warm"] + got["alpha"]["hot"]:
        assert s.trace_id == trace_id(run_id, "alpha", s.seq)
    assert all(s.trace_id is None for s in got["beta"]["warm"])


def test_the_report_lists_them(run_dir: Path) -> None:
    rep = build_report(run_dir)
    want = ranked_here(run_dir, 10)
    top = want[("alpha", "hot")][0]
    tid = trace_id(rep.run_id, "alpha", top["seq"])

    md = render_markdown(rep)
    assert "## The 10 slowest requests of alpha, per phase" in md
    line = next(x for x in md.splitlines() if tid in x)
    assert line.startswith("| hot | 1 |")
    assert f"| {top['error'] or 'ok'} |" in line
    assert "## The 10 slowest requests of beta, per phase" in md

    doc = json.loads(render_json(rep))
    listed = doc["slowest"]["alpha"]["hot"]
    assert len(listed) == 10
    assert listed[0]["trace_id"] == tid
    assert listed[0]["seq"] == top["seq"]
    assert listed[0]["phase"] == "hot"
    assert doc["slowest"]["beta"]["warm"][0]["trace_id"] is None

    assert tid in render_html(rep)
    assert build_report(run_dir, slowest_n=0).slowest == {}


def test_export_has_the_trace_id(run_dir: Path, tmp_path: Path) -> None:
    with JournalReader(run_dir) as r:
        run_id = r.meta["run_id"]
    out = tmp_path / "rows.jsonl"
    assert main(["export", str(run_dir), "--format", "jsonl", "-o", str(out)]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    for rec in recs:
        want = trace_id(run_id, "alpha", rec["seq"]) if rec["target"] == "alpha" else None
        assert rec["trace_id"] == want
    csv_out = tmp_path / "rows.csv"
    assert main(["export", str(run_dir), "--format", "csv", "-o", str(csv_out)]) == 0
    header, first, *_ = csv_out.read_text().splitlines()
    at = header.split(",").index("trace_id")
    assert header.split(",")[at + 1 :] == ["source_record"]  # synthetic prompts: empty
    assert first.split(",")[at] == (recs[0]["trace_id"] or "")
    assert first.split(",")[-1] == ""
