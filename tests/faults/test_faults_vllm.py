"""The real vLLM CPU server SIGKILLed mid-stream while soakd drives it, then started again
(tests/vllm_server.py): the cut streams are stream_truncated, the requests while it is down
connect_refused, soakd's probes count exactly one restart, soakd recovers by itself, and
the run leaves no task and no file descriptor behind."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from tests.faults.conftest import figure, open_fds, samples, settle, tasks
from tests.vllm_server import VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]


async def until(pred: object, wait_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():  # type: ignore[operator]
        if time.monotonic() - t0 > wait_s:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_vllm_killed_mid_stream_and_restarted(vllm: VllmServer, tmp_path: Path) -> None:
    fds0, tasks0 = open_fds(), tasks()
    cfg = config_from_dict(
        {
            "run": {"name": "vkill", "drain_timeout": "30s"},
            "targets": [
                {
                    "name": "vllm",
                    "base_url": vllm.base_url,
                    "model": vllm.model,
                    "timeouts": {"connect": "2s", "ttft": "60s", "total": "120s"},
                }
            ],
            "workload": {"max_tokens": 48, "prompts": {"input_tokens": {"mean": 16}}},
            "gpu": {"source": "none"},
            "probes": {"scrape_interval": "1s", "health_interval": "500ms"},
            "phases": [
                {"name": "p", "duration": "30m", "load": {"mode": "closed", "concurrency": 3}}
            ],
        }
    )
    soak = Soak(
        cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )
    run = asyncio.create_task(soak.run())
    try:
        stats = lambda: soak.stats.total["vllm"]  # noqa: E731
        await until(lambda: stats().ok >= 3, 120, "3 requests through vLLM")
        # mid-stream: every worker has a request out and tokens are arriving
        await until(
            lambda: soak.runner is not None and soak.runner.in_flight["vllm"] == 3,
            30,
            "3 requests in flight",
        )
        await asyncio.sleep(0.3)
        ok_before = stats().ok
        await asyncio.to_thread(vllm.kill_hard)
        killed = time.monotonic()
        await until(lambda: stats().errors.get("connect_refused", 0) >= 1, 30, "refused")
        down_ok = stats().ok
        started = time.monotonic()
        await vllm.arestart(hard=True)  # the same port, a new process
        figure("vllm_kill.server_restart_s", time.monotonic() - started)
        ready = time.monotonic()
        recover = await until(lambda: stats().ok >= down_ok + 3, 120, "requests ok again")
        text = lambda: generate_latest(soak.metrics.registry).decode()  # noqa: E731
        await until(
            lambda: samples(text(), "soakd_target_restarts_total", target="vllm") >= 1,
            30,
            "the restart to be counted",
        )
        await asyncio.sleep(2.0)  # a few more probe rounds: still one restart
        soak._on_signal(signal.SIGTERM)  # stop as an operator would
        result = await asyncio.wait_for(run, 120)
    finally:
        if not run.done():
            run.cancel()
        if not vllm.is_running():
            await vllm.astart()  # the fixture is shared: leave it running

    assert not result.completed  # stopped by the signal, cleanly
    assert result.cancelled == 0  # drained within the deadline
    errors = soak.stats.total["vllm"].errors
    final = generate_latest(soak.metrics.registry).decode()
    # the requests the kill cut (the server had read them): stream_truncated, each once;
    # never sent again to meet the dead port (that would hide what the kill did)
    assert errors.get("stream_truncated", 0) >= 1, errors
    assert errors.get("connect_refused", 0) >= 1, errors  # and nothing there meanwhile
    assert set(errors) <= {"stream_truncated", "connect_refused"}, errors
    # the requests in flight, and the few sent while the killed processes were still
    # being torn down (the kernel still held their sockets, then reset them before any
    # answer; a loaded CI run saw 5): at most 2 x concurrency. A pooled connection the
    # kernel had already closed is never used (soakd/targets/pool.py).
    assert errors.get("stream_truncated", 0) <= 6, errors
    assert samples(final, "soakd_target_restarts_total", target="vllm") == 1
    assert samples(final, "soakd_target_up", target="vllm") == 1
    assert soak.stats.total["vllm"].ok > ok_before
    # nothing leaked: every task ended, every socket and file closed
    assert tasks() <= tasks0, asyncio.all_tasks()
    fds = await settle(fds0)
    assert fds <= fds0, (fds, fds0)
    figure("vllm_kill.stream_truncated", errors.get("stream_truncated", 0))
    figure("vllm_kill.connect_refused", errors["connect_refused"])
    figure("vllm_kill.recover_after_ready_s", recover)
    figure("vllm_kill.down_s", ready - killed)
    figure("vllm_kill.restarts_counted", samples(final, "soakd_target_restarts_total"))
    figure("vllm_kill.tasks_before_after", [tasks0, tasks()])
    figure("vllm_kill.fds_before_after", [fds0, fds])
