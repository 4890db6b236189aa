"""Report room, output tokens: planned answer lengths against the answers served, per target.

Planned is the length soakd/workload/answers.py gave each request's seq (rebuilt from the
stored config: a prompt file's line, else a draw from ``workload.prompts.output_tokens`` by
the seed); served is the request's output tokens (the server's usage, else the stream's
count). Both come from the journaled rows of successful requests whose length was planned
and counted, paired one for one. How each target was asked to serve them
(``targets[].planned_output``) is said beside them: asked with max_tokens alone, an answer
may end at its own EOS, short of the plan.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from soakd.config import TokenLength
from soakd.journal.stored import StoredConfig, StoredWorkload
from soakd.report.model import OutputTokens, Report
from soakd.report.table import Table, planned_table
from soakd.workload.answers import answer_lengths, asked_as
from soakd.workload.datasets import stored_source
from soakd.workload.prompts import describe_lengths
from soakd.workload.sizing import WARN_SHARE

_ASKED = {
    "ignore_eos": "ignore_eos",
    "min_tokens": "min_tokens",
    "none": "max_tokens alone (may end early)",
}
"""How a target was asked, as the report words it (``targets[].planned_output``)."""


class Answers:
    """The planned answer lengths of a stored run, rebuilt once for the report."""

    def __init__(self, workload: StoredWorkload) -> None:
        self.planned: Callable[[int], int | None] | None = None
        self.described: str | None = None  # "uniform 16-64", "file lines', else fixed 32"
        prompts = workload.prompts
        lengths: TokenLength | None = None
        if prompts.output_tokens is not None:
            try:
                lengths = TokenLength.model_validate(prompts.output_tokens.model_dump())
            except ValidationError:
                return
        if workload.conversations is not None and (lengths is None or lengths.dist != "fixed"):
            return  # a conversation's answers are drawn by (conversation, turn), not by seq
        source = None
        if prompts.source != "synthetic":
            source = stored_source(prompts, workload.seed, workload.tokenizer)
            if source is None:
                return  # a prompt file no longer there: its lines' lengths are unknown
        answers = answer_lengths(lengths, workload.seed, source)
        if answers is None:
            return
        self.planned = answers
        shown = [] if source is None or not source.plans_outputs else ["the file's lines'"]
        if lengths is not None:
            shown.append(describe_lengths(lengths))
        self.described = ", else ".join(shown)


def asked(config: StoredConfig, target: str) -> str:
    """How ``target`` was asked to serve planned lengths (as configured, or by its address)."""
    t = config.target(target)
    if t is None:
        return "none"
    return asked_as(t.planned_output, t.base_url, t.simulator, t.kind)


def asked_words(mode: str, *, short: bool = False) -> str:
    """``mode`` as the report words it (``short``: without the warning)."""
    if short and mode == "none":
        return "max_tokens alone"
    return _ASKED.get(mode, mode)


def output_tokens(
    conn: sqlite3.Connection, config: StoredConfig, answers: Answers, targets: list[str]
) -> list[OutputTokens]:
    """Per target, planned against served (empty: no answer length was planned, or the
    plan cannot be rebuilt)."""
    planned = answers.planned
    if planned is None:
        return []
    rows = []
    for target in targets:
        n, planned_sum, served_sum = _pairs(conn, target, planned)
        rows.append(
            OutputTokens(
                target,
                n,
                planned_sum / n if n else None,
                served_sum / n if n else None,
                asked(config, target),
            )
        )
    return rows


def _pairs(
    conn: sqlite3.Connection, target: str, planned: Callable[[int], int | None]
) -> tuple[int, int, int]:
    """(pairs, planned sum, served sum) over the target's journaled answers that were
    planned and whose output tokens are known."""
    n = planned_sum = served_sum = 0
    for seq, served in conn.execute(
        "SELECT seq, output_tokens FROM requests "
        "WHERE target = ? AND error IS NULL AND output_tokens IS NOT NULL",
        (target,),
    ):
        p = planned(seq)
        if p is None:
            continue
        n += 1
        planned_sum += p
        served_sum += served
    return n, planned_sum, served_sum


def output_notes(rows: Sequence[OutputTokens]) -> list[str]:
    """A note per target whose answers are off their planned lengths by more than 10 %."""
    out = []
    for r in rows:
        off = r.off
        if off is None or abs(off) <= WARN_SHARE or r.planned is None or r.served is None:
            continue
        if r.asked_with == "none":
            why = (
                "asked with max_tokens alone (targets[].planned_output: none), an answer ends "
                "at its own EOS: set planned_output to ignore_eos (vLLM, llama.cpp, SGLang) "
                "or min_tokens (vLLM) where the server honours it"
            )
        else:
            why = (
                f"asked with {r.asked_with}: a server that ignores it (a cloud endpoint), a "
                "context too short for the plan or extra_body's own max_tokens ends answers "
                "elsewhere"
            )
        out.append(
            f"{r.target}: {r.served:,.1f} output tokens an answer, where the plan said "
            f"{r.planned:,.1f} ({off * 100:+.1f} %); {why}"
        )
    return out


def output_table(rep: Report) -> Table | None:
    """Planned against served output tokens, one row per target (None: none planned)."""
    rows = rep.output_tokens
    if not rows:
        return None
    asked_with = [asked_words(r.asked_with) for r in rows]
    return planned_table(
        "Output tokens: planned against served", rows, ("asked with", False), asked_with
    )
