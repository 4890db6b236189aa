"""The wall clock steps (NTP) forward and backward mid-run: durations, phase boundaries and
the open-loop schedule follow the monotonic clock and do not move.

For real: soakd runs as a process under libfaketime (Debian's ``faketime`` package) with
the monotonic clock left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``); the test steps the
wall clock by rewriting libfaketime's timestamp file. In-process too: ``time.time``
jumps by a day each way while the runner runs a plan against a fake target.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import itertools
import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from soakd.config import config_from_dict
from soakd.model import Outcome, RequestSpec
from soakd.sim.spawn import free_port
from soakd.workload.plan import build_plan
from soakd.workload.prompts import make_prompt_source
from soakd.workload.runner import Runner
from tests.faults.conftest import ROOT, figure, start_soakd, wait_metrics, write_config
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

S = 1_000_000_000
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
PHASE_S = 3.0
RATE = 20.0


def clock_config(hostile: HostileServer) -> dict[str, Any]:
    return {
        "run": {"name": "clock", "drain_timeout": "3s"},
        "targets": [{"name": "t", "base_url": hostile.url("paced"), "model": "m", "scrape": False}],
        "workload": {"max_tokens": 8},
        "gpu": {"source": "none"},
        "phases": [
            {"name": "a", "duration": f"{PHASE_S}s", "load": {"mode": "closed", "concurrency": 2}},
            {"name": "b", "duration": f"{PHASE_S}s", "load": {"mode": "constant", "rate": RATE}},
            {"name": "c", "duration": f"{PHASE_S}s", "load": {"mode": "closed", "concurrency": 1}},
        ],
    }


@pytest.mark.skipif(  # in CI (CI set) a missing libfaketime fails: CI never passes by skipping
    not LIBFAKETIME and not os.environ.get("CI"),
    reason="libfaketime missing (scripts/setup-faults.sh)",
)
def test_wall_clock_steps_under_a_soakd_process(hostile: HostileServer, tmp_path: Path) -> None:
    assert LIBFAKETIME, "libfaketime missing (scripts/setup-faults.sh); CI is set: a failure"
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    env = {
        "LD_PRELOAD": LIBFAKETIME[0],
        "FAKETIME_TIMESTAMP_FILE": str(stamp),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    }
    # libfaketime is active at all: the same environment shifts `date`
    shifted = subprocess.run(
        ["date", "+%s"],
        env={"PATH": "/usr/bin:/bin", **env, "FAKETIME": "+10d"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(shifted.stdout) - time.time() > 9 * 86400

    path = write_config(tmp_path / "clock.yaml", clock_config(hostile))
    run_dir = tmp_path / "run"
    port = free_port()
    proc = start_soakd(path, run_dir, port, env=env)
    try:
        wait_metrics(port, lambda t: "soakd_requests_total{" in t)
        time.sleep(1.0)
        stamp.write_text("+1h\n")  # NTP steps the clock an hour ahead (in phase a)
        time.sleep(3.0)
        stamp.write_text("-1h\n")  # then two hours back (in phase b)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-6000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] is True
    assert 3 * PHASE_S - 0.5 < summary["elapsed_s"] < 3 * PHASE_S + 5  # not +-hours
    with contextlib.closing(
        sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)
    ) as conn:
        walls = [w for (w,) in conn.execute("SELECT wall FROM requests ORDER BY id")]
        phases = conn.execute(
            "SELECT json_extract(data, '$.name'), offset_ns FROM events WHERE kind = 'phase' "
            "ORDER BY id"
        ).fetchall()
        by_phase = dict(conn.execute("SELECT phase, COUNT(*) FROM requests GROUP BY phase"))
        e2e_max = conn.execute("SELECT MAX(e2e_ns) FROM requests").fetchone()[0]
        e2e_min = conn.execute("SELECT MIN(e2e_ns) FROM requests").fetchone()[0]
        errors = conn.execute("SELECT COUNT(*) FROM requests WHERE error IS NOT NULL")
        n_errors = errors.fetchone()[0]
    # the wall clock really jumped under soakd: +1 h, then -2 h
    steps = [b - a for a, b in itertools.pairwise(walls)]
    assert max(steps) > 3000
    assert min(steps) < -6000
    # ...and nothing that is timed moved: phases at 0, 3, 6 s of plan time
    assert [p for p, _ in phases] == ["a", "b", "c"]
    for (_, offset), want in zip(phases, (0.0, PHASE_S, 2 * PHASE_S), strict=True):
        assert abs(offset / S - want) < 0.5, phases  # (entered late only on a busy box)
    assert by_phase["b"] == RATE * PHASE_S  # the open-loop schedule kept every instant
    assert e2e_min > 0  # durations: seconds, never negative...
    assert e2e_max < 5 * S  # ...nor hours
    assert n_errors == 0
    figure("clock.steps_s", [round(max(steps)), round(min(steps))])
    figure("clock.phase_offsets_s", [round(o / S, 3) for _, o in phases])
    figure("clock.e2e_max_s", e2e_max / S)

    # the report reads a journal whose wall clock went back and forth
    report = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "python"),
            "-m",
            "soakd",
            "report",
            str(run_dir),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    json.loads(report.stdout)


class FakeTarget:
    name = "t"

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        out = outcome if outcome is not None else Outcome.planned(spec)
        out.wall_start = time.time()
        out.sent_ns = time.perf_counter_ns()
        await asyncio.sleep(0.02)
        out.first_token_ns = out.last_token_ns = out.end_ns = time.perf_counter_ns()
        out.content_chunks = out.output_tokens = 1
        return out


class Collect:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, o: Outcome) -> None:
        self.outcomes.append(o)


async def test_wall_clock_jumps_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.time() jumps a day ahead, then two days back, while the runner runs 3 phases."""
    cfg = config_from_dict(
        {
            "targets": [{"name": "t", "base_url": "http://127.0.0.1:9"}],
            "phases": [
                {"name": "a", "duration": "1s", "load": {"mode": "closed", "concurrency": 2}},
                {"name": "b", "duration": "1s", "load": {"mode": "constant", "rate": 50}},
                {"name": "c", "duration": "1s", "load": {"mode": "poisson", "rate": 30}},
            ],
        }
    )
    from datetime import UTC, datetime

    plan = build_plan(cfg, datetime.now(UTC))
    shift = [0.0]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + shift[0])
    entered: list[tuple[str, float]] = []
    sink = Collect()
    runner = Runner(
        plan,
        {"t": FakeTarget()},
        make_prompt_source(cfg.workload),
        [sink],
        max_tokens=8,
        temperature=0.0,
        on_phase=lambda p: entered.append((p.name if p else "-", time.perf_counter())),
    )

    async def jump() -> None:
        await asyncio.sleep(0.5)
        shift[0] = 86400.0
        await asyncio.sleep(1.0)
        shift[0] = -86400.0

    t0 = time.perf_counter()
    jumper = asyncio.create_task(jump())
    await runner.run()
    await runner.drain(2)
    await jumper
    took = time.perf_counter() - t0
    # A runner that followed time.time() would end its phases at the first jump (0.5 s
    # in) or a day late; a quarter of a second tells those apart from a loaded loop.
    late_s = 0.25
    assert 3.0 - 0.1 < took < 3.0 + 2 * late_s
    starts = {name: at - t0 for name, at in entered}
    assert abs(starts["b"] - 1.0) < late_s, starts
    assert abs(starts["c"] - 2.0) < late_s, starts
    assert abs(starts["-"] - 3.0) < late_s
    walls = [o.wall_start for o in sink.outcomes]
    assert max(walls) - min(walls) > 86000  # the jumps were seen...
    assert all(0 < o.e2e_ns < 0.5 * S for o in sink.outcomes)  # ...by nothing timed
    assert sum(o.phase == "b" for o in sink.outcomes) == 50
