"""Test helper room: a conversations run's journal read turn by turn, against its plan.

One conversation at a time (closed loop of 1) with a fixed number of turns, so the turns of
conversation ``k`` are seqs ``k * turns .. k * turns + turns - 1``; a turn's planned context
is the plan's user turns so far plus the answers the server gave before it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from soakd.config import Workload
from soakd.workload.conversations import make_conversations

Row = tuple[int, int, int, str | None]  # seq, prompt tokens, output tokens, error


def by_turn(run: Path, workload: Workload, turns: int) -> tuple[list[Row], list[int], list[int]]:
    """The journal's rows, and per turn index the planned and the served prompt tokens."""
    plan = make_conversations(workload)
    assert plan is not None
    with sqlite3.connect(run / "journal.db") as db:
        rows: list[Row] = db.execute(
            "SELECT seq, prompt_tokens, output_tokens, error FROM requests ORDER BY seq"
        ).fetchall()
    planned, served, context = [0] * turns, [0] * turns, 0
    for seq, prompt, output, _ in rows:
        conv, turn = divmod(seq, turns)
        context = (context if turn else 0) + plan.user_tokens(conv, turn)
        planned[turn] += context
        served[turn] += prompt
        context += output
    return rows, planned, served
