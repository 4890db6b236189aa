"""Log lines carry the phase at the time of the event, not the phase a long-lived task was
born in (a closed-loop worker started in phase c4 logs c16 lines during c16)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog

from soakd.config import RateLimit, SpendGuard
from soakd.logs import close_logging, flush_repeats, set_phase, setup_logging
from soakd.model import ErrorKind, Outcome
from soakd.workload.guard import TargetGuard


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


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _storm_outcome() -> Outcome:
    o = Outcome("cloud", "p", 0, 0, status=429, error=ErrorKind.HTTP_429)
    o.retry_after_s = 0.005
    return o


def test_a_429_storm_writes_a_bounded_log_and_counts_every_pause(tmp_path: Path) -> None:
    """10,000 Retry-After pauses in 100 s: a few dozen lines, not 20,000, and the summary
    lines say how many were left out."""
    clock = _Clock()
    path = tmp_path / "soakd.log"
    setup_logging(log_file=path, console=False, clock=clock)
    guard = TargetGuard("cloud", SpendGuard(), RateLimit(), clock=clock)
    try:
        for _ in range(10_000):
            guard.record(_storm_outcome())
            assert guard.delay_s() > 0  # target_paused
            clock.t += 0.01
            assert guard.delay_s() == 0  # target_resumed
            flush_repeats()  # the run's tick
    finally:
        close_logging()
    lines = [json.loads(line) for line in path.open()]
    assert len(lines) <= 50
    for kind in ("target_paused", "target_resumed"):
        written = sum(1 for d in lines if d["event"] == kind)
        summaries = [d for d in lines if d["event"] == "log_repeated" and d["of"] == kind]
        assert written >= 1
        assert summaries
        assert written + sum(d["count"] for d in summaries) == 10_000
        assert all(d["target"] == "cloud" for d in summaries)
        first = summaries[0]
        assert first["message"] == f"{first['count']} more like this in the last 10 s"


def test_lines_about_different_targets_or_events_are_not_folded(tmp_path: Path) -> None:
    path = tmp_path / "soakd.log"
    setup_logging(log_file=path, console=False, clock=_Clock())
    log = structlog.get_logger()
    try:
        for target in ("a", "b"):
            log.warning("target_paused", target=target)
            log.info("target_resumed", target=target)
        log.info("progress")
        log.info("progress")  # no target: never folded
    finally:
        close_logging()
    events = [json.loads(line)["event"] for line in path.open()]
    assert events.count("target_paused") == 2
    assert events.count("target_resumed") == 2
    assert events.count("progress") == 2
    assert "log_repeated" not in events


def test_the_log_file_rotates_at_its_size_cap(tmp_path: Path) -> None:
    path = tmp_path / "soakd.log"
    setup_logging(log_file=path, console=False, max_bytes=10_000)
    log = structlog.get_logger()
    try:
        for i in range(2_000):
            log.info("line", n=i, pad="x" * 40)
    finally:
        close_logging()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["soakd.log", *(f"soakd.log.{i}" for i in range(1, 4))]
    assert all(f.stat().st_size <= 10_000 for f in files)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["n"] == 1_999  # the newest lines are in soakd.log


def test_a_file_truncated_from_outside_is_not_rotated(tmp_path: Path) -> None:
    """logrotate's copytruncate empties the file under soakd: no early rotation then."""
    path = tmp_path / "soakd.log"
    setup_logging(log_file=path, console=False, max_bytes=10_000)
    log = structlog.get_logger()
    try:
        for i in range(50):  # about 6.5 KB
            log.info("line", n=i, pad="x" * 40)
        path.write_text("")  # copytruncate
        for i in range(50):  # about 6.5 KB
            log.info("line", n=i, pad="x" * 40)
    finally:
        close_logging()
    assert [f.name for f in tmp_path.iterdir()] == ["soakd.log"]
