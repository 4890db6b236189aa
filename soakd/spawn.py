"""Spawn room: soakd's own children, started one way, and started again one way.

Every child runs ``python -m MODULE ...`` with its output appended to a log file, never to
a pipe nobody reads (that would stall it): ``spawn_module`` from the event loop (the sender
workers, ``soakd sim``, ``soakd gateway``), ``start_module`` from a plain thread (the
journal's writer, started by its link thread). A child gets SIGTERM when soakd dies, even by
SIGKILL (soakd/lifeline.py: set between fork and exec with ``tie=True``, or by the child
itself, given the parent's pid, where a ``preexec_fn`` is not safe). One that talks to
soakd gets one end of a ``socket_pair``. One that dies is started again after ``Backoff``
(0.25 s, doubling to 30 s while it keeps dying, from 0.25 s again after a child that lived
a minute): the workers' pool and the journal's link share it.

``spawn_soakd``: a ``python -m soakd ...`` server on a free loopback port, ready once a
URL answers 200, polled through tenacity; a child that exits first fails the spawn at once
with the log's tail. ``Child.aclose`` stops it: SIGTERM, 5 s, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from soakd.lifeline import die_with_parent as die_with_parent  # soakd/lifeline.py's

READY_POLL_S: Final = 0.1
STOP_GRACE_S: Final = 5.0
SOCKET_BUFFER: Final = 1 << 20
"""Each end's send and receive buffers on a ``socket_pair``."""


class SpawnError(RuntimeError):
    """A child that exited or never answered; the message says which, with its log's tail."""


class _NotReady(Exception):
    """The child runs but does not answer 200 yet: poll again."""


@dataclass
class Backoff:
    """How long to wait before a dead child is started again: ``first_s`` after one that
    lived ``steady_s``, else twice the last wait, up to ``max_s``; a start that fails
    doubles it too. One per child; ``delay_s`` is the last wait."""

    first_s: float = 0.25
    max_s: float = 30.0
    steady_s: float = 60.0
    delay_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.delay_s = self.first_s / 2  # the first death waits first_s

    def died(self, lived_s: float) -> float:
        """The wait after a child that lived ``lived_s`` died."""
        steady = lived_s >= self.steady_s
        self.delay_s = self.first_s if steady else min(self.max_s, self.delay_s * 2)
        return self.delay_s

    def failed(self) -> float:
        """The wait after a start that failed."""
        self.delay_s = min(self.max_s, self.delay_s * 2)
        return self.delay_s


def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` with soakd's own interpreter."""
    return [sys.executable, "-m", module, *args]


def socket_pair(buffer: int = SOCKET_BUFFER) -> tuple[socket.socket, socket.socket]:
    """Two connected stream sockets, ``buffer`` bytes of send and receive buffer each:
    one for soakd, one for the child (its fd passed to it)."""
    pair = socket.socketpair()
    for s in pair:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return pair


def start_module(
    module: str, *args: str, log_path: Path, pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """``python -m MODULE ARGS`` from a plain thread, its output appended to ``log_path``.
    No ``preexec_fn`` (not safe while other threads run): a child that must die with soakd
    calls ``die_with_parent`` itself, given soakd's pid in ``args``."""
    with log_path.open("ab") as log_file:
        return subprocess.Popen(  # noqa: S603  # soakd's own module, no input
            module_command(module, *args),
            pass_fds=tuple(pass_fds),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
        )


async def spawn_module(
    module: str,
    *args: str,
    log_path: Path,
    pass_fds: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
    tie: bool = False,
) -> asyncio.subprocess.Process:
    """``python -m MODULE ARGS`` from the event loop, its output appended to ``log_path``;
    ``tie``: it gets SIGTERM when soakd dies (set between fork and exec)."""
    with log_path.open("ab") as log_file:
        return await asyncio.create_subprocess_exec(
            *module_command(module, *args),
            pass_fds=tuple(pass_fds),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=None if env is None else dict(env),
            preexec_fn=die_with_parent if tie else None,
        )


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The child's exit code within ``timeout_s``, else None. Waits on a pidfd with
    ``poll``'s relative timeout rather than ``Popen.wait``'s sleep loop: the
    clock_nanosleep behind ``time.sleep`` fails (EINVAL) after a wall-clock step under
    libfaketime, which the clock fault tests preload, and it killed the waiting thread."""
    code = proc.poll()
    if code is not None:
        return code
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # reaped meanwhile (ESRCH), or no pidfd: Popen.wait's loop
        try:
            return proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, OSError):
            return proc.poll()
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(round(timeout_s * 1000))
    finally:
        os.close(fd)
    return proc.poll()


def reap(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """Wait up to ``grace_s`` for the child to exit, then SIGKILL it; its exit code."""
    code = wait_exit(proc, grace_s)
    if code is None:
        proc.kill()
        code = wait_exit(proc, 10.0)
    return code


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
    # tie: a SIGKILLed soakd leaves no child behind
    proc = await spawn_module("soakd", *args, log_path=log_path, env=env, tie=True)
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
