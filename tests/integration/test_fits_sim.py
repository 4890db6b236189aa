"""A plan longer than a server's context, told by the server itself: `soakd run` reads the
simulator's models list (its ``max_model_len``, as vLLM's says) at the preflight and stops
with one line, exit 2, before the journal opens; the same plan within the context runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def run(tmp_path: Path, top: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    doc = {
        "run": {"name": "fits", "drain_timeout": "2s"},
        "targets": [{"name": "edge", "simulator": "edge-4gb"}],  # max_model_len 2048
        "workload": {
            "max_tokens": 48,
            "calibrate": "off",
            "prompts": {"input_tokens": {"dist": "uniform", "min": 16, "max": top}},
        },
        "phases": [{"name": "p", "duration": "2s", "load": {"mode": "closed", "concurrency": 1}}],
    }
    cfg = tmp_path / f"fits-{top}.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / f"run-{top}"
    done = subprocess.run(
        [sys.executable, "-m", "soakd", "run", str(cfg), "--run-dir", str(run_dir), "--no-live"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SOAKD_LOG_LEVEL": "warning"},
        check=False,
    )
    return done, run_dir


def test_the_servers_context_stops_a_plan_longer_than_it(tmp_path: Path) -> None:
    done, run_dir = run(tmp_path, 4000)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        "targets[0] (edge): its context is 2,048 tokens (edge's models list), but the plan's "
        "longest request is 4,048"
    ) in done.stderr
    assert not (run_dir / "journal.db").exists()  # nothing to resume: it never started
    fits, run_dir = run(tmp_path, 2000)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert (run_dir / "journal.db").exists()
