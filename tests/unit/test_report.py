"""The report from a synthetic journal: every number checked against values computed here,
independently, from the same rows (exact percentiles from sorted lists, rates, error
counts), in JSON, Markdown and HTML. The HTML in a real headless Chromium:
tests/tools/test_report_chromium.py."""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.journal import JournalReader, row_itl_ns
from soakd.model import Sample
from soakd.report import build_report, render_html, render_json, render_markdown
from soakd.report.export import export, records
from tests.journal_fixtures import (
    HOUR,
    FakeClock,
    config,
    open_test_journal,
    outcome,
    write_hour_run,
)

QS = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One hour of plan time (two 30 min phases), two targets, probe samples."""
    return write_hour_run(tmp_path_factory.mktemp("run"))


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    with JournalReader(run_dir) as r:
        out = []
        for row in r.request_rows():
            d = dict(row)
            d["gaps"] = list(row_itl_ns(row))  # compact: bucket middles, within 1 %
            out.append(d)
        return out


def exact(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[math.floor(q * (len(s) - 1))]


def expected(rows: list[dict[str, Any]], target: str, phase: str | None) -> dict[str, Any]:
    mine = [r for r in rows if r["target"] == target and (phase is None or r["phase"] == phase)]
    ok = [r for r in mine if r["error"] is None]
    lat = {
        "ttft": [r["ttft_ns"] for r in ok if r["ttft_ns"] is not None],
        "e2e": [r["e2e_ns"] for r in ok],
        "tpot": [r["tpot_ns"] for r in ok if r["tpot_ns"] is not None],
        "itl": [g for r in ok for g in r["gaps"]],
    }
    errors: dict[str, int] = {}
    for r in mine:
        if r["error"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    # as docs/slo.md says: cut by soakd is not judged, the guard's sheds are apart
    not_judged = errors.get("cancelled", 0) + errors.get("worker_lost", 0)
    shed = sum(n for k, n in errors.items() if k.startswith("shed_"))
    return {
        "requests": len(mine),
        "ok": len(ok),
        "errors": errors,
        "failed": sum(errors.values()) - not_judged - shed,
        "server": errors.get("http_5xx", 0),
        "shed": shed,
        "not_judged": not_judged,
        "output_tokens": sum(r["output_tokens"] for r in mine),
        "latency_ms": {k: {q: exact(v, x) / 1e6 for q, x in QS.items()} for k, v in lat.items()},
        "oom_responses": sum(r["oom"] for r in mine),
    }


def expected_jitter(rows: list[dict[str, Any]], target: str) -> float:
    slices: dict[int, list[int]] = {}
    for r in rows:
        if r["target"] == target and r["error"] is None:
            slices.setdefault(int(r["end_ns"] // 300e9), []).append(r["e2e_ns"])
    p99 = [exact(v, 0.99) for v in slices.values() if len(v) >= 20]
    assert len(p99) == 12
    return statistics.pstdev(p99) / statistics.fmean(p99)


def test_report_numbers_match_the_rows(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    rep = build_report(run_dir)
    assert rep.targets == ["alpha", "beta"]
    assert rep.phases == ["warm", "hot"]
    assert rep.completed
    assert rep.active_s == pytest.approx(HOUR)
    for target in rep.targets:
        for phase in (None, "warm", "hot"):
            want = expected(rows, target, phase)
            got = rep.overall[target] if phase is None else rep.by_phase[phase][target]
            active = HOUR if phase is None else HOUR / 2
            assert got.requests == want["requests"]
            assert got.ok == want["ok"]
            assert got.errors_by_kind == want["errors"]
            assert (got.errors, got.server_errors) == (want["failed"], want["server"])
            assert (got.shed, got.not_judged) == (want["shed"], want["not_judged"])
            assert got.requests == got.ok + got.errors + got.shed + got.not_judged
            judged = want["requests"] - want["shed"] - want["not_judged"]
            assert got.error_ratio == pytest.approx(want["failed"] / judged)
            assert got.server_error_ratio == pytest.approx(want["server"] / judged)
            attempted = want["requests"] - want["not_judged"]
            assert got.success_rate == pytest.approx(want["ok"] / attempted)
            assert got.rps == pytest.approx(want["ok"] / active)  # successes only
            assert got.attempt_rps == pytest.approx(want["requests"] / active)
            assert got.output_tps == pytest.approx(want["output_tokens"] / active)
            assert got.oom_responses == want["oom_responses"]
            for kind, qs in want["latency_ms"].items():
                for q, value in qs.items():
                    assert got.latency_ms[kind][q] == pytest.approx(value, rel=0.01), (
                        target,
                        phase,
                        kind,
                        q,
                    )
        assert rep.overall[target].jitter == pytest.approx(expected_jitter(rows, target), abs=0.01)


def test_report_probe_numbers(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    rep = build_report(run_dir)
    a, b = rep.overall["alpha"], rep.overall["beta"]
    assert (
        a.restarts,
        rep.by_phase["warm"]["alpha"].restarts,
        rep.by_phase["hot"]["alpha"].restarts,
    ) == (3, 1, 2)
    assert (b.oom_events, rep.by_phase["hot"]["beta"].oom_events) == (1, 1)
    assert b.restarts is None  # never sampled: not measured, not zero
    assert a.vram_peak_bytes == pytest.approx(2e9 + 5e6 * 3540 / HOUR)
    assert a.leak_bytes_per_hour == pytest.approx(5e6, rel=1e-6)
    assert b.leak_bytes_per_hour == pytest.approx(0.0, abs=1e-3)
    tokens = {t: sum(r["output_tokens"] for r in rows if r["target"] == t) for t in rep.targets}
    assert a.energy_j == pytest.approx(100.0 * 3540)
    assert a.tokens_per_joule == pytest.approx(tokens["alpha"] / (100.0 * 3540))
    assert b.energy_j == pytest.approx(1000.0 * 3540)
    assert a.cost_per_mtok == pytest.approx(2.0 * 1.0 / tokens["alpha"] * 1e6)  # 2/h, 1 h
    kwh = 1000.0 * 3540 / 3.6e6
    assert b.cost_per_mtok == pytest.approx(0.5 * kwh / tokens["beta"] * 1e6)  # 0.5/kWh
    assert {g.gpu: g.targets for g in rep.gpus} == {"0": ["alpha"], "1": ["beta"]}
    # the better value is marked: alpha is faster (beta runs 1.3x..1.8x slower)
    assert rep.best["e2e.p99"] == ["alpha"]
    assert rep.best["leak_bytes_per_hour"] == ["beta"]
    assert "requests" not in rep.best


def _num(text: str) -> float:
    """'1,234', '12.5 ms', '1.20 s', '98.50 %', '$0.142 (2/h)' -> a number in base units
    of the column (ms for latencies, a ratio for percentages)."""
    t = text.replace("✓", "").replace("*", "").strip()
    m = re.match(r"\$?(-?[\d,]+(?:\.\d+)?)\s*(ms|s|%)?", t)
    assert m, text
    v = float(m.group(1).replace(",", ""))
    return {"s": v * 1000, "%": v / 100}.get(m.group(2) or "", v)


def _check_table(cells: dict[str, list[str]], rows: list[dict[str, Any]]) -> None:
    for i, target in enumerate(("alpha", "beta")):
        want = expected(rows, target, None)
        assert _num(cells["sent"][i]) == want["requests"]
        # no open-loop instant went unsent in this journal: offered = sent
        assert _num(cells["offered"][i]) == want["requests"]
        assert _num(cells["sends not made"][i]) == 0
        # one basis (docs/slo.md): errors are the error ratio's numerator, sheds and
        # soakd's own cuts apart, and every request is in exactly one of the four
        judged = want["requests"] - want["shed"] - want["not_judged"]
        assert _num(cells["errors"][i]) == want["failed"]
        assert _num(cells["error ratio"][i]) == pytest.approx(want["failed"] / judged, rel=0.005)
        assert _num(cells["of which 5xx"][i]) == want["server"]
        assert _num(cells["5xx ratio"][i]) == pytest.approx(want["server"] / judged, rel=0.005)
        assert _num(cells["shed by the guard"][i]) == want["shed"]
        assert _num(cells["cut by soakd (not judged)"][i]) == want["not_judged"]
        assert min(want["failed"], want["shed"], want["not_judged"]) > 0  # each one here
        assert _num(cells["success rate"][i]) == pytest.approx(
            want["ok"] / (want["requests"] - want["not_judged"]), abs=0.0001
        )
        for title, (kind, q) in (
            ("E2E p99", ("e2e", "p99")),
            ("TTFT p50", ("ttft", "p50")),
            ("ITL p95", ("itl", "p95")),
            ("TPOT p99", ("tpot", "p99")),
        ):
            assert _num(cells[title][i]) == pytest.approx(want["latency_ms"][kind][q], rel=0.016), (
                title,
                target,
            )
        assert _num(cells["throughput (ok req/s)"][i]) == pytest.approx(
            want["ok"] / HOUR, rel=0.005
        )
        assert _num(cells["attempts (req/s)"][i]) == pytest.approx(
            want["requests"] / HOUR, rel=0.005
        )


def test_markdown_carries_the_same_numbers(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    md = render_markdown(build_report(run_dir))
    side = md.split("## Targets side by side")[1].split("##")[0]
    cells = {}
    for line in side.strip().splitlines()[2:]:
        parts = [p.strip() for p in line.strip("|").split("|")]
        cells[parts[0]] = parts[1:]
    _check_table(cells, rows)
    assert "**" in cells["E2E p99"][0]  # alpha's better p99 is marked
    errors = md.split("## Errors by kind")[1].split("##")[0]
    for kind in ("http_5xx", "http_429", "timeout_ttft", "stream_truncated"):
        line = next(x for x in errors.splitlines() if x.startswith(f"| {kind} |"))
        got = [int(v) for v in line.strip("|").split("|")[1:]]
        assert got == [expected(rows, t, None)["errors"].get(kind, 0) for t in ("alpha", "beta")]
    assert "## Phase warm" in md
    assert "## Phase hot" in md


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self.svgs = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self.svgs += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_html_carries_the_same_numbers_and_is_self_contained(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    page = render_html(build_report(run_dir))
    parser = _Tables()
    parser.feed(page)
    side = next(t for t in parser.tables if t[0] == ["metric", "alpha", "beta"])
    _check_table({r[0]: r[1:] for r in side[1:]}, rows)
    assert parser.svgs == 6  # latency, TTFT/ITL, throughput, errors, VRAM; TTFT by context
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched
    assert "<script" not in page


def test_json_carries_the_same_numbers(run_dir: Path) -> None:
    rows = rows_of(run_dir)
    doc = json.loads(render_json(build_report(run_dir)))
    for target in ("alpha", "beta"):
        want = expected(rows, target, None)
        got = doc["overall"][target]
        assert got["requests"] == want["requests"]
        assert got["errors_by_kind"] == want["errors"]
        assert got["latency_ms"]["e2e"]["p99"] == pytest.approx(
            want["latency_ms"]["e2e"]["p99"], rel=0.01
        )
        phase = doc["by_phase"]["hot"][target]
        assert phase["requests"] == expected(rows, target, "hot")["requests"]
    assert doc["best"]["e2e.p99"] == ["alpha"]
    assert {c["key"] for c in doc["columns"]} >= {"e2e.p99", "jitter", "cost_per_mtok"}


def test_cli_report_and_export(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = rows_of(run_dir)
    sent = {t: expected(rows, t, None)["requests"] for t in ("alpha", "beta")}
    # every format says what the journal holds: each target's requests sent, in its row
    sent_row = {
        "md": f"| sent | {sent['alpha']} | {sent['beta']} |",
        "html": f"sent</td><td>{sent['alpha']}</td><td>{sent['beta']}</td>",
    }
    for fmt, row in sent_row.items():
        out = tmp_path / f"report.{fmt}"
        assert main(["report", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
        assert row in out.read_text()
    out = tmp_path / "report.json"
    assert main(["report", str(run_dir), "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {t: doc["overall"][t]["requests"] for t in sent} == sent
    assert main(["report", str(run_dir), "--format", "text"]) == 0
    text = capsys.readouterr().out
    sent_line = next(line for line in text.splitlines() if " sent " in line)
    assert [w for w in sent_line.split() if w.isdigit()] == [str(n) for n in sent.values()]
    assert "E2E p99" in text

    csv_out = tmp_path / "rows.csv"
    assert main(["export", str(run_dir), "--format", "csv", "-o", str(csv_out), "--itl"]) == 0
    lines = csv_out.read_text().splitlines()
    assert len(lines) == len(rows) + 1
    assert lines[0].startswith("id,session,wall,target,phase,seq,")
    assert lines[0].endswith(",trace_id,source_record,itl_us,itl_sorted_us")
    # compact gaps (the default) have no order: the export says what it gives instead
    assert "itl_sorted_us: this run kept each request's ITL gaps as 2 % buckets" in (
        capsys.readouterr().err
    )
    assert main(["export", str(run_dir), "--format", "jsonl"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(recs) == len(rows)
    assert recs[0]["e2e_s"] == pytest.approx(rows[0]["e2e_ns"] / 1e9)
    assert isinstance(recs[0]["oom"], bool)


def test_export_streams(run_dir: Path) -> None:
    """records() is a generator over a cursor: the first row comes before the last is read."""
    with JournalReader(run_dir) as r:
        it = records(r)
        first = next(it)
        assert first["id"] == 1
        assert sum(1 for _ in it) == len(rows_of(run_dir)) - 1

    class Sink:
        def __init__(self) -> None:
            self.n = 0

        def write(self, s: str) -> int:
            self.n += 1
            return len(s)

    sink = Sink()
    assert export(run_dir, "jsonl", sink) == len(rows_of(run_dir))  # type: ignore[arg-type]


def test_a_report_without_probes_says_so(tmp_path: Path) -> None:
    clock = FakeClock(offset_s=10)
    j = open_test_journal(tmp_path, config(), clock)
    rng = random.Random(1)
    for i in range(30):
        j.record(outcome(rng, clock, "alpha", "warm", i, 1 + i * 0.1))
    j.close()
    rep = build_report(tmp_path)
    assert rep.overall["beta"].requests == 0
    assert rep.overall["alpha"].restarts is None
    assert rep.overall["alpha"].tokens_per_joule is None
    assert any("no probe samples" in n for n in rep.notes)
    assert rep.overall["alpha"].jitter is None  # 30 requests: too few for a P99 per slice
    md = render_markdown(rep)
    assert "| restarts | - | - |" in md


@pytest.mark.parametrize("command", ["check", "report", "export"])
def test_a_reader_that_hung_up_is_not_an_error(run_dir: Path, command: str) -> None:
    """``soakd check ... | head -3``: the reader closed the pipe; soakd stops quietly, 0."""
    args = {
        "check": [str(p) for p in sorted((ROOT / "examples").glob("*.yaml"))],
        "report": [str(run_dir), "--format", "md"],
        "export": [str(run_dir), "--format", "jsonl"],
    }[command]
    read, write = os.pipe()
    os.close(read)  # gone before soakd writes a byte: every write is a broken pipe
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "soakd", command, *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Broken pipe" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_short_rehearsal_has_no_leak_finding_and_a_dcgm_page_has_an_owner(
    tmp_path: Path,
) -> None:
    """A 10-minute rehearsal whose VRAM jumps at a load step: no slope is a finding there
    ("too short to tell"), and the GPU read from a simulator's own DCGM page is that
    simulator's (its VRAM peak on its row)."""
    cfg = config(
        targets=[
            {"name": "edge", "simulator": "edge-4gb"},
            {"name": "cloud", "base_url": "http://127.0.0.1:2"},
        ],
        gpu={"source": "dcgm"},
    )
    clock = FakeClock(offset_s=600)
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    j = open_test_journal(tmp_path, cfg, clock)
    for t in range(0, 600, 5):
        used = 3.0e9 if t < 300 else 3.9e9  # a load step, not a leak
        j.sample(Sample(base_wall + t, "soakd_gpu_memory_used_bytes", used, (("gpu", "0"),)))
    j.close()
    rep = build_report(tmp_path)
    assert rep.overall["edge"].vram_peak_bytes == 3.9e9
    assert rep.overall["cloud"].vram_peak_bytes is None
    assert rep.gpus[0].targets == ["edge"]
    assert rep.gpus[0].leak_bytes_per_hour is None
    assert rep.overall["edge"].leak_note == "too short to tell"
    assert "too short to tell" in render_markdown(rep)


