"""soakd end to end against the embedded simulator: real processes, real HTTP, real scrape."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.app import RunOptions, Soak
from soakd.config import config_from_dict
from soakd.sim.spawn import free_port

pytestmark = pytest.mark.integration


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


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lbl), v in metrics.items()
               if n == name and all(dict(lbl).get(k) == x for k, x in labels.items()))


async def test_two_targets_side_by_side(tmp_path: Path) -> None:
    cfg = config_from_dict(sim_config())
    port = free_port()
    soak = Soak(cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{port}",
                                console_logs=False))
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

    metrics = samples(generate_latest(soak.metrics.registry).decode())
    for name in ("fast-a", "fast-b"):
        summary = result.summary[name]
        assert summary["requests"] > 20
        assert summary["errors"] == 0, summary["errors_by_kind"]
        ok = total(metrics, "soakd_requests_total", target=name, outcome="ok")
        assert ok == summary["requests"]
        phases = {dict(lbl)["phase"] for (n, lbl), v in metrics.items()
                  if n == "soakd_requests_total" and v and dict(lbl)["target"] == name}
        assert phases == {"closed", "open"}
        assert total(metrics, "soakd_request_duration_seconds_count", target=name) == ok
        assert total(metrics, "soakd_time_to_first_token_seconds_count", target=name) == ok
        assert total(metrics, "soakd_output_tokens_total", target=name) == ok * 12
        assert summary["ttft_p50_ms"] <= summary["e2e_p50_ms"]
    by_phase = {(t, p) for (t, p), s in soak.stats.by_phase.items() if s.requests}
    assert by_phase == {(t, p) for t in ("fast-a", "fast-b") for p in ("closed", "open")}

    run_dir = tmp_path / "run"
    assert (run_dir / "config.yaml").exists()
    assert json.loads((run_dir / "summary.json").read_text())["completed"] is True
    assert (run_dir / "soakd.log").read_text().count("phase_started") == 2


@pytest.mark.skipif(shutil.which("promtool") is None and not os.environ.get("CI"),
                    reason="promtool not installed (scripts/setup-prometheus.sh)")
def test_cli_run_sigterm_drains_and_exports_clean_metrics(tmp_path: Path) -> None:
    cfg = sim_config()
    cfg["phases"] = [{"name": "long", "duration": "1h",
                      "load": {"mode": "closed", "concurrency": 3}}]
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "soakd", "run", str(path), "--no-live",
         "--metrics-addr", f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = resp.read().decode()
                if total(samples(text), "soakd_requests_total") >= 10:
                    break
            except OSError:
                continue
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped early" in out
    assert "fast-a" in out
    assert "fast-b" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] is False
    assert summary["cancelled"] == 0
    assert all(t["errors"] == 0 for t in summary["targets"].values())
    assert all(t["requests"] >= 5 for t in summary["targets"].values())


def test_check_reports_bad_config_in_one_line(tmp_path: Path) -> None:
    cfg = sim_config()
    cfg["phases"][0]["duration"] = "72x"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "soakd", "check", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "phases[closed].duration" in proc.stderr
    assert "72x" in proc.stderr
