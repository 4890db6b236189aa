"""Log lines carry the phase at the time of the event, not the phase a long-lived task was
born in (a closed-loop worker started in phase c4 logs c16 lines during c16)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog

from soakd.logs import close_logging, set_phase, setup_logging


async def test_a_task_logs_the_phase_of_the_moment(tmp_path: Path) -> None:
    setup_logging(log_file=tmp_path / "soakd.log", console=False)
    log = structlog.get_logger()
    go = asyncio.Event()

    async def worker() -> None:  # born in c4, like a closed-loop worker
        log.info("born")
        await go.wait()
        log.info("later")

    try:
        set_phase("c4")
        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        set_phase("c16")
        go.set()
        await task
        set_phase(None)
        log.info("draining")
    finally:
        close_logging()
    lines = {d["event"]: d for d in map(json.loads, (tmp_path / "soakd.log").open())}
    assert lines["born"]["phase"] == "c4"
    assert lines["later"]["phase"] == "c16"
    assert "phase" not in lines["draining"]
