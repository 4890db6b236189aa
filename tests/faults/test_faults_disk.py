"""The disk under the journal fills up, or turns read-only, mid-run: soakd keeps measuring
and exporting, counts the journal's failed writes (soakd_journal_write_errors_total) and
logs them, writes again once there is space, and loses nothing already written.

Real filesystems: a 12 MiB tmpfs filled to the last byte, and a loop-mounted ext4 that a
forced filesystem error turns read-only (``errors=remount-ro``), as a failing disk does.
Both need root (mount); skipped without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from soakd.config import config_from_dict
from soakd.report import build_report, terminal_summary
from soakd.run.app import RunOptions, Soak
from tests.faults.conftest import figure, samples
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


needs_root = pytest.mark.skipif(not can_mount(), reason="needs root to mount a filesystem")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def umount(path: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tmpfs"
    where.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=12m", "tmpfs", str(where))
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc.stderr.strip()}")
    try:
        yield where
    finally:
        umount(where)


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    image, where = tmp_path / "disk.img", tmp_path / "ext4"
    where.mkdir()
    with image.open("wb") as f:
        f.truncate(32 << 20)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        mount("-o", "loop,errors=remount-ro", str(image), str(where))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot loop-mount an ext4 image here: {exc}")
    try:
        yield image, where
    finally:
        umount(where)


def soak_for(hostile: HostileServer, run_dir: Path, seconds: float, queue: int = 10_000) -> Soak:
    cfg = config_from_dict(
        {
            "run": {"name": "disk", "drain_timeout": "3s"},
            "journal": {"queue_size": queue},
            "targets": [
                {"name": "t", "base_url": hostile.url("ok"), "model": "m", "scrape": False}
            ],
            "workload": {"max_tokens": 8},
            "gpu": {"source": "none"},
            "phases": [
                {"name": "p", "duration": f"{seconds}s", "load": {"mode": "constant", "rate": 150}}
            ],
        }
    )
    return Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=True))


def rows(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])


def fill(where: Path) -> Path:
    """Write a file until the filesystem has no byte left."""
    filler = where / "filler"
    block = b"\0" * (64 << 10)
    with filler.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(block)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 512)
    return filler


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


@needs_root
async def test_disk_full_then_space_returns(
    hostile: HostileServer, tmpfs: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmpfs / "run"
    soak = soak_for(hostile, run_dir, 11.0)
    seen: dict[str, float] = {}

    async def fault() -> None:
        while soak.http is None or soak.stats.total["t"].requests < 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        seen["rows_before"] = rows(run_dir / "journal.db")
        filler = await asyncio.to_thread(fill, tmpfs)
        t_full = time.monotonic()
        m = soak.metrics.registry
        errors = 0.0
        while errors == 0 and time.monotonic() - t_full < 5:
            await asyncio.sleep(0.05)
            errors = samples(generate_latest(m).decode(), "soakd_journal_write_errors_total")
        seen["detect_s"] = time.monotonic() - t_full
        requests0 = soak.stats.total["t"].requests
        exported0 = samples(await scrape(soak.http.url), "soakd_requests_total")
        await asyncio.sleep(2.5)  # full for a while: requests, metrics, /metrics go on
        seen["requests_while_full"] = soak.stats.total["t"].requests - requests0
        seen["exported_while_full"] = (
            samples(await scrape(soak.http.url), "soakd_requests_total") - exported0
        )
        filler.unlink()
        t_free = time.monotonic()
        last = samples(generate_latest(m).decode(), "soakd_journal_last_commit_time_seconds")
        while time.monotonic() - t_free < 40:
            await asyncio.sleep(0.05)
            text = generate_latest(m).decode()
            if samples(text, "soakd_journal_last_commit_time_seconds") > last:
                seen["resume_s"] = time.monotonic() - t_free
                break

    injector = asyncio.create_task(fault())
    result = await soak.run()
    await injector
    err = capfd.readouterr().err

    assert result.completed
    assert seen["requests_while_full"] > 100  # measuring went on
    assert seen["exported_while_full"] > 100  # and so did the exporter
    assert "journal_write_failed" in err  # said so in the log (the console: the disk is full)
    assert "journal_writes_resumed" in err
    assert "Traceback" not in err
    assert seen["detect_s"] < 1.5  # the first failing flush (every 0.25 s)
    assert "resume_s" in seen, "the journal never wrote again"
    assert seen["resume_s"] < 31  # at most the longest retry wait
    text = generate_latest(soak.metrics.registry).decode()
    assert samples(text, "soakd_journal_write_errors_total") >= 1

    db = run_dir / "journal.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        total = conn.execute("SELECT SUM(requests) FROM totals").fetchone()[0]
    dropped = samples(text, "soakd_journal_dropped_records_total", kind="request")
    assert n >= seen["rows_before"]  # nothing already written was lost
    assert n == total
    # every outcome is in the journal or counted as dropped (queue full while failing)
    assert n + dropped == soak.stats.total["t"].requests
    log = (run_dir / "soakd.log").read_text()
    assert "journal_writes_resumed" in log  # the log file works again too
    figure("disk_full.detect_s", seen["detect_s"])
    figure("disk_full.resume_after_space_s", seen["resume_s"])
    figure("disk_full.requests_while_full", seen["requests_while_full"])
    figure("disk_full.records_lost", soak.stats.total["t"].requests - n - dropped)
    figure("disk_full.records_dropped", dropped)


@needs_root
async def test_disk_turns_read_only_mid_run(
    hostile: HostileServer, ext4: tuple[Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    image, where = ext4
    run_dir = where / "run"
    soak = soak_for(hostile, run_dir, 6.0)
    seen: dict[str, float] = {}
    dev = subprocess.run(  # noqa: ASYNC221 (set-up, before the run)
        ["findmnt", "-n", "-o", "SOURCE", str(where)], capture_output=True, text=True, check=True
    ).stdout.strip()
    trigger = Path(f"/sys/fs/ext4/{Path(dev).name}/trigger_fs_error")
    if not trigger.exists():  # noqa: ASYNC240
        pytest.skip(f"{trigger} is missing: cannot force the filesystem read-only")

    async def fault() -> None:
        while soak.http is None or soak.stats.total["t"].requests < 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        seen["rows_before"] = rows(run_dir / "journal.db")
        # ext4: an error -> remounted read-only at once
        trigger.write_text("soakd fault test\n")  # noqa: ASYNC240
        t0 = time.monotonic()
        requests0 = soak.stats.total["t"].requests
        while time.monotonic() - t0 < 5:
            await asyncio.sleep(0.05)
            text = generate_latest(soak.metrics.registry).decode()
            if samples(text, "soakd_journal_write_errors_total") >= 1:
                seen["detect_s"] = time.monotonic() - t0
                break
        await asyncio.sleep(1.5)
        seen["requests_while_ro"] = soak.stats.total["t"].requests - requests0
        seen["exported_while_ro"] = samples(await scrape(soak.http.url), "soakd_requests_total")

    injector = asyncio.create_task(fault())
    result = await soak.run()  # ends cleanly even though its last writes cannot be made
    await injector
    err = capfd.readouterr().err
    assert result.completed
    assert seen["requests_while_ro"] > 100
    assert "journal_write_failed" in err
    assert "Read-only" in err or "readonly" in err.lower()
    assert "detect_s" in seen
    # remount: what was committed before the disk failed is all there
    umount(where)
    mount("-o", "loop", str(image), str(where))  # rw: ext4 replays its own journal first
    with contextlib.closing(
        sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)
    ) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    assert n >= seen["rows_before"]
    figure("disk_read_only.detect_s", seen["detect_s"])
    figure("disk_read_only.rows_kept", n)
    figure("disk_read_only.rows_before_fault", seen["rows_before"])


@needs_root
@pytest.mark.parametrize("queue", [10_000, 100])
async def test_disk_full_to_the_end_is_said_first_with_the_counts(
    hostile: HostileServer, tmpfs: Path, queue: int
) -> None:
    """The disk fills and never frees. Before: the run's summary said "sent 173" for 1,200
    requests measured and served (the journal's final write failed, so its totals were
    those of its last commit), and only a log line on stderr named the loss. Now the
    journal's reserve takes the final state in, and the summary (the report of the run:
    what `soakd run` prints at its end) says first that writes failed to the end; with a
    small queue, the requests dropped meanwhile are counted in its first lines too."""
    run_dir = tmpfs / "run"
    soak = soak_for(hostile, run_dir, 6.0, queue)
    served0 = hostile.stats.requests["ok"]

    async def fault() -> None:
        while soak.http is None or soak.stats.total["t"].requests < 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.to_thread(fill, tmpfs)  # and never freed

    injector = asyncio.create_task(fault())
    result = await soak.run()
    await injector
    measured = soak.stats.total["t"].requests
    assert result.completed
    assert measured == hostile.stats.requests["ok"] - served0  # every request the server saw
    assert result.journal_unwritten == 0  # the reserve took the final state
    rep = build_report(run_dir, slowest_n=0)
    first = rep.warnings[0]
    assert first.startswith("the journal could not write from ")
    assert "of plan time to the end of the session" in first
    assert "database or disk is full" in first
    journaled = rep.overall["t"].requests
    with contextlib.closing(
        sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)
    ) as conn:
        assert conn.execute("SELECT SUM(requests) FROM totals").fetchone()[0] == measured
    # every request measured is in the journal's windows: the writer folds what arrives
    # while its writes fail (soakd/journal/store.py)
    assert journaled == measured
    if queue == 10_000:  # the writer kept every row for the retry
        assert len(rep.warnings) == 1
    else:  # rows past journal.queue_size were dropped (counted), their requests folded
        with contextlib.closing(
            sqlite3.connect(f"file:{run_dir / 'journal.db'}?mode=ro", uri=True)
        ) as conn:
            kept = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        assert kept < measured
        assert rep.warnings[1].startswith(
            f"{measured - kept:,} request(s) in the tables have no row in the journal"
        )
    summary = terminal_summary(rep)  # what `soakd run` prints at its end
    assert str(summary[0]).startswith("WARNING: the journal could not write from ")
    figure(f"disk_full_to_end.queue_{queue}.measured", measured)
    figure(f"disk_full_to_end.queue_{queue}.journaled", journaled)
