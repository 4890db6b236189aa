"""Logs: structlog set-up. JSON lines off a terminal (and always in the run's log file).

Context (run id, target) is bound through contextvars. The phase is not: a task outlives
the phase it was born in (a closed-loop worker, a probe), and a contextvar copied at its
birth would stamp its lines with that old phase. ``set_phase`` sets the one current phase
and every line reads it when it is written. Nothing here ever formats a secret: keys live
in SecretStr and never reach an event.

Bounded for a 72 h run: a line about a target (one with a ``target`` key) that repeats,
the same event for the same target, is written once per ``REPEAT_WINDOW_S``; the repeats
in that window are counted and summarised in one ``log_repeated`` line ("N more like this
in the last 10 s") when the window closes (``flush_repeats``, called by the run's tick and
at close). The run's log file rotates at ``LOG_MAX_BYTES`` (``soakd.log.1``, ``.2``, ...,
``LOG_BACKUPS`` kept), so it never holds more than about (1 + LOG_BACKUPS) x LOG_MAX_BYTES.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any, Final, TextIO, cast

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
REPEAT_WINDOW_S: Final = 10.0
REPEATED: Final = "log_repeated"
LOG_MAX_BYTES: Final = 64 * 2**20
LOG_BACKUPS: Final = 3


class LogFile:
    """The run's log file, rotated at ``max_bytes`` (``NAME.1`` the newest old one).
    A write that fails (disk full, read-only) is counted in ``dropped_lines``, never raised."""

    def __init__(
        self, path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS
    ) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._f: IO[str] | None = path.open("a", encoding="utf-8")
        try:
            self._size = path.stat().st_size if path.is_file() else 0
        except OSError:
            self._size = 0

    @property
    def closed(self) -> bool:
        return self._f is None or self._f.closed

    def write(self, line: str) -> None:
        global dropped_lines
        if self._f is None or self._f.closed:
            return
        try:
            if self._size and self._size + len(line) + 1 > self.max_bytes:
                self._size = size = self.path.stat().st_size  # logrotate may have truncated it
                if size and size + len(line) + 1 > self.max_bytes:
                    self._rotate()
            self._f.write(line + "\n")
            self._f.flush()
            self._size += len(line) + 1  # characters: bytes for the ASCII JSON writes
        except OSError:  # a full or read-only disk must not stop the caller
            dropped_lines += 1

    def _rotate(self) -> None:
        assert self._f is not None
        self._f.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups > 0:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self._f = self.path.open("a", encoding="utf-8")
        self._size = 0

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None


class Repeats:
    """A structlog processor: the first line of an (event, target) in a window is written,
    the rest are counted and dropped; ``due`` hands out the summaries of closed windows.
    Memory: one entry per (event, target) seen in the last window."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._open: dict[tuple[str, str], list[Any]] = {}  # key -> [start, repeats, level]
        self.emit: Callable[[dict[str, Any]], None] | None = None  # where a summary goes

    def __call__(
        self, _: Any, name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        target, kind = event.get("target"), event.get("event")
        if target is None or kind == REPEATED:
            return event
        key = (str(kind), str(target))
        now = self._clock()
        window = self._open.get(key)
        if window is not None and now - window[0] < self.window_s:
            window[1] += 1
            raise structlog.DropEvent
        if window is not None and window[1]:
            self._summarise(key, window, now)
        self._open[key] = [now, 0, name]
        return event

    def due(self, everything: bool = False) -> None:
        """Summarise the windows that have closed (``everything``: all, at the end)."""
        now = self._clock()
        for key, window in list(self._open.items()):
            if everything or now - window[0] >= self.window_s:
                del self._open[key]
                if window[1]:
                    self._summarise(key, window, now)

    def _summarise(self, key: tuple[str, str], window: list[Any], now: float) -> None:
        start, count, level = window
        seconds = max(1, round(now - start))
        if self.emit is not None:
            self.emit(
                {
                    "level": level,
                    "of": key[0],
                    "target": key[1],
                    "count": count,
                    "window_s": seconds,
                    "message": f"{count} more like this in the last {seconds} s",
                }
            )


_file: LogFile | None = None
_repeats: Repeats | None = None
_phase: str | None = None


def set_phase(name: str | None) -> None:
    """The phase running now (None: before the first, or draining after the last)."""
    global _phase
    _phase = name


def _add_phase(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if _phase is not None:
        event.setdefault("phase", _phase)
    return event


dropped_lines = 0
"""Log lines the run's log file could not take (disk full, read-only): the console and
the metrics go on; the journal's own errors say what happened to the disk."""


def flush_repeats(everything: bool = False) -> None:
    """Write the ``log_repeated`` summaries of the windows that have closed."""
    if _repeats is not None:
        _repeats.due(everything)


class _Stderr:
    """``sys.stderr`` as it is when a line is written, not when logging was set up: a
    process that swaps it (pytest's capture, several runs in one process) never leaves the
    log writing to a stream closed since."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def close_logging() -> None:
    """Close the run's log file (the end of a run; tests run several in one process)."""
    global _file
    set_phase(None)
    flush_repeats(everything=True)
    if _file is not None:
        _file.close()
        _file = None


def setup_logging(
    level: str = "info",
    fmt: str = "auto",
    log_file: Path | None = None,
    console: bool = True,
    *,
    max_bytes: int = LOG_MAX_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Configure structlog once per process.

    ``fmt``: json, console, or auto (console on a terminal, JSON otherwise). The log
    file, when given, always gets JSON lines. ``console=False`` keeps stderr quiet
    (the live view owns the terminal then). ``clock`` times the repeat windows."""
    stream = sys.stderr
    pretty = fmt == "console" or (fmt == "auto" and stream.isatty())
    global _file, _repeats
    close_logging()
    file = _file = LogFile(log_file, max_bytes) if log_file is not None else None
    repeats = _repeats = Repeats(clock=clock)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        repeats,
        _add_phase,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    json_renderer = structlog.processors.JSONRenderer()
    console_renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())

    def render(logger: Any, name: str, event: MutableMapping[str, Any]) -> str:
        line = json_renderer(logger, name, dict(event))
        if file is not None:
            file.write(str(line))
        if not console:
            raise structlog.DropEvent
        return str(console_renderer(logger, name, event) if pretty else line)

    def emit(summary: dict[str, Any]) -> None:
        level_no = _LEVELS.get(summary.pop("level"), logging.INFO)
        structlog.get_logger().log(level_no, REPEATED, **summary)

    repeats.emit = emit
    structlog.configure(
        processors=[*shared, render],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # print() needs only write and flush: _Stderr has them
        logger_factory=structlog.PrintLoggerFactory(cast("TextIO", _Stderr())),
        cache_logger_on_first_use=False,
    )
