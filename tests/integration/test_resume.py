"""Crash and resume, for real: `python -m soakd run` against the embedded simulator, SIGKILL
mid-run, the journal checked against what /metrics said before the kill, then the same
command again: same run, the plan clock and the counters continue, the downtime is on
record, and once the plan has run to its end the run dir refuses another start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from soakd.sim.spawn import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAN_S = 14.0


def soak_config(max_tokens: int = 12) -> dict[str, Any]:
    return {
        "run": {"name": "crash", "drain_timeout": "5s"},
        "targets": [
            {"name": "fast-a", "simulator": "fast", "model": "m"},
            {"name": "fast-b", "simulator": "fast", "model": "m", "api": "completions"},
        ],
        "workload": {"max_tokens": max_tokens, "prompts": {"input_tokens": {"mean": 20}}},
        "gpu": {"source": "none"},
        "phases": [
            {"name": "closed", "duration": "10s", "load": {"mode": "closed", "concurrency": 3}},
            {"name": "open", "duration": "4s", "load": {"mode": "poisson", "rate": 20}},
        ],
    }


def start(cfg: Path, run_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(cfg),
            "--no-live",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return str(resp.read().decode())


def counters(text: str, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[(s.labels["target"], s.labels["phase"], s.labels["outcome"])] = s.value
    return out


def value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} not exported")


def wait_until(port: int, pred: Any, timeout: float = 90.0) -> tuple[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            text, status = get(port, "/metrics"), json.loads(get(port, "/status"))
        except OSError:
            continue
        if pred(text, status):
            return text, status
    raise AssertionError("soakd did not get there in time")


def children(pid: int) -> list[int]:
    """The simulators soakd started (a SIGKILL leaves them running: we end them)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


CONTINUED = (
    "soakd_requests_total",
    "soakd_output_tokens_total",
    "soakd_prompt_tokens_total",
    "soakd_request_duration_seconds_count",
    "soakd_run_resumes_total",
)


