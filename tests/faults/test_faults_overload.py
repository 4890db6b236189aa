"""soakd pushed far past its own capacity: an open loop at rates no process can send, and
a closed loop wider than any server will take. soakd must stay alive, bounded and
responsive, stop on SIGTERM within the drain deadline, and count every planned send it
did not make (offered = sent + missed), never hide it."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import (
    figure,
    http_get,
    rss_bytes,
    start_soakd,
    wait_metrics,
    write_config,
)
from tests.observability import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DRAIN_S = 3.0
LOADS: dict[str, dict[str, Any]] = {
    "poisson-1e9": {"mode": "poisson", "rate": 1e9, "max_lateness": "200ms"},
    "constant-20k": {"mode": "constant", "rate": 20000},
    "ramp-to-1e9": {"mode": "ramp", "rate": 10, "rate_end": 1e9},
    "closed-2000": {"mode": "closed", "concurrency": 2000},
}


@pytest.mark.parametrize("name", list(LOADS))
def test_overload_stays_responsive_bounded_and_counted(tmp_path: Path, name: str) -> None:
    cfg = write_config(
        tmp_path / "soak.yaml",
        {
            # the one-process loop (workers: auto would start senders on a machine with
            # more cores: the same rules, tests/integration/test_workers.py)
            "run": {"name": "overload", "drain_timeout": f"{DRAIN_S}s", "workers": 1},
            "targets": [
                {
                    "name": "sim",
                    "simulator": "fast",
                    "max_connections": 2000,
                    "timeouts": {"connect": "2s", "ttft": "5s", "total": "10s"},
                }
            ],
            "workload": {"max_tokens": 8},
            "gpu": {"source": "none"},
            "probes": {"health_interval": "1s", "scrape_interval": "1s"},
            "phases": [{"name": "flood", "duration": "60s", "load": LOADS[name]}],
        },
    )
    port = free_port()
    proc = start_soakd(cfg, tmp_path / "run", port)
    try:
        wait_metrics(port, lambda text: "soakd_phase_index 0.0" in text, timeout=60)
        health_s, peak_rss = [], 0
        until = time.monotonic() + 6
        while time.monotonic() < until:
            t0 = time.monotonic()
            status, _ = http_get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            health_s.append(time.monotonic() - t0)
            assert status == 200
            peak_rss = max(peak_rss, rss_bytes(proc.pid))
            time.sleep(0.2)
        t_term, wall_term = time.monotonic(), time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DRAIN_S + 30)
        exit_s = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, out[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the run ended (drained, journal closed, summary written) at its run_finished line;
    # the process then prints the whole-run report from the journal
    finished = next(
        json.loads(line)
        for line in (tmp_path / "run" / "soakd.log").open()
        if '"run_finished"' in line
    )
    stop_s = datetime.fromisoformat(finished["timestamp"]).timestamp() - wall_term
    row = summary["targets"]["sim"]
    figure(f"overload.{name}.healthz_max_s", max(health_s))
    figure(f"overload.{name}.peak_rss_mb", peak_rss / 2**20)
    figure(f"overload.{name}.sigterm_to_run_end_s", stop_s)
    figure(f"overload.{name}.sigterm_to_exit_s", exit_s)
    figure(f"overload.{name}.sent", row["requests"])
    figure(f"overload.{name}.missed", row["missed_by_reason"])
    assert max(health_s) < 1.0, health_s
    assert stop_s < DRAIN_S + 2, stop_s
    assert peak_rss < 150 * 2**20, peak_rss
    assert row["requests"] > 0
    assert row["offered"] == row["requests"] + row["missed"]
    if LOADS[name]["mode"] != "closed":
        assert row["missed"] > row["requests"]  # most of the offer could not be made: said


def test_a_concurrency_no_process_can_hold_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "soak.yaml",
        {
            "targets": [{"name": "sim", "simulator": "fast", "max_connections": 28000}],
            "phases": [
                {
                    "name": "wide",
                    "duration": "10s",
                    "load": {"mode": "closed", "concurrency": 100000},
                }
            ],
        },
    )
    proc = start_soakd(cfg, tmp_path / "run", free_port())
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "concurrency" in lines[0]
    assert "28000" in lines[0]
    assert not (tmp_path / "run" / "journal.db").exists()  # nothing started, nothing to resume


def test_a_busy_exporter_address_fails_before_a_journal_exists(tmp_path: Path) -> None:
    import socket

    cfg = write_config(
        tmp_path / "soak.yaml",
        {
            "targets": [{"name": "sim", "simulator": "fast"}],
            "phases": [{"name": "p", "duration": "5s"}],
        },
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = start_soakd(cfg, tmp_path / "run", port)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert lines == [
        f"soakd: error: --metrics-addr: cannot listen on 127.0.0.1:{port}: "
        "Address already in use (another soakd running?)"
    ], err
    # nothing to "resume" next time in this directory
    assert not (tmp_path / "run" / "journal.db").exists()
