"""soakd/runtime.py: the process set-up of soakd run and its workers (malloc arenas, the
periodic malloc_trim that hands glibc's kept pages back, the GIL switch interval)."""

from __future__ import annotations

import os
import sys

import pytest

from soakd import runtime


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
    assert runtime.trim() is True
    assert before - _rss() > 32 << 20  # at least half of what was freed went back
    assert len(kept) == 256


def test_no_trimming_thread_when_switched_off() -> None:
    assert runtime.start_trimming(0) is None


def test_no_trimming_thread_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert runtime.start_trimming() is None
    assert runtime.trim() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_trimming_thread_is_a_daemon() -> None:
    thread = runtime.start_trimming(3600)  # its first trim would be an hour away
    assert thread is not None
    assert thread.daemon  # never keeps the process alive
    assert thread.is_alive()


def test_the_loop_gets_the_gil_back_within_half_a_millisecond() -> None:
    before = sys.getswitchinterval()
    try:
        runtime.favour_the_loop()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
