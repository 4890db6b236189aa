"""Logs: structlog set-up. JSON lines off a terminal (and always in the run's log file).

Context (run id, target) is bound through contextvars. The phase is not: a task outlives
the phase it was born in (a closed-loop worker, a probe), and a contextvar copied at its
birth would stamp its lines with that old phase. ``set_phase`` sets the one current phase
and every line reads it when it is written. Nothing here ever formats a secret: keys live
in SecretStr and never reach an event.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


_file: IO[str] | None = None
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


def close_logging() -> None:
    """Close the run's log file (the end of a run; tests run several in one process)."""
    global _file
    set_phase(None)
    if _file is not None:
        with contextlib.suppress(OSError):
            _file.close()
        _file = None


def setup_logging(
    level: str = "info",
    fmt: str = "auto",
    log_file: Path | None = None,
    console: bool = True,
) -> None:
    """Configure structlog once per process.

    ``fmt``: json, console, or auto (console on a terminal, JSON otherwise). The log
    file, when given, always gets JSON lines. ``console=False`` keeps stderr quiet
    (the live view owns the terminal then)."""
    stream = sys.stderr
    pretty = fmt == "console" or (fmt == "auto" and stream.isatty())
    global _file
    close_logging()
    file = _file = log_file.open("a", encoding="utf-8") if log_file is not None else None
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_phase,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    json_renderer = structlog.processors.JSONRenderer()
    console_renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())

    def render(logger: Any, name: str, event: MutableMapping[str, Any]) -> str:
        global dropped_lines
        line = json_renderer(logger, name, dict(event))
        if file is not None and not file.closed:
            try:
                file.write(str(line) + "\n")
                file.flush()
            except OSError:  # a full or read-only disk must not stop the caller
                dropped_lines += 1
        if not console:
            raise structlog.DropEvent
        return str(console_renderer(logger, name, event) if pretty else line)

    structlog.configure(
        processors=[*shared, render],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
