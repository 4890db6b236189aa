"""soakd run's shutdown: every resource closed, and the journal's final flush made, even
when one close fails; a child that does not start is one line and exit 2."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import soakd.run.app
import soakd.workers.senders
from soakd.config import TargetConfig, config_from_dict
from soakd.journal import Journal
from soakd.run.app import RunOptions, Soak
from soakd.run.assemble import Servers, Setup
from soakd.sim.spawn import free_port
from soakd.targets.openai import open_target
from soakd.types import Target

pytestmark = pytest.mark.integration


def nowhere_config() -> dict[str, Any]:
    """One target on a port nothing listens on: every request is refused, fast."""
    return {
        "run": {"name": "close", "drain_timeout": "2s"},
        "targets": [{"name": "t", "base_url": f"http://127.0.0.1:{free_port()}", "scrape": False}],
        "gpu": {"source": "none"},
        "phases": [{"name": "p", "duration": "0.4s", "load": {"mode": "closed", "concurrency": 1}}],
    }


def run_stopped(run_dir: Path) -> list[dict[str, Any]]:
    """The journal's final record(s) of the session: written by its last flush."""
    with sqlite3.connect(run_dir / "journal.db") as conn:
        rows = conn.execute("SELECT data FROM events WHERE kind = 'run_stopped'").fetchall()
    return [json.loads(data) for (data,) in rows]


class BadClose:
    """A target whose aclose closes the real client, then raises."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.name = inner.name
        self.send = inner.send

    async def aclose(self) -> None:
        await self.inner.aclose()
        raise RuntimeError("close failed")


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_failing_target_close_still_flushes_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def open_bad(cfg: TargetConfig, **kwargs: Any) -> Target:
        return BadClose(await open_target(cfg, **kwargs))

    monkeypatch.setattr(soakd.workers.senders, "open_target", open_bad)
    port = free_port()
    soak = Soak(
        config_from_dict(nowhere_config()),
        RunOptions(run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{port}", console_logs=False),
    )
    result = await soak.run()
    assert result.completed
    assert [e["completed"] for e in run_stopped(tmp_path / "run")] == [True]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] is True
    assert refused(port)  # the exporter was closed after it


async def test_a_failing_journal_close_still_closes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_aclose = Journal.aclose

    async def flush_then_fail(self: Journal, completed: bool = False) -> None:
        await real_aclose(self, completed=completed)
        raise OSError("disk gone")

    monkeypatch.setattr(Journal, "aclose", flush_then_fail)
    port = free_port()
    soak = Soak(
        config_from_dict(nowhere_config()),
        RunOptions(run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{port}", console_logs=False),
    )
    with pytest.raises(OSError, match="disk gone"):
        await soak.run()
    assert [e["completed"] for e in run_stopped(tmp_path / "run")] == [True]
    assert refused(port)  # closed although an earlier close raised


def test_a_simulator_that_does_not_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The simulator child dies at start (a broken environment: here a sitecustomize that
    exits in `soakd sim` only; an unknown profile is a config error before any child)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nif sys.orig_argv[1:4] == ['-m', 'soakd', 'sim']:\n    sys.exit(3)\n"
    )
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    cfg = {
        "targets": [{"name": "sim", "simulator": "edge-4gb"}],
        "phases": [{"name": "p", "duration": "1s"}],
    }
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(path),
            "--no-live",
            "--metrics-addr",
            "127.0.0.1:0",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("soakd: error: targets[sim].simulator: simulator exited"), last


async def test_sigterm_while_the_journal_opens_stops_the_run_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker stop` during start-up: the exporter answers, the journal is still opening.
    The signal must stop the run before it sends (journal closed, summary written), not
    kill soakd with SIGTERM's default action."""
    import asyncio
    import os
    import signal

    real_open = soakd.run.app.start_journal

    async def open_after_a_signal(setup: Setup, servers: Servers) -> Journal:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the loop's handler, if any
        for _ in range(500):  # the handler runs (through the loop) before the journal is there
            if soak._signals:
                break
            await asyncio.sleep(0.01)
        assert soak._signals == 1
        return await real_open(setup, servers)

    monkeypatch.setattr(soakd.run.app, "start_journal", open_after_a_signal)
    soak = Soak(
        config_from_dict(nowhere_config()),
        RunOptions(run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{free_port()}"),
    )
    result = await soak.run()
    assert not result.completed
    assert sum(result.summary[t]["requests"] for t in result.summary) == 0
    assert [e["completed"] for e in run_stopped(tmp_path / "run")] == [False]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] is False
