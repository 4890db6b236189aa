"""Worker processes (run.workers > 1), end to end: `soakd run` as shipped, against
simulators the test runs so it can read what they served after soakd is gone.

What a user checks: every request the servers saw is counted once (a worker killed
mid-run included: what it held is `worker_lost`, never counted twice), the killed worker
comes back, a phase switch reaches every worker, SIGTERM drains all of them, and a run
resumes with another worker count."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from soakd.journal import JournalReader, records
from soakd.profiles import get_profile
from soakd.sim.server import SimServer, start_sim
from soakd.sim.spawn import free_port
from tests.scraping import samples, scrape, total
from tests.waiting import until

pytestmark = pytest.mark.integration

DRAIN_S = 10.0


def config(urls: dict[str, str], phases: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    return {
        "run": {"name": "workers", "drain_timeout": f"{DRAIN_S:g}s", "workers": workers},
        "targets": [{"name": n, "base_url": u, "model": "m"} for n, u in urls.items()],
        "workload": {"max_tokens": 12, "prompts": {"input_tokens": {"mean": 20}}},
        "phases": phases,
    }


class Run:
    """`soakd run` in a subprocess, with its /metrics and /status at hand."""

    def __init__(self, tmp: Path, cfg: dict[str, Any], run_dir: Path) -> None:
        self.path = tmp / f"soak-{cfg['run']['workers']}.yaml"
        self.path.write_text(yaml.safe_dump(cfg))
        self.run_dir = run_dir
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self.out = b""

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(self.path),
            "--no-live",
            "--metrics-addr",
            f"127.0.0.1:{self.port}",
            "--run-dir",
            str(self.run_dir),
            "--no-preflight",  # its request is no outcome: the servers' counts are the run's
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )

    async def get(self, path: str) -> str | None:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            return await scrape(self.session, f"http://127.0.0.1:{self.port}{path}")
        return None

    async def metrics(self) -> dict[Any, float]:
        return samples(await self.get("/metrics") or "")

    async def status(self) -> dict[str, Any]:
        text = await self.get("/status")
        return json.loads(text) if text else {}

    async def until(self, what: str, check: Any, within: float = 60.0) -> Any:
        deadline = time.monotonic() + within
        while True:
            assert self.proc is not None
            assert self.proc.returncode is None, f"soakd exited before {what}"
            got = await check()
            if got:
                return got
            assert time.monotonic() < deadline, f"{what} did not happen within {within:g} s"
            await asyncio.sleep(0.1)

    async def wait(self, within: float) -> int:
        assert self.proc is not None
        self.out, _ = await asyncio.wait_for(self.proc.communicate(), within)
        assert self.proc.returncode is not None
        return self.proc.returncode

    async def aclose(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self.session.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def served(page: dict[Any, float]) -> tuple[float, float]:
    """(finished, aborted) as the simulator counted them."""
    fin = total(page, "vllm:request_success_total", finished_reason="stop") + total(
        page, "vllm:request_success_total", finished_reason="length"
    )
    return fin, total(page, "vllm:request_success_total", finished_reason="abort")


def journal_rows(run_dir: Path) -> list[tuple[str, int, str | None, str]]:
    with JournalReader(run_dir) as journal:
        return [(r["target"], r["seq"], r["error"], r["phase"]) for r in journal.request_rows()]


@pytest.fixture
async def sims() -> Any:
    profile = get_profile("fast")
    started: dict[str, SimServer] = {}
    try:
        for name in ("a", "b"):
            started[name] = await start_sim("127.0.0.1", 0, profile, "m")
        yield started
    finally:
        for sim in started.values():
            await sim.aclose()


async def served_by(sims: dict[str, SimServer]) -> dict[str, tuple[float, float]]:
    async with aiohttp.ClientSession() as session:
        return {
            n: served(samples(await scrape(session, s.url + "/metrics"))) for n, s in sims.items()
        }


async def test_worker_killed_mid_run_counts_stay_exact_and_it_comes_back(
    tmp_path: Path, sims: dict[str, SimServer]
) -> None:
    """Three workers, closed loop then Poisson. One worker is SIGKILLed mid-run: what it
    held is recorded once as worker_lost, it is started again, and at the SIGTERM every
    request the servers saw is counted exactly once."""
    phases = [
        {"name": "closed", "duration": "4s", "load": {"mode": "closed", "concurrency": 6}},
        {"name": "open", "duration": "1h", "load": {"mode": "poisson", "rate": 40}},
    ]
    urls = {n: s.url for n, s in sims.items()}
    run = Run(tmp_path, config(urls, phases, 3), tmp_path / "run")
    try:
        await run.start()
        await run.until(
            "closed-loop requests through every worker", lambda p="closed": _each_worker(run, p, 3)
        )
        victim = (await run.status())["workers"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        await run.until(
            "the killed worker back up",
            lambda: _status_when(
                run, lambda s: len(_up(s)) == 3 and victim not in {w["pid"] for w in _up(s)}
            ),
        )
        await run.until(
            "the open phase reached every worker", lambda p="open": _each_worker(run, p, 3)
        )
        page = await run.metrics()
        pids = [w["pid"] for w in (await run.status())["workers"]]
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert await run.wait(DRAIN_S + 30) == 0, run.out.decode()[-3000:]
        stop_s = time.monotonic() - signalled
    finally:
        await run.aclose()
    seen = await served_by(sims)
    assert stop_s < DRAIN_S + 2
    assert not [p for p in pids if alive(p)], "a worker outlived soakd"
    assert total(page, "soakd_worker_restarts_total") == 1
    assert total(page, "soakd_workers_up") == 3
    rows = journal_rows(run.run_dir)
    keys = Counter((t, seq) for t, seq, _, _ in rows)
    assert max(keys.values()) == 1, "a request journaled twice"
    summary = json.loads((run.run_dir / "summary.json").read_text())
    lost_all = 0
    for name, (finished, aborted) in seen.items():
        mine = [r for r in rows if r[0] == name]
        kinds = Counter(r[2] for r in mine)
        ok, lost = kinds[None], kinds["worker_lost"]
        lost_all += lost
        assert set(kinds) <= {None, "worker_lost"}, kinds
        assert summary["targets"][name]["requests"] == len(mine)
        print(f"{name}: server finished {finished:g} aborted {aborted:g}; ok {ok} lost {lost}")
        # every answer soakd counted ok, the server finished; what the server finished
        # beyond that was in the killed worker's hands (lost); and nothing reached the
        # server that soakd did not count
        assert ok <= finished <= ok + lost
        assert finished + aborted <= ok + lost
    assert lost_all >= 1, "the killed worker held no request"


async def _each_worker(run: Run, phase: str, workers: int, at_least: int = 5) -> bool:
    """Every worker has handed back ``at_least`` requests of ``phase``."""
    return await _metrics_when(
        run,
        lambda m: all(
            total(m, "soakd_worker_requests_total", worker=str(w), phase=phase) >= at_least
            for w in range(workers)
        ),
    )


def _up(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status.get("workers") or [] if w["up"]]


async def _status_when(run: Run, ok: Any) -> dict[str, Any] | None:
    status = await run.status()
    return status if status and ok(status) else None


async def _metrics_when(run: Run, ok: Any) -> bool:
    page = await run.metrics()
    return bool(page) and ok(page)


async def test_resume_with_fewer_workers(tmp_path: Path, sims: dict[str, SimServer]) -> None:
    """A run started with 4 workers and stopped, resumed with 2: the resume accepts the new
    count, the request numbers go on without a repeat, and across both sessions the
    journal holds exactly the requests the servers finished."""
    phases = [{"name": "steady", "duration": "1h", "load": {"mode": "closed", "concurrency": 4}}]
    urls = {n: s.url for n, s in sims.items()}
    run_dir = tmp_path / "run"
    for workers in (4, 2):
        run = Run(tmp_path, config(urls, phases, workers), run_dir)
        try:
            await run.start()
            await run.until(
                f"requests through each of {workers} workers",
                lambda r=run, n=workers: _metrics_when(
                    r,
                    lambda m: (
                        total(m, "soakd_workers_up") == n
                        and all(
                            total(m, "soakd_worker_requests_total", worker=str(w)) >= 5
                            for w in range(n)
                        )
                    ),
                ),
            )
            assert run.proc is not None
            run.proc.send_signal(signal.SIGTERM)
            assert await run.wait(DRAIN_S + 30) == 0, run.out.decode()[-3000:]
        finally:
            await run.aclose()
    seen = await served_by(sims)
    rows = journal_rows(run_dir)
    assert max(Counter((t, seq) for t, seq, _, _ in rows).values()) == 1
    with JournalReader(run_dir) as journal:
        resumed = [e for e in journal.events() if isinstance(e.event, records.RunResumed)]
    assert len(resumed) == 1, "the second session was not a resume"
    for name, (finished, aborted) in seen.items():
        mine = [r for r in rows if r[0] == name]
        assert all(r[2] is None for r in mine), Counter(r[2] for r in mine)
        print(f"{name}: server finished {finished:g}, journal {len(mine)}")
        assert len(mine) == finished >= 20
        assert aborted == 0  # both stops drained: nothing cut


async def test_parent_killed_its_workers_exit(tmp_path: Path, sims: dict[str, SimServer]) -> None:
    """soakd SIGKILLed (no goodbye): its workers see their socket close and exit."""
    phases = [{"name": "steady", "duration": "1h", "load": {"mode": "closed", "concurrency": 4}}]
    run = Run(tmp_path, config({n: s.url for n, s in sims.items()}, phases, 2), tmp_path / "run")
    try:
        await run.start()
        status = await run.until(
            "two workers up", lambda: _status_when(run, lambda s: len(_up(s)) == 2)
        )
        pids = [w["pid"] for w in status["workers"]]
        assert run.proc is not None
        run.proc.kill()
        await run.proc.wait()
    finally:
        await run.aclose()
    await until(lambda: not any(alive(p) for p in pids), 10, "the workers exiting")


async def test_drain_deadline_cuts_what_the_workers_hold_once(tmp_path: Path) -> None:
    """SIGTERM with slow answers in flight and a 1 s drain: every worker cuts what it still
    holds, hands back what arrived, and each cut request is one `cancelled` outcome (the
    server aborted exactly those)."""
    slow = await start_sim("127.0.0.1", 0, get_profile("edge-4gb"), "m")
    phases = [{"name": "steady", "duration": "1h", "load": {"mode": "closed", "concurrency": 6}}]
    cfg = config({"slow": slow.url}, phases, 3)
    cfg["run"]["drain_timeout"] = "1s"
    cfg["workload"]["max_tokens"] = 200
    run = Run(tmp_path, cfg, tmp_path / "run")
    try:
        await run.start()
        await run.until(
            "six requests in flight on three workers",
            lambda: _status_when(
                run, lambda s: len(_up(s)) == 3 and sum(w["in_flight"] for w in _up(s)) == 6
            ),
        )
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        assert await run.wait(30) == 0, run.out.decode()[-3000:]
        seen = await served_by({"slow": slow})
    finally:
        await run.aclose()
        await slow.aclose()
    finished, aborted = seen["slow"]
    rows = journal_rows(run.run_dir)
    kinds = Counter(r[2] for r in rows)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    print(f"\nserver finished {finished:g} aborted {aborted:g}; soakd {dict(kinds)}")
    assert kinds["cancelled"] >= 1
    assert summary["cancelled"] == kinds["cancelled"]
    assert set(kinds) <= {None, "cancelled"}
    assert kinds[None] == finished
    assert kinds["cancelled"] == aborted
    with JournalReader(run.run_dir) as journal:
        cut = [r for r in journal.request_rows() if r["error"] == "cancelled"]
    assert all(r["sent_ns"] for r in cut)  # sent, then cut: when it went out is kept


async def test_a_stalled_worker_counts_its_backlog_late_and_never_sends_it(
    tmp_path: Path, sims: dict[str, SimServer]
) -> None:
    """A worker stopped (SIGSTOP) for longer than max_lateness, while the parent goes on
    handing it its share of a Poisson schedule: once it runs again, what it got meanwhile
    is past its deadline. It is counted as late sends, never sent, and the journal still
    equals what the server finished."""
    rate, stall_s = 40, 1.5
    load = {"mode": "poisson", "rate": rate, "max_lateness": "300ms"}
    phases = [{"name": "open", "duration": "1h", "load": load}]
    run = Run(tmp_path, config({"a": sims["a"].url}, phases, 2), tmp_path / "run")
    try:
        await run.start()
        await run.until("requests through both workers", lambda p="open": _each_worker(run, p, 2))
        victim = (await run.status())["workers"][0]["pid"]
        before = total(await run.metrics(), "soakd_sends_missed_total", reason="late")
        os.kill(victim, signal.SIGSTOP)
        await asyncio.sleep(stall_s)
        os.kill(victim, signal.SIGCONT)
        page = await run.until(
            "the stalled worker's backlog counted late",
            lambda: _metrics_when(
                run, lambda m: total(m, "soakd_sends_missed_total", reason="late") > before
            ),
        )
        page = await run.metrics()
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        assert await run.wait(DRAIN_S + 30) == 0, run.out.decode()[-3000:]
    finally:
        await run.aclose()
    finished, aborted = (await served_by({"a": sims["a"]}))["a"]
    rows = journal_rows(run.run_dir)
    late = total(page, "soakd_sends_missed_total", reason="late") - before
    print(f"\nserver finished {finished:g} aborted {aborted:g}; journal {len(rows)}; late {late:g}")
    # about half the instants of the stall beyond max_lateness went to the stopped worker
    assert late >= rate * (stall_s - 0.3) / 2 * 0.5
    assert total(page, "soakd_workers_up") == 2  # stalled is not dead: nothing restarted
    assert Counter(r[2] for r in rows) == {None: len(rows)}
    assert len(rows) == finished
    assert aborted == 0
