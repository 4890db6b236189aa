"""The run's interface: what ``Soak`` is given (``RunOptions``) and gives back
(``RunResult``), and the one error a start-up can end in (``StartError``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from soakd.measure.analysis import SessionRow

if TYPE_CHECKING:
    from soakd.model import Phase
    from soakd.types import Target
    from soakd.workload.fits import Longest

log = structlog.get_logger()


SweepHook = Callable[
    ["Phase", Mapping[str, "Target"], Mapping[str, str], float, Path], Awaitable[None]
]
"""A ``mode: sweep`` phase begun: (the phase, its targets' clients, each target's server
URL, the phase's end as ``time.monotonic()``, the run dir); soakd/capacity/ gives it
(docs/capacity.md)."""


@dataclass(frozen=True)
class RunOptions:
    run_dir: Path | None = None
    duration_s: float | None = None
    rehearse_s: float | None = None
    metrics_addr: str | None = None  # HOST:PORT, overrides exporter.listen
    live: bool = False  # draw the live view on the terminal
    console_logs: bool = True
    force: bool = False  # resume even though the config differs from the journal's
    # ask each target once before the journal opens (soakd/targets/preflight.py); on in
    # `soakd run` unless --no-preflight, off here: a test counting what a server saw
    # asks for it
    preflight: bool = False
    on_sweep: SweepHook | None = None  # mode: sweep phases (None: they idle)
    # the plan's longest request, as the start check found it (None: made again here):
    # held against the contexts the targets' models lists say (soakd/workload/fits.py)
    longest: Longest | None = None


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    completed: bool  # the plan ran to its end (not stopped by a signal)
    elapsed_s: float
    cancelled: int  # requests cut at the drain deadline
    summary: dict[str, SessionRow] = field(default_factory=dict)  # this session only
    session: int = 1  # 2 and up: a resumed run
    journal_unwritten: int = 0  # records the journal's final write could not keep at all


async def _close_all(what: str, closes: list[Coroutine[Any, Any, None]]) -> None:
    """Close these together; one that fails is logged and the others still close."""
    for result in await asyncio.gather(*closes, return_exceptions=True):
        if isinstance(result, Exception):
            log.warning("close_failed", what=what, error=f"{type(result).__name__}: {result}")


class StartError(Exception):
    """A child soakd starts (a simulator, a gateway) did not come up. ``str()`` is one
    line naming the target's field; the CLI prints it and exits 2, with no traceback."""

    def __init__(self, where: str, cause: Exception) -> None:
        why = " ".join(str(cause).split())  # the child's log tail, on one line
        super().__init__(f"{where}: {why[:400]}")


class StoppedBeforeStart(Exception):
    """A signal came before the journal opened: nothing was recorded, no run to resume."""
