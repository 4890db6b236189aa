"""Shared pieces of the fault suite (docs/faults.md): the hostile server, measured
figures, resource counts, running soakd in-process or as a process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from soakd.spawn import die_with_parent
from tests.hostile_server import HostileServer, serve_hostile

ROOT = Path(__file__).resolve().parents[2]
FIGURES = Path(os.environ.get("SOAKD_FAULT_FIGURES", ROOT / ".cache" / "faults" / "figures.json"))
KEY = "sk-soakd-FAULTSUITE-7f3c9a1e5b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a"
"""A distinctive API key: no output of a run may hold it, whole or in part."""

_figures: dict[str, Any] = {}


def figure(name: str, value: Any) -> None:
    """Record a measured figure for docs/faults.md and docs/reliability.md."""
    _figures[name] = round(value, 4) if isinstance(value, float) else value


@pytest.fixture(scope="session", autouse=True)
def _write_figures() -> Iterator[None]:
    yield
    if not _figures:
        return
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    old: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        old = json.loads(FIGURES.read_text())
    FIGURES.write_text(json.dumps({**old, **_figures}, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def hostile() -> Iterator[HostileServer]:
    with serve_hostile() as server:
        yield server


# --- resources -------------------------------------------------------------------------------


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tasks() -> int:
    return len(asyncio.all_tasks())


async def settle(baseline_fds: int, wait_s: float = 5.0) -> int:
    """Open fds once what a run left closing has closed (up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        n = open_fds()
        if n <= baseline_fds or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.1)


# --- metrics -----------------------------------------------------------------------------------


def samples(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def http_get(url: str, timeout: float = 5.0, **headers: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers=headers)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --- soakd as a process ------------------------------------------------------------------------


def soakd_cmd(cfg: Path, run_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "soakd",
        "run",
        str(cfg),
        "--no-live",
        "--metrics-addr",
        f"127.0.0.1:{port}",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_soakd(
    cfg: Path, run_dir: Path, port: int, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        soakd_cmd(cfg, run_dir, port, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        preexec_fn=die_with_parent,  # a killed pytest leaves no soakd behind
    )


def wait_metrics(port: int, pred: Any, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            if status == 200 and pred(body.decode()):
                return body.decode()
        time.sleep(0.1)
    raise AssertionError(f"soakd on :{port} did not get there in {timeout:g}s")


def child_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"
