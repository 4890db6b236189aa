"""Spawn: runs the embedded simulator as a child process for targets with ``simulator: PROFILE``.

A separate process, not a task in soakd's loop, so the simulated server's CPU never
shows up as soakd's own latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog

log = structlog.get_logger()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when soakd dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class SimProcess:
    proc: asyncio.subprocess.Process
    base_url: str

    async def aclose(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def spawn_sim(
    profile: str, model: str, log_path: Path, timeout_s: float = 30.0
) -> SimProcess:
    """Start ``soakd sim`` on a free loopback port and wait until /health answers.

    Its output goes to ``log_path`` (never a pipe nobody reads: that would stall it)."""
    port = free_port()
    with log_path.open("ab") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "soakd", "sim", "--host", "127.0.0.1", "--port", str(port),
            "--profile", profile, "--model", model,
            stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            preexec_fn=_die_with_parent,
        )
    sim = SimProcess(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                # once, on the way out with an error: blocking is fine here
                tail = log_path.read_text(errors="replace").strip()[-300:]  # noqa: ASYNC240
                raise RuntimeError(f"simulator exited ({proc.returncode}): {tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(sim.base_url + "/health") as resp:
                    if resp.status == 200:
                        log.info("simulator_started", profile=profile, url=sim.base_url,
                                 pid=proc.pid)
                        return sim
            await asyncio.sleep(0.1)
    await sim.aclose()
    raise RuntimeError(f"simulator did not answer on {sim.base_url} within {timeout_s:g} s")
