"""soakd/_malloc.py: the periodic malloc_trim that hands glibc's kept pages back."""

from __future__ import annotations

import sys

import pytest

from soakd import _malloc


def test_trim_answers_whether_memory_went_back() -> None:
    assert _malloc.trim() in (True, False)


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
