"""The one frame codec (soakd/framing.py): both readers, the workers' stream reader and the
journal's incremental one, read what ``frame`` wrote, and refuse a frame past their limit."""

from __future__ import annotations

import asyncio

import pytest

from soakd import framing
from soakd.journal import messages
from soakd.workers import wire


def test_frames_come_back_however_the_bytes_are_cut() -> None:
    data = framing.frame(3, b"abc", bytearray(b"de")) + framing.frame(4) + framing.frame(5, b"x")
    for cut in range(len(data) + 1):
        reader = framing.Frames(1 << 10)
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert got == [(3, b"abcde"), (4, b""), (5, b"x")]
        assert not reader.partial


async def test_the_stream_reader_reads_the_same_frames() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(framing.frame(3, b"abc") + framing.frame(4))
    reader.feed_eof()
    assert await framing.read_frame(reader, 10) == (3, b"abc")
    assert await framing.read_frame(reader, 10) == (4, b"")
    assert await framing.read_frame(reader, 10) is None


async def test_the_limit_is_each_links_own() -> None:
    big = framing.frame(1, bytes(99))  # a payload of 100 bytes with its kind
    assert framing.Frames(100).feed(big) == [(1, bytes(99))]
    with pytest.raises(framing.FrameError, match="frame of 100 bytes"):
        framing.Frames(99).feed(big)
    reader = asyncio.StreamReader()
    reader.feed_data(big)
    with pytest.raises(framing.FrameError):
        await framing.read_frame(reader, 99)
    assert wire.MAX_FRAME < messages.MAX_FRAME  # the workers' frames are split (FRAME_SPLIT)
    assert wire.WireError is framing.FrameError
