"""Lifeline room: a child of soakd dies with soakd, even when soakd is SIGKILLed.

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel sends the child SIGTERM
when the thread that started it exits. Two ways to set it, one function:

- as a ``preexec_fn`` (between fork and exec, no argument): for soakd's children started
  from the event loop before other threads run (``soakd.spawn.spawn_module(tie=True)``);
- in the child itself, first thing after exec, with the parent's pid (``parent``): for a
  child started from a thread of a process that runs others (the journal's writer, started
  by the link thread), where a ``preexec_fn`` is not safe. A parent gone before the signal
  was set cannot send it: the child sees another parent and exits at once.

Standard library only (no asyncio): the journal's writer process imports it (~19 MB).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Final

PR_SET_PDEATHSIG: Final = 1


def die_with_parent(parent: int | None = None) -> None:
    """SIGTERM when the parent dies, even by SIGKILL (Linux); ``parent``: the parent's pid,
    when called in the child after exec (gone already: exit now)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        sys.exit(0)
