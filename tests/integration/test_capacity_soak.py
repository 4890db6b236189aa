"""Capacity over days: ``mode: sweep`` phases inside a soak re-measure the knee with the
run's own clients, bounded by their phase; their requests are in no journal row or verdict,
and the report lists each sweep and the drift between the first and the last."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from soakd.capacity.phases import phase_hook
from soakd.config import config_from_dict
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak
from soakd.sim.spawn import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SWEEP_S = 22


def test_sweep_phases_measure_the_knee_and_stay_out_of_the_soak(tmp_path: Path) -> None:
    sweep = {"mode": "sweep"}
    raw = {
        "run": {"name": "days", "drain_timeout": "5s"},
        "targets": [{"name": "sim", "simulator": "cap-32", "model": "m"}],
        "workload": {"max_tokens": 32, "prompts": {"input_tokens": {"mean": 16}}},
        "phases": [
            {"name": "knee-0", "duration": f"{SWEEP_S}s", "load": sweep},
            {"name": "soak", "duration": "3s", "load": {"mode": "constant", "rate": 5}},
            {"name": "knee-1", "duration": f"{SWEEP_S}s", "load": sweep},
        ],
        "slo": {"e2e_p99": "30s", "error_ratio": 0.01},
        "capacity": {
            "by": "rate",
            "start": 16,
            "min_step": "2s",
            "max_step": "3s",
            "min_requests": 20,
        },
        "gpu": {"source": "none"},
    }
    cfg = config_from_dict(raw)
    run_dir = tmp_path / "run"
    opts = RunOptions(
        run_dir=run_dir,
        metrics_addr=f"127.0.0.1:{free_port()}",
        console_logs=False,
        on_sweep=phase_hook(cfg),
    )
    result = asyncio.run(Soak(cfg, opts).run())
    assert result.completed
    knees = []
    for index in (0, 2):
        doc = json.loads((run_dir / f"capacity-{index:04d}.json").read_text())
        knee = doc["targets"]["sim"]
        assert knee["knee"] is not None
        assert doc["seconds"] <= SWEEP_S  # bounded by its phase
        knees.append(knee["knee"])
    # the journal holds the soak phase's requests only
    with sqlite3.connect(run_dir / "journal.db") as conn:
        phases = dict(conn.execute("SELECT phase, COUNT(*) FROM requests GROUP BY phase"))
    assert set(phases) == {"soak"}
    rep = build_report(run_dir)
    notes = "\n".join(rep.notes)
    assert "capacity sweep (phase knee-0, its requests in no other figure), hour 0:" in notes
    moved = "fell" if knees[1] < knees[0] else "rose" if knees[1] > knees[0] else "stayed"
    assert f"the knee of sim {moved} from {knees[0]:.4g} to {knees[1]:.4g} req/s" in notes
    assert rep.overall["sim"].requests == phases["soak"]