class Scraper(threading.Thread):
    """Scrapes /metrics as fast as it answers, from before soakd listens until ``stop``:
    each scrape's sum of every CONTINUED family it found (absent: not in that scrape)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.scrapes = port, list[dict[str, float]]()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                text = get(self.port, "/metrics")
            except OSError:
                time.sleep(0.005)
                continue
            sums: dict[str, float] = {}
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name in CONTINUED:
                        sums[s.name] = sums.get(s.name, 0.0) + s.value
            self.scrapes.append(sums)

    def stop(self) -> list[dict[str, float]]:
        self.done.set()
        self.join(timeout=10)
        return self.scrapes


def journal(run_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)


def test_sigkill_then_resume_continues_the_run(tmp_path: Path) -> None:
    cfg_path = tmp_path / "soak.yaml"
    cfg_path.write_text(yaml.safe_dump(soak_config()))
    run_dir = tmp_path / "run"

    # --- first session: killed mid-plan --------------------------------------------------
    port = free_port()
    proc = start(cfg_path, run_dir, port)
    sims: list[int] = []
    try:
        text, status = wait_until(
            port, lambda t, s: sum(counters(t, "soakd_requests_total").values()) >= 60
        )
        run_id = status["run_id"]
        checkpoint = counters(text, "soakd_requests_total")
        checkpoint_elapsed = status["elapsed_s"]
        time.sleep(1.2)  # everything counted at the checkpoint is > 1 s old at the kill
        sims = children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        killed_at = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in sims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    assert proc.returncode == -signal.SIGKILL

    with journal(run_dir) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = {
            (t, p, o or "ok"): n
            for t, p, o, n in conn.execute(
                "SELECT target, phase, error, COUNT(*) FROM requests GROUP BY 1, 2, 3"
            )
        }
        offset_at_kill = conn.execute("SELECT MAX(offset_ns) FROM progress").fetchone()[0] / 1e9
        seq_at_kill = dict(conn.execute("SELECT target, MAX(seq) FROM requests GROUP BY 1"))
        assert (
            conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'run_stopped'").fetchone()[0]
            == 0
        )  # it never got to say goodbye
    for key, n in checkpoint.items():  # every request /metrics had counted is in the journal
        assert rows.get(key, 0) >= n, (key, rows.get(key, 0), n)
    assert checkpoint_elapsed <= offset_at_kill < PLAN_S
    rows_at_kill = sum(rows.values())
    ok_at_kill = sum(n for (_, _, o), n in rows.items() if o == "ok")

    # --- a changed config is refused, not silently mixed into the run ---------------------
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(soak_config(max_tokens=20)))
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(changed),
            "--no-live",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "config differs" in refused.stderr
    assert "workload.max_tokens" in refused.stderr
    assert "--force" in refused.stderr

    # --- second session: the same command resumes -------------------------------------------
    port = free_port()
    scraper = Scraper(port)
    scraper.start()  # from before it listens: its very first answers are scraped too
    proc = start(cfg_path, run_dir, port)
    try:
        text, status = wait_until(port, lambda t, s: s.get("elapsed_s", 0) > offset_at_kill + 0.5)
        scrapes = scraper.stop()
        # the counters never go back: no scrape of the new session shows one below the
        # journal's totals at the kill (a 0 first, then the totals, is a reset to Prometheus)
        assert len(scrapes) > 10
        for name in CONTINUED:
            seen = [s[name] for s in scrapes if name in s]
            assert seen, name
            assert seen == sorted(seen), (name, seen[:5])
        assert min(s["soakd_requests_total"] for s in scrapes if CONTINUED[0] in s) >= rows_at_kill
        assert min(s["soakd_run_resumes_total"] for s in scrapes if CONTINUED[4] in s) == 1
        assert status["run_id"] == run_id
        resumed_total = sum(counters(text, "soakd_requests_total").values())
        assert resumed_total >= rows_at_kill  # counters continued, not restarted at 0
        # and the latency histograms (restored through a collector, soakd/measure/buckets.py)
        e2e_count = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "soakd_request_duration_seconds_count"
        )
        assert e2e_count >= ok_at_kill > 0
        assert value(text, "soakd_run_resumes_total") == 1
        assert value(text, "soakd_run_downtime_seconds_total") >= time.time() - killed_at - 30
        assert value(text, "soakd_run_downtime_seconds_total") > 0.5
        assert value(text, "soakd_run_elapsed_seconds") >= offset_at_kill
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert f"soakd run {run_id} completed" in out
    assert "(session 2, resumed)" in out
    assert "fast-a" in out
    assert "fast-b" in out

    with journal(run_dir) as conn:
        sessions = conn.execute(
            "SELECT session, started_offset_ns, offset_ns FROM progress ORDER BY session"
        ).fetchall()
        assert [s[0] for s in sessions] == [1, 2]
        assert sessions[1][1] / 1e9 == pytest.approx(offset_at_kill)  # the clock went on
        assert sessions[1][2] / 1e9 >= PLAN_S  # and ran the rest of the plan
        for target, top in seq_at_kill.items():  # prompt numbers continue too
            first = conn.execute(
                "SELECT MIN(seq) FROM requests WHERE session = 2 AND target = ?", (target,)
            ).fetchone()[0]
            assert first > top
        downtime = [
            json.loads(d)
            for (d,) in conn.execute("SELECT data FROM events WHERE kind = 'downtime'")
        ]
        assert len(downtime) == 1
        assert downtime[0]["seconds"] > 0.5
        total = conn.execute("SELECT SUM(requests) FROM totals").fetchone()[0]
        assert total == conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        phases = {p for (p,) in conn.execute("SELECT DISTINCT phase FROM requests")}
        assert phases == {"closed", "open"}

    # --- finished: not restarted by accident ----------------------------------------------
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(cfg_path),
            "--no-live",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 2
    assert "has finished" in again.stderr
    report = subprocess.run(
        [sys.executable, "-m", "soakd", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "in 2 session(s)" in report
    assert "Downtime" in report


def test_commits_a_damaged_wal_lost_are_counted_and_the_resume_says_so(tmp_path: Path) -> None:
    """SIGKILL mid-run (the journal's commits in its WAL), a byte of a WAL frame in the
    middle flipped: SQLite drops that commit and every later one. Before, the resume went
    on from the older heartbeat, reused the lost prompt numbers, and nothing said so."""
    cfg_path = tmp_path / "soak.yaml"
    cfg_path.write_text(yaml.safe_dump(soak_config()))
    run_dir = tmp_path / "run"
    port = free_port()
    proc = start(cfg_path, run_dir, port)
    sims: list[int] = []
    try:
        wait_until(port, lambda t, s: sum(counters(t, "soakd_requests_total").values()) >= 150)
        time.sleep(0.6)  # a commit or two more
        sims = children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in sims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    mark = json.loads((run_dir / "journal.mark").read_text())
    wal = run_dir / "journal.db-wal"
    data = bytearray(wal.read_bytes())
    page = 16384
    frames = (len(data) - 32) // (24 + page)
    assert frames > 4, "the commits should still be in the WAL"
    data[32 + frames // 2 * (24 + page) + 24 + 100] ^= 0xFF
    wal.write_bytes(data)
    with journal(run_dir) as conn:
        held = conn.execute("SELECT MAX(id) FROM requests").fetchone()[0] or 0
    assert held < mark["last_id"]  # commits after the flipped frame: gone

    port = free_port()
    proc = start(cfg_path, run_dir, port)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    lost = mark["last_id"] - held
    said = f"the journal lost {lost:,} request row(s)"
    assert f"soakd: warning: {said}" in err  # before the run went on
    summary = out.splitlines()
    assert summary[1].startswith(f"WARNING: {said}")  # the summary's first line after the run's
    with journal(run_dir) as conn:
        loss = conn.execute("SELECT data FROM events WHERE kind = 'journal_loss'").fetchone()
        assert json.loads(loss[0])["rows"] == lost
        for target, next_seq in mark["seqs"].items():  # no prompt number used twice
            first = conn.execute(
                "SELECT MIN(seq) FROM requests WHERE session = 2 AND target = ?", (target,)
            ).fetchone()[0]
            assert first >= next_seq
