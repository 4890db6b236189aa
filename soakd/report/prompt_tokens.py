"""Report room, prompt tokens: planned against served prompt tokens per target.

Planned is what the prompt source drew for each request's seq (rebuilt from the stored
config: it depends on the seed and the length distribution only); served is the server's
``usage.prompt_tokens`` of the same request. Both come from the journaled rows of
successful requests that report usage, paired one for one. The sizing soakd used
(``prompt_calibration`` events, soakd/workload/sizing.py) is said beside them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence

from pydantic import ValidationError

from soakd.config import TokenLength
from soakd.journal.records import (
    CalibrationStage,
    Logged,
    PromptCalibration,
    Unreadable,
    of_kind,
)
from soakd.journal.stored import StoredWorkload
from soakd.report.model import PromptTokens, Report
from soakd.report.table import Table, fmt_mean, planned_table
from soakd.workload.calibration import Calibration
from soakd.workload.datasets import stored_source
from soakd.workload.prompts import SyntheticPrompts, fixed_length
from soakd.workload.sizing import WARN_SHARE, stored


def prompt_tokens(
    conn: sqlite3.Connection,
    workload: StoredWorkload,
    events: Sequence[Logged],
    targets: list[str],
) -> tuple[list[PromptTokens], str | None]:
    """Per target, planned against served; and how the prompts were sized (None: no
    synthetic prompts, or a journal from before calibration)."""
    planned = _planner(workload)
    sizings = list(of_kind(events, PromptCalibration))
    at_start: Mapping[str, float] = {}
    for e in sizings:
        if isinstance(e, PromptCalibration) and e.stage is CalibrationStage.START:
            at_start = e.served if isinstance(e.served, Mapping) else {}
    rows = []
    for target in targets:
        n, planned_sum, served_sum = _pairs(conn, target, planned)
        rows.append(
            PromptTokens(
                target,
                n,
                planned_sum / n if n and planned is not None else None,
                served_sum / n if n else None,
                at_start.get(target),
            )
        )
    return rows, _sizing(workload, sizings)


def _pairs(
    conn: sqlite3.Connection, target: str, planned: Callable[[int], int] | None
) -> tuple[int, float, float]:
    """(pairs, planned sum, served sum) over the target's journaled answers with usage."""
    where = "target = ? AND error IS NULL AND prompt_tokens > 0"
    if planned is None:
        n, served = conn.execute(
            f"SELECT COUNT(*), TOTAL(prompt_tokens) FROM requests WHERE {where}",  # noqa: S608
            (target,),
        ).fetchone()
        return int(n), 0.0, float(served)
    n = 0
    planned_sum = served_sum = 0.0
    for seq, served in conn.execute(
        f"SELECT seq, prompt_tokens FROM requests WHERE {where}",  # noqa: S608
        (target,),
    ):
        n += 1
        planned_sum += planned(seq)
        served_sum += served
    return n, planned_sum, served_sum


def _planner(workload: StoredWorkload) -> Callable[[int], int] | None:
    """Planned tokens by seq, from the stored config (None: cannot be rebuilt, e.g. a
    prompt file no longer there; conversations, whose turns' context holds the answers
    served: no seq's plan is theirs)."""
    if workload.conversations is not None:
        return None
    prompts = workload.prompts
    if prompts.source != "synthetic":
        source = stored_source(prompts, workload.seed, workload.tokenizer)
        return None if source is None else source.length
    try:
        lengths = TokenLength.model_validate(prompts.input_tokens.model_dump())
    except ValidationError:
        return None
    if lengths.dist == "fixed":
        n = fixed_length(lengths)
        return lambda _seq: n
    return SyntheticPrompts(lengths, workload.seed).length


def _sizing(
    workload: StoredWorkload, sizings: Sequence[PromptCalibration | Unreadable]
) -> str | None:
    """How the prompts were sized, in a line."""
    if workload.prompts.source == "file":
        return None
    if workload.calibrate == "off":
        return "not sized (workload.calibrate off): a word a token"
    if not sizings:
        return None
    try:
        cals = stored(sizings).calibrations
    except ValueError:
        return "sized as the journal says, which could not be read"
    if not cals:
        return "not sized: no tokenizer, no /tokenize and no usage to size them by"
    return "sized by " + "; then ".join(_one(c) for c in cals)


def _one(cal: Calibration) -> str:
    where = f" (from seq {cal.from_seq})" if cal.from_seq else ""
    return cal.describe() + where


def prompt_notes(rows: Sequence[PromptTokens], sizing: str | None) -> list[str]:
    """A note per target whose served prompt tokens are off the plan by more than 10 %."""
    out = []
    for r in rows:
        off = r.off
        if off is None or abs(off) <= WARN_SHARE or r.planned is None or r.served is None:
            continue
        out.append(
            f"{r.target}: {r.served:,.1f} prompt tokens a request by its own count, where "
            f"the plan said {r.planned:,.1f} ({off * 100:+.1f} %)"
            + (f"; prompts {sizing}" if sizing else "")
        )
    return out


def prompt_table(rep: Report) -> Table | None:
    """Planned against served prompt tokens, one row per target."""
    rows = rep.prompt_tokens
    if not rows or not any(r.requests or r.at_start is not None for r in rows):
        return None
    title = "Prompt tokens: planned against served"
    if rep.prompt_sizing:
        title += f" (prompts {rep.prompt_sizing})"
    return planned_table(title, rows, ("at start", True), [fmt_mean(r.at_start) for r in rows])
