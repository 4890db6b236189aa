"""soakd/_malloc.py: the periodic malloc_trim that hands glibc's kept pages back."""

from __future__ import annotations

import os
import sys

import pytest

from soakd import _malloc


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_trim_hands_back_the_pages_freed_below_the_heap_top() -> None:
    # 64 MiB in 4 KiB blocks (glibc's heap, not pymalloc's arenas), one in 64 kept: the
    # freed blocks sit below live ones, where free() alone never returns them
    blocks = [bytearray(4096) for _ in range(16384)]
    kept = blocks[::64]
    del blocks
    before = _rss()
    assert _malloc.trim() is True
    assert before - _rss() > 32 << 20  # at least half of what was freed went back
    assert len(kept) == 256


def test_no_trimming_thread_when_switched_off() -> None:
    assert _malloc.start_trimming(0) is None


def test_no_trimming_thread_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _malloc.start_trimming() is None
    assert _malloc.trim() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_trimming_thread_is_a_daemon() -> None:
    thread = _malloc.start_trimming(3600)  # its first trim would be an hour away
    assert thread is not None
    assert thread.daemon  # never keeps the process alive
    assert thread.is_alive()
