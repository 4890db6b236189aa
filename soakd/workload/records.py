"""Workload, records: a dataset file's records, found in one streaming pass and read on
demand.

A trace or a dataset may be larger than a process should hold (a 1 GB trace, once per
sender process). The first pass reads the file in chunks, hands each record to the
caller's check (which keeps what it needs: a few numbers, or nothing) and keeps each
record's byte span and line in arrays (16 bytes a record); a record is read again, when a
request needs it, with one ``pread`` of its span: the file stays in the page cache, shared by
every process and never counted in one's resident memory, as pages of a memory map are
(the kernel's read-ahead around each touched page would put most of the file there).
Every problem is a ``ConfigError`` naming the field, the file and the line.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
import re
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from soakd.config import ConfigError

WHERE: Final = "workload.prompts.file"
CHUNK: Final = 1 << 20  # bytes read at a time by the first pass
MAX_RECORD: Final = 64 << 20
"""The longest record a file may hold (64 MiB): past it a JSON array's item is taken to be
broken, not read on into memory."""

_SPACE = re.compile(r"[ \t\r\n]*")


class BadRecord(Exception):
    """What is wrong with one record (the caller's check raises it; the file and the line
    are added here)."""


class RecordFile:
    """The records of one file: ``read(i)`` gives record ``i``'s bytes, ``line(i)`` the
    line it starts on (1-based)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._starts = array("q")
        self._sizes = array("i")  # a record is at most MAX_RECORD bytes
        self._lines = array("i")
        self._fd: int | None = None

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def index_bytes(self) -> int:
        """What the index holds in memory (the arrays' buffers)."""
        arrays = (self._starts, self._sizes, self._lines)
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays)

    def add(self, start: int, end: int, line: int) -> None:
        if end - start > MAX_RECORD:
            raise _bad(
                self.path, line, f"a record of {end - start:,} bytes (at most {MAX_RECORD:,})"
            )
        self._starts.append(start)
        self._sizes.append(end - start)
        self._lines.append(line)

    def line(self, i: int) -> int:
        return self._lines[i]

    def open(self) -> None:
        """Hold the file open from its check on: a file removed or replaced afterwards is
        still the one checked (a ``pread`` needs no shared offset: a forked child may use
        it too)."""
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(f"{WHERE}: cannot read {self.path}: {exc.strerror}") from None

    def read(self, i: int) -> bytes:
        if self._fd is None:
            self.open()
        assert self._fd is not None
        return os.pread(self._fd, self._sizes[i], self._starts[i])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise ConfigError(f"{WHERE}: cannot read {path}: {exc.strerror}") from None


def _bad(path: Path, line: int, why: str) -> ConfigError:
    return ConfigError(f"{WHERE}: {path}:{line}: {why}")


def index_lines(path: Path, check: Callable[[Any, int], None], what: str = "records") -> RecordFile:
    """A JSONL file's records: each non-blank line, parsed, is given to ``check(obj, i)``
    (``i``: the record's index), which raises ``BadRecord`` for a bad one. ``what``: the
    records' name, for an empty file."""
    out = RecordFile(path)
    offset = 0
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                raise _bad(path, lineno, "not valid UTF-8") from None
            except json.JSONDecodeError as exc:
                raise _bad(path, lineno, f"not valid JSON ({exc.msg})") from None
            try:
                check(obj, len(out))
            except BadRecord as exc:
                raise _bad(path, lineno, str(exc)) from None
            out.add(start, start + len(raw.rstrip(b"\r\n")), lineno)
    if not len(out):
        raise ConfigError(f"{WHERE}: {path} holds no {what}")
    out.open()
    return out


