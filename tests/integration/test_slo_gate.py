"""The release gate end to end: two embedded simulators soaked for real, then
``soakd report DIR --check`` as CI would run it (a separate process, the exit code)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from soakd.sim.spawn import free_port

pytestmark = pytest.mark.integration

TIGHT_TTFT = "0.05ms"  # 50 us: no request over HTTP gets its first token that fast


def gate_config(candidate_slo: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": {"name": "gate", "drain_timeout": "5s"},
        "targets": [
            {"name": "fast-a", "simulator": "fast", "model": "m"},
            {"name": "fast-b", "simulator": "fast", "model": "m", "slo": candidate_slo},
        ],
        "workload": {"max_tokens": 8, "prompts": {"input_tokens": {"mean": 20}}},
        "phases": [
            {"name": "closed", "duration": "1.5s", "load": {"mode": "closed", "concurrency": 4}},
            {"name": "open", "duration": "1.5s", "load": {"mode": "poisson", "rate": 20}},
        ],
        "slo": {"ttft_p99": "30s", "e2e_p99": "60s", "error_ratio": 0.01, "oom_events": 0},
        "gpu": {"source": "none"},
    }


@pytest.fixture(scope="module")
def tight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Soak]:
    """One soak of two simulators; fast-b's own ttft_p99 is one no request can meet."""
    run_dir = tmp_path_factory.mktemp("gate") / "run"
    addr = f"127.0.0.1:{free_port()}"
    raw = gate_config({"ttft_p99": TIGHT_TTFT})
    soak = Soak(
        config_from_dict(raw), RunOptions(run_dir=run_dir, metrics_addr=addr, console_logs=False)
    )
    result = asyncio.run(soak.run())
    assert result.completed
    return run_dir, soak


def test_goodput_and_limits_on_metrics(tight_run: tuple[Path, Soak]) -> None:
    """/metrics over the last minute (first test: right after the run), with each target's
    own SLO; the limit gauges carry the run-wide values (fast-b's override judges it, it
    does not move the alerts)."""
    _, soak = tight_run
    get = soak.metrics.registry.get_sample_value
    assert get("soakd_goodput_ratio", {"target": "fast-a"}) == 1.0
    assert get("soakd_goodput_ratio", {"target": "fast-b"}) == 0.0
    assert get("soakd_goodput_rps", {"target": "fast-a"}) > 0
    assert get("soakd_goodput_rps", {"target": "fast-b"}) == 0.0
    assert get("soakd_slo_ttft_p99_seconds") == 30.0
    assert get("soakd_error_ratio_limit") == 0.01
    assert get("soakd_vram_limit_bytes") is None  # slo.vram_peak not set: no gauge
    status = soak.status().targets
    assert status["fast-a"]["goodput"] == 1.0
    assert status["fast-b"]["goodput"] == 0.0


def check(run_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["report", str(run_dir), "--check", "--format", "json", "-o", str(out), *extra]
    return subprocess.run(
        [sys.executable, "-m", "soakd", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_target_over_its_ttft_slo_fails_the_gate(
    tight_run: tuple[Path, Soak], tmp_path: Path
) -> None:
    proc = check(tight_run[0], tmp_path / "report.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["passed"] is False
    assert doc["verdicts"]["fast-a"]["passed"] is True
    failing = doc["verdicts"]["fast-b"]
    assert failing["passed"] is False
    [ttft] = [c for c in failing["criteria"] if c["passed"] is False]
    assert ttft["name"] == "ttft_p99"
    assert ttft["limit"] == pytest.approx(50e-6)
    # the measured value is the report's own TTFT p99 of that target, in seconds
    p99_ms = doc["overall"]["fast-b"]["latency_ms"]["ttft"]["p99"]
    assert ttft["measured"] == pytest.approx(p99_ms / 1000)
    assert ttft["measured"] > 50e-6
    # every request of the tight target succeeded, none within its TTFT SLO: goodput 0
    assert doc["overall"]["fast-b"]["errors"] == 0
    assert doc["overall"]["fast-b"]["goodput"] == 0
    assert doc["overall"]["fast-a"]["goodput"] == 1
    # the verdict, as CI reads it, names the target and the criterion
    assert "fast-b: FAIL" in proc.stdout
    assert "ttft_p99" in proc.stdout
    # per phase too
    for phase in ("closed", "open"):
        assert doc["phase_verdicts"][phase]["fast-b"]["passed"] is False
        assert doc["phase_verdicts"][phase]["fast-a"]["passed"] is True


def test_the_same_run_with_loose_slos_passes_the_gate(
    tight_run: tuple[Path, Soak], tmp_path: Path
) -> None:
    loose = tmp_path / "loose.yaml"
    loose.write_text(yaml.safe_dump(gate_config({"ttft_p99": "20s"})))
    proc = check(tight_run[0], tmp_path / "report.json", "--config", str(loose))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["passed"] is True
    for target in ("fast-a", "fast-b"):
        verdict = doc["verdicts"][target]
        assert verdict["passed"] is True
        assert {c["name"] for c in verdict["criteria"]} == {
            "ttft_p99",
            "e2e_p99",
            "error_ratio",
            "oom_events",
        }
        assert doc["overall"][target]["goodput"] == 1
    assert "Verdict: PASS" in proc.stdout
