"""Child log room: log events of code that also runs in soakd's small child processes.

The NVML sampler and the journal writer run in processes of their own that must stay small
(structlog and rich alone are ~16 MB). Their code logs through ``ChildLog``: in soakd's own
process (and in tests) an event goes to structlog as before; in a child, ``forward_to``
sends each event to a callable (the child writes it to the parent, which logs it with
``relog``), so the run's log holds the child's events with the parent's context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Forward = Callable[[str, str, dict[str, Any]], None]
"""(level, event, fields)."""

_forward: Forward | None = None


def forward_to(sink: Forward) -> None:
    """In a child process: every ChildLog event goes to ``sink`` from now on."""
    global _forward
    _forward = sink


class ChildLog:
    """``info``/``warning``/``error``/``exception`` with structlog's signature."""

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if _forward is not None:
            _forward(level, event, fields)
            return
        import structlog  # soakd's own process has it loaded already

        getattr(structlog.get_logger(), level)(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        import traceback

        self._emit("error", event, {**fields, "exception": traceback.format_exc()})


LEVELS = frozenset({"info", "warning", "error"})


def relog(level: str, event: str, fields: dict[str, Any], **context: Any) -> None:
    """In the parent: log a child's event as if it were its own (an unknown level: error)."""
    import structlog

    log = structlog.get_logger()
    getattr(log, level if level in LEVELS else "error")(event, **fields, **context)
