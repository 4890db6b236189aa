"""soakd end to end against the embedded simulator: real processes, real HTTP, real scrape,
and a real SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client import generate_latest

from soakd import __version__
from soakd.config import config_from_dict
from soakd.journal import JournalReader, records
from soakd.profiles import get_profile
from soakd.run.app import RunOptions, Soak
from soakd.sim.server import start_sim
from soakd.sim.spawn import free_port
from tests.scraping import samples, scrape, total
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PREFLIGHT = 1
"""Requests (of one token) `soakd run` sends each target before the run: not counted."""


def sim_config(**run: object) -> dict:
    return {
        "run": {"name": "it", "drain_timeout": "5s", **run},
        "targets": [
            {"name": "fast-a", "simulator": "fast", "model": "m"},
            {"name": "fast-b", "simulator": "fast", "model": "m", "api": "completions"},
        ],
        "workload": {"max_tokens": 12, "prompts": {"input_tokens": {"mean": 20}}},
        "phases": [
            {"name": "closed", "duration": "1.5s", "load": {"mode": "closed", "concurrency": 4}},
            {"name": "open", "duration": "1.5s", "load": {"mode": "poisson", "rate": 20}},
        ],
    }


async def test_two_targets_side_by_side(tmp_path: Path) -> None:
    cfg = config_from_dict(sim_config(node="edge-7", site="lab-3"))
    port = free_port()
    soak = Soak(
        cfg,
        RunOptions(run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{port}", console_logs=False),
    )
    scraped: dict[str, str] = {}

    async def scrape_during_run() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                await asyncio.sleep(0.1)
                try:
                    async with session.get(f"http://127.0.0.1:{port}/status") as resp:
                        status = await resp.json()
                    if status["phase"] == "open":
                        async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                            scraped["ready"] = str(resp.status)
                        scraped["status"] = json.dumps(status)
                        return
                except aiohttp.ClientError:
                    continue

    probe = asyncio.create_task(scrape_during_run())
    result = await soak.run()
    await probe

    assert result.completed
    assert scraped["ready"] == "200"
    status = json.loads(scraped["status"])
    assert status["run_id"] == result.run_id
    assert set(status["targets"]) == {"fast-a", "fast-b"}
    assert (status["node"], status["site"]) == ("edge-7", "lab-3")
    assert status["no_reuse"] == {}  # a keep-alive server: never taken for one that closes

    metrics = samples(generate_latest(soak.metrics.registry).decode())
    info = {lbl: v for (n, lbl), v in metrics.items() if n == "soakd_build_info"}
    assert [dict(lbl) for lbl in info] == [
        {"version": __version__, "run_id": result.run_id, "node": "edge-7", "site": "lab-3"}
    ]
    for name in ("fast-a", "fast-b"):
        summary = result.summary[name]
        assert summary["requests"] > 20
        assert summary["errors"] == 0, summary["errors_by_kind"]
        ok = total(metrics, "soakd_requests_total", target=name, outcome="ok")
        assert ok == summary["requests"]
        phases = {
            dict(lbl)["phase"]
            for (n, lbl), v in metrics.items()
            if n == "soakd_requests_total" and v and dict(lbl)["target"] == name
        }
        assert phases == {"closed", "open"}
        assert total(metrics, "soakd_request_duration_seconds_count", target=name) == ok
        assert total(metrics, "soakd_time_to_first_token_seconds_count", target=name) == ok
        assert total(metrics, "soakd_output_tokens_total", target=name) == ok * 12
        assert summary["ttft_p50_ms"] <= summary["e2e_p50_ms"]
        # the pool probed it after its first 200 and saw it keep the connection
        pool = soak.targets[name].pool  # type: ignore[attr-defined]
        assert pool.keeps_after == [200]
        assert pool.closes_after == []
    assert total(metrics, "soakd_target_no_reuse") == 0
    by_phase = {(t, p) for (t, p), s in soak.stats.by_phase.items() if s.requests}
    assert by_phase == {(t, p) for t in ("fast-a", "fast-b") for p in ("closed", "open")}

    run_dir = tmp_path / "run"
    assert (run_dir / "config.yaml").exists()
    summary_doc = json.loads((run_dir / "summary.json").read_text())
    assert summary_doc["completed"] is True
    assert (summary_doc["node"], summary_doc["site"]) == ("edge-7", "lab-3")
    assert (run_dir / "soakd.log").read_text().count("phase_started") == 2


DRAIN_S = 5.0


def long_run_config(urls: dict[str, str]) -> dict[str, Any]:
    """An hour of closed loop against simulators the test runs (so it can read their
    counters after soakd is gone): SIGTERM always comes mid-run."""
    cfg = sim_config(drain_timeout=f"{DRAIN_S:g}s")
    for target in cfg["targets"]:
        del target["simulator"]
        target["base_url"] = urls[target["name"]]
    cfg["phases"] = [
        {"name": "long", "duration": "1h", "load": {"mode": "closed", "concurrency": 3}}
    ]
    return cfg


async def test_cli_run_sigterm_mid_run_drains_and_counts_what_the_server_served(
    tmp_path: Path,
) -> None:
    """`soakd run` (a real process) against two simulators, SIGTERM mid-run: it stops
    sending, finishes what is in flight, exits 0 within drain_timeout + 2 s, and the
    summary, the journal and the servers' own counters agree request for request."""
    fast = get_profile("fast")
    sims = {name: await start_sim("127.0.0.1", 0, fast, "m") for name in ("fast-a", "fast-b")}
    proc = None
    try:
        path = tmp_path / "soak.yaml"
        path.write_text(yaml.safe_dump(long_run_config({n: s.url for n, s in sims.items()})))
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(path),
            "--no-live",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--run-dir",
            str(tmp_path / "run"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        counted: dict[str, float] = {}

        async def refresh() -> None:
            with contextlib.suppress(aiohttp.ClientError):
                text = await scrape(session, f"http://127.0.0.1:{port}/metrics")
                counted.update(
                    {n: total(samples(text), "soakd_requests_total", target=n) for n in sims}
                )

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            deadline = time.monotonic() + 60  # a bound on a hang: start-up is seconds
            while not (counted and min(counted.values()) >= 10):
                assert proc.returncode is None, "soakd exited before the signal"
                assert time.monotonic() < deadline, "soakd counted no requests in 60 s"
                await refresh()
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            out, err = await asyncio.wait_for(proc.communicate(), DRAIN_S + 30)
            stop_s = time.monotonic() - signalled
            served = {
                n: samples(await scrape(session, s.url + "/metrics")) for n, s in sims.items()
            }
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        for sim in sims.values():
            await sim.aclose()
    stdout, stderr = out.decode(), err.decode()
    print(f"\nexited {stop_s:.2f} s after SIGTERM (drain_timeout {DRAIN_S:g} s)")
    assert proc.returncode == 0, stderr[-2000:]
    # the promise of the README: stop within the drain timeout (+ exit and final flush)
    assert stop_s < DRAIN_S + 2, f"exited {stop_s:.1f} s after SIGTERM"
    assert "stopped early" in stdout
    # the verdict comes last: what stays on a small terminal once the live view is gone
    assert stdout.rstrip().splitlines()[-1].startswith("Verdict: none")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is False
    assert summary["cancelled"] == 0  # everything in flight finished within the drain
    with JournalReader(tmp_path / "run") as journal:
        rows = [(r["target"], r["error"], r["output_tokens"]) for r in journal.request_rows()]
        totals = journal.totals()
        stopped = [e.event for e in journal.events() if isinstance(e.event, records.RunStopped)]
    assert stopped == [records.RunStopped(completed=False)]
    for name in sims:
        reported = summary["targets"][name]
        assert name in stdout
        assert reported["errors"] == 0, reported["errors_by_kind"]
        mine = [r for r in rows if r[0] == name]
        assert all(error is None for _, error, _ in mine)
        finished = total(served[name], "vllm:request_success_total", finished_reason="stop") + (
            total(served[name], "vllm:request_success_total", finished_reason="length")
        )
        # one number, four sources: the server's count of what it finished, the summary,
        # the journal's rows and its totals (what the counters restart from); the server
        # also answered the preflight's one request of one token, which is not the run's
        print(f"{name}: served {finished:g}, summary {reported['requests']}, journal {len(mine)}")
        assert reported["requests"] == finished - PREFLIGHT == len(mine) >= 10
        assert sum(t[4] for t in totals if t[0] == name) == len(mine)
        assert total(served[name], "vllm:request_success_total", finished_reason="abort") == 0
        generated = total(served[name], "vllm:generation_tokens_total")
        assert generated - PREFLIGHT == sum(r[2] for r in mine)


@pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="promtool not installed (scripts/setup-prometheus.sh)",
)
def test_cli_run_exports_metrics_promtool_accepts(tmp_path: Path) -> None:
    """What `soakd run` serves on /metrics mid-run passes `promtool check metrics`."""
    cfg = sim_config()
    cfg["phases"] = [
        {"name": "long", "duration": "1h", "load": {"mode": "closed", "concurrency": 3}}
    ]
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(path),
            "--no-live",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    page: list[str] = []

    def counting() -> bool:
        url = f"http://127.0.0.1:{port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as resp:
            page[:] = [resp.read().decode()]
        return bool(page) and total(samples(page[0]), "soakd_requests_total") >= 10

    try:
        wait_until(counting, 60, "10 requests on soakd's /metrics")
        check = subprocess.run(
            ["promtool", "check", "metrics"],
            input=page[0],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_check_reports_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = sim_config()
    cfg["phases"][0]["duration"] = "72x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "soakd", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "phases[closed].duration" in proc.stderr
    assert "72x" in proc.stderr