def test_each_phase_shows_its_own_vram_peak(tmp_path: Path) -> None:
    """A staged plan is run to compare its stages' memory: each phase's table shows the
    peak read within that phase (the readings placed in phases by plan time, as the
    counters are), by the run-wide rule of whose VRAM it is: alpha's process memory; beta's
    own GPU (cost.gpus). alpha peaks in warm, beta in hot; the run's peak is the higher."""
    cfg = config(
        targets=[
            {"name": "alpha", "base_url": "http://127.0.0.1:1"},
            {"name": "beta", "base_url": "http://127.0.0.1:2", "cost": {"gpus": ["1"]}},
        ],
        slo={"vram_peak": "3.5GB"},
    )
    clock = FakeClock(offset_s=HOUR + 1)
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    j = open_test_journal(tmp_path, cfg, clock)
    rng = random.Random(5)
    for i, end in enumerate((600.0, 1200.0, 2400.0, 3000.0)):
        for target in ("alpha", "beta"):
            j.record(outcome(rng, clock, target, "warm" if end < 1800 else "hot", i, end))
    for t in range(0, 3600, 30):
        warm = t < 1800
        alpha = (3.2e9 if t == 600 else 2.0e9) if warm else 2.5e9  # a spike in warm
        beta = 1.0e9 if warm else 3.9e9  # a step up in hot
        j.sample(
            Sample(
                base_wall + t + 0.5,
                "soakd_gpu_process_memory_bytes",
                alpha,
                (("gpu", "0"), ("target", "alpha")),
            )
        )
        j.sample(Sample(base_wall + t + 0.5, "soakd_gpu_memory_used_bytes", beta, (("gpu", "1"),)))
    j.close(completed=True)

    rep = build_report(tmp_path)
    peaks = {p: {t: rep.by_phase[p][t].vram_peak_bytes for t in rep.targets} for p in rep.phases}
    assert peaks == {
        "warm": {"alpha": 3.2e9, "beta": 1.0e9},
        "hot": {"alpha": 2.5e9, "beta": 3.9e9},
    }
    assert {t: rep.overall[t].vram_peak_bytes for t in rep.targets} == {
        "alpha": 3.2e9,
        "beta": 3.9e9,
    }
    # judged per phase too: beta's VRAM passes in warm and fails in hot
    judged = {p: rep.phase_verdicts[p]["beta"].passed for p in rep.phases}
    assert judged == {"warm": True, "hot": False}

    md = render_markdown(rep)
    warm_md, hot_md = md.split("## Phase warm")[1], md.split("## Phase hot")[1]
    assert "| VRAM peak | 3.20 GB | 1.00 GB |" in warm_md.split("## Phase hot")[0]
    assert "| VRAM peak | 2.50 GB | 3.90 GB |" in hot_md

    parser = _Tables()
    parser.feed(render_html(rep))
    # the side-by-side table (the lower peak marked better), then one per phase
    vram_rows = [r for t in parser.tables for r in t if r and r[0] == "VRAM peak"]
    assert vram_rows == [
        ["VRAM peak", "3.20 GB ✓", "3.90 GB"],
        ["VRAM peak", "3.20 GB", "1.00 GB"],
        ["VRAM peak", "2.50 GB", "3.90 GB"],
    ]

    doc = json.loads(render_json(rep))
    assert doc["by_phase"]["warm"]["alpha"]["vram_peak_bytes"] == 3.2e9
    assert doc["by_phase"]["hot"]["beta"]["vram_peak_bytes"] == 3.9e9