class _Text:
    """A file decoded chunk by chunk, with the byte offset and the line of a place in it:
    what has been read past is dropped, so memory holds about one chunk (or one record)."""

    def __init__(self, f: Any, path: Path) -> None:
        self.f = f
        self.path = path
        self.dec = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.eof = False
        self.mark = 0  # a place in buf whose byte offset and line are known
        self.mark_byte = 0
        self.mark_line = 1

    def more(self) -> bool:
        """Read one more chunk; False at the end of the file."""
        if self.eof:
            return False
        data = self.f.read(CHUNK)
        try:
            self.buf += self.dec.decode(data, final=not data)
        except UnicodeDecodeError as exc:  # exc.start: in this chunk (and a partial character)
            line = self.line_at(len(self.buf)) + data[: exc.start].count(b"\n")
            raise _bad(self.path, line, "not valid UTF-8") from None
        self.eof = not data
        return True

    def advance(self, pos: int) -> int:
        """Move the mark to ``pos``; drop the text before it once there is a chunk of it.
        Where ``pos`` now is."""
        self.mark_byte += len(self.buf[self.mark : pos].encode("utf-8", "surrogatepass"))
        self.mark_line += self.buf.count("\n", self.mark, pos)
        self.mark = pos
        if pos > CHUNK:
            self.buf = self.buf[pos:]
            self.mark = pos = 0
        return pos

    def byte_at(self, pos: int) -> int:
        return self.mark_byte + len(self.buf[self.mark : pos].encode("utf-8", "surrogatepass"))

    def line_at(self, pos: int) -> int:
        return self.mark_line + self.buf.count("\n", self.mark, max(self.mark, pos))

    def skip_space(self, pos: int) -> int:
        """The first place at or after ``pos`` that is not blank (reading on as needed);
        ``len(buf)`` at the end of the file."""
        while True:
            m = _SPACE.match(self.buf, pos)
            pos = m.end() if m else pos
            if pos < len(self.buf) or not self.more():
                return pos


def index_array(path: Path, check: Callable[[Any, int], None]) -> RecordFile:
    """A JSON array's items, in one streaming pass: each item, parsed, is given to
    ``check(obj, i)``; its line is where it starts."""
    out = RecordFile(path)
    decoder = json.JSONDecoder()
    with _open(path) as f:
        text = _Text(f, path)
        pos = text.skip_space(0)
        if pos >= len(text.buf) or text.buf[pos] != "[":
            raise _bad(path, text.line_at(pos), "expected a JSON array of conversations")
        pos = text.skip_space(pos + 1)
        first = True
        while True:
            if pos >= len(text.buf):
                raise _bad(path, text.line_at(pos), "the array is not closed (a cut file?)")
            if text.buf[pos] == "]":
                break
            if not first:
                if text.buf[pos] != ",":
                    raise _bad(path, text.line_at(pos), "expected ',' or ']' after an item")
                pos = text.skip_space(pos + 1)
            pos = text.advance(pos)
            obj, end = _decode(text, decoder, pos)
            try:
                check(obj, len(out))
            except BadRecord as exc:
                raise _bad(path, text.line_at(pos), f"item {len(out)}: {exc}") from None
            out.add(text.byte_at(pos), text.byte_at(end), text.line_at(pos))
            pos = text.skip_space(end)
            first = False
        if text.skip_space(pos + 1) < len(text.buf):
            raise _bad(path, text.line_at(pos + 1), "text after the array's end")
    if not len(out):
        raise ConfigError(f"{WHERE}: {path} holds no records")
    out.open()
    return out


def _decode(text: _Text, decoder: json.JSONDecoder, pos: int) -> tuple[Any, int]:
    """The JSON value at ``pos``, reading on while it runs past what is read."""
    while True:
        try:
            return decoder.raw_decode(text.buf, pos)
        except json.JSONDecodeError as exc:
            if len(text.buf) - pos < MAX_RECORD and text.more():
                continue
            raise _bad(text.path, text.line_at(exc.pos), f"not valid JSON ({exc.msg})") from None


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """A CSV file's rows with the line each starts on (the header included)."""
    try:
        f = path.open("r", encoding="utf-8", newline="")
    except OSError as exc:
        raise ConfigError(f"{WHERE}: cannot read {path}: {exc.strerror}") from None
    with f:
        reader = csv.reader(f)
        line = 1
        try:
            for row in reader:
                yield line, row
                line = reader.line_num + 1
        except UnicodeDecodeError:
            raise _bad(path, line, "not valid UTF-8") from None
        except csv.Error as exc:
            raise _bad(path, line, f"not valid CSV ({exc})") from None
