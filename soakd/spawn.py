"""Spawn room: soakd's own children (``soakd sim``, ``soakd gateway``), started one way.

A child runs ``python -m soakd ...`` on a free loopback port; it gets SIGTERM when soakd
dies, even by SIGKILL (Linux's parent-death signal, set between fork and exec); its
output goes to a log file, never to a pipe nobody reads (that would stall it); it is
ready once a URL answers 200, polled through tenacity; a child that exits first fails
the spawn at once with the log's tail. ``Child.aclose`` stops it: SIGTERM, 5 s, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

PR_SET_PDEATHSIG: Final = 1
READY_POLL_S: Final = 0.1
STOP_GRACE_S: Final = 5.0


class SpawnError(RuntimeError):
    """A child that exited or never answered; the message says which, with its log's tail."""


class _NotReady(Exception):
    """The child runs but does not answer 200 yet: poll again."""


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the child binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    """A running soakd child and the URL it serves."""

    proc: asyncio.subprocess.Process
    url: str

    async def aclose(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE_S``; a child already gone is left."""
        await stop_process(self.proc)


async def stop_process(proc: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns once it is reaped."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def spawn_soakd(
    args: Sequence[str],
    *,
    what: str,
    url: str,
    ready_path: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Child:
    """Start ``python -m soakd ARGS``, its output appended to ``log_path``, and wait until
    ``url + ready_path`` answers 200. ``what`` names the child in errors ("simulator").

    Raises SpawnError when it exits first (its exit code and the log's last 300 chars)
    or does not answer within ``timeout_s`` (then it is stopped)."""
    with log_path.open("ab") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "soakd",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=None if env is None else dict(env),
            preexec_fn=die_with_parent,  # a SIGKILLed soakd leaves no child behind
        )
    child = Child(proc, url)
    try:
        await _wait_ready(child, url + ready_path, timeout_s)
    except _NotReady:
        await child.aclose()
        raise SpawnError(f"{what} did not answer on {url} within {timeout_s:g} s") from None
    except _Exited:
        # once, on the way out with an error: blocking is fine here
        tail = log_path.read_text(errors="replace").strip()[-300:]  # noqa: ASYNC240
        raise SpawnError(f"{what} exited ({proc.returncode}): {tail}") from None
    except BaseException:
        await child.aclose()  # cancelled while waiting: no orphan
        raise
    return child


class _Exited(Exception):
    """The child exited before it answered: no point polling on."""


async def _wait_ready(child: Child, url: str, timeout_s: float) -> None:
    async with aiohttp.ClientSession(trust_env=False) as session:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_fixed(READY_POLL_S),
            retry=retry_if_exception_type(_NotReady),
            reraise=True,
        ):
            with attempt:
                await _probe(child, session, url)


async def _probe(child: Child, session: aiohttp.ClientSession, url: str) -> None:
    if child.proc.returncode is not None:
        raise _Exited
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            if resp.status == 200:
                return
    except (aiohttp.ClientError, OSError, TimeoutError):
        pass
    raise _NotReady
