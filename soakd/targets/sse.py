"""Targets room, SSE: a pure, incremental Server-Sent Events decoder (bytes in, data out).

Network chunks split the stream anywhere: inside a line, a CRLF pair or a UTF-8
character. The decoder keeps the unfinished line as bytes and only decodes complete
``data:`` lines, so a split never corrupts text. It works line by line with
``bytes.split`` (no per-byte Python loop): this is the per-token hot path.

Deliberate departures from the WHATWG parser, for a measuring client: ``event:``,
``id:`` and ``retry:`` are ignored (OpenAI streams only use ``data:``), invalid
UTF-8 is an error rather than U+FFFD (a corrupted chunk must be counted), and
``close()`` flushes a final event that lacks its blank line instead of dropping it.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_LINE", "SSEDecodeError", "SSEDecoder", "SSEError", "SSELineTooLong"]

DEFAULT_MAX_LINE = 1 << 20
"""Longest line accepted, in bytes without its line end (1 MiB)."""

_BOM = b"\xef\xbb\xbf"


class SSEError(Exception):
    """The stream cannot be decoded further. ``events`` holds the payloads completed
    in the same ``feed`` before the failure, so the caller still counts what arrived."""

    def __init__(self, message: str, events: list[str] | None = None) -> None:
        super().__init__(message)
        self.events: list[str] = events if events is not None else []


class SSEDecodeError(SSEError):
    """A ``data:`` line is not valid UTF-8."""


class SSELineTooLong(SSEError):
    """A line grew past the decoder's limit (a runaway or hostile server)."""


class SSEDecoder:
    """Feed raw body bytes, get the ``data`` payloads of completed events.

    Multi-line data is joined with ``"\\n"``; an event without any ``data:`` line
    (comments, keep-alive blank lines, ``event:``-only blocks) yields nothing. After
    an ``SSEError`` the decoder's state is undefined: stop feeding it.
    """

    __slots__ = (
        "_after_cr",
        "_at_start",
        "_data",
        "_data_len",
        "_max_line",
        "_pending",
        "_pending_len",
    )

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be at least 1, got {max_line}")
        self._max_line = max_line
        self._pending: list[bytes] = []  # pieces of the line not yet ended
        self._pending_len = 0
        self._data: list[bytes] = []  # data lines of the event not yet dispatched
        self._data_len = 0  # their bytes: an event never ended grows no further than a line
        self._after_cr = False  # the last chunk ended in CR: a leading LF belongs to it
        self._at_start = True  # a BOM may still start the first line

    def feed(self, data: bytes) -> list[str]:
        """Add a chunk; return the payloads of the events it completed, in order."""
        if not data:
            return []
        if self._after_cr:
            self._after_cr = False
            if data[0] == 0x0A:
                data = data[1:]
                if not data:
                    return []
        if b"\r" in data:
            # CR never survives into a line: a trailing CR ends its line now, and a LF
            # starting the next chunk is then the second half of that CRLF.
            self._after_cr = data[-1] == 0x0D
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        if len(lines) == 1:  # no line end: the chunk continues the current line
            self._pending.append(data)
            self._pending_len += len(data)
            if self._pending_len > self._max_line:
                raise SSELineTooLong(self._too_long())
            return []
        check = self._pending_len + len(data) > self._max_line  # else no line can be too long
        if self._pending:
            self._pending.append(lines[0])
            lines[0] = b"".join(self._pending)
            self._pending = []
        tail = lines.pop()
        self._pending_len = len(tail)
        if tail:
            self._pending.append(tail)
        events = self._lines(lines, check)
        if self._pending_len > self._max_line:
            raise SSELineTooLong(self._too_long(), events)
        return events

    def close(self) -> list[str]:
        """End of stream: flush a last line without its line end and a last event
        without its blank line (servers that end on ``data: [DONE]`` alone)."""
        lines = [b"".join(self._pending), b""] if self._pending else [b""]
        self._pending = []
        self._pending_len = 0
        self._after_cr = False
        return self._lines(lines, False)

    def _lines(self, lines: list[bytes], check: bool) -> list[str]:
        """Interpret complete lines (without line ends)."""
        if self._at_start and lines:
            self._at_start = False
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][3:]
        events: list[str] = []
        data = self._data
        size = self._data_len
        for line in lines:
            if not line:  # blank line: dispatch
                if data:
                    events.append(self._emit(data, events))
                    data.clear()
                size = 0
            elif check and len(line) > self._max_line:
                raise SSELineTooLong(self._too_long(), events)
            elif line.startswith(b"data"):
                if line.startswith(b"data: "):
                    data.append(line[6:])
                elif line.startswith(b"data:"):
                    data.append(line[5:])
                elif line == b"data":
                    data.append(b"")
                else:
                    continue  # "dataX...": an unknown field
                # Short data lines without a blank line between them (a hostile server)
                # would grow one event without end: the event obeys the line limit too.
                size += len(line)
                if size > self._max_line:
                    raise SSELineTooLong(f"SSE event longer than {self._max_line} bytes", events)
            # Else a comment (":..."), event/id/retry, or an unknown field: ignored.
        self._data_len = size
        return events

    def _emit(self, data: list[bytes], events: list[str]) -> str:
        raw = data[0] if len(data) == 1 else b"\n".join(data)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            # The message names the position only: never echo stream content.
            raise SSEDecodeError(
                f"SSE data is not valid UTF-8 (byte {exc.start} of the event)", events
            ) from None

    def _too_long(self) -> str:
        return f"SSE line longer than {self._max_line} bytes"
