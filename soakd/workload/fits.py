"""Workload, fits: the plan's longest request against each target's context.

A request whose prompt and answer are more tokens than the model's context
(``max_model_len``) is refused by the server (vLLM: 400, "maximum context length"); a plan
that holds such requests measures refusals, not the server, and says so only in its error
counts, hours later. The longest request the plan can make is known before the first send
(a distribution's top, a file's longest record), and so is each target's context (its
config's ``max_model_len``, else what its models list said at the start), so the run stops
before the journal opens, with one line naming the target and where the length comes from.

A conversation's context grows with the answers its server gives: only its first turn is
known before the run, so conversations are checked turn 0 alone (a later turn past the
context is the server's refusal, counted by turn: docs/workloads.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from soakd.config import ConfigError
from soakd.workload.answers import workload_answers
from soakd.workload.prompts import PromptSource, Records, fixed_length

if TYPE_CHECKING:
    from soakd.config import Config, Workload


@dataclass(frozen=True, slots=True)
class Longest:
    """The plan's longest request: prompt and answer tokens, and where each comes from."""

    prompt: int
    answer: int
    prompt_from: str
    answer_from: str

    @property
    def tokens(self) -> int:
        return self.prompt + self.answer

    def words(self) -> str:
        """Where the length comes from, for the line that names it."""
        if self.prompt_from == self.answer_from:  # a file's record
            return (
                f"{self.prompt_from}, a prompt of {self.prompt:,} and an answer of {self.answer:,}"
            )
        return (
            f"a prompt of up to {self.prompt:,} ({self.prompt_from}) and an answer of up to "
            f"{self.answer:,} ({self.answer_from})"
        )


def longest_request(workload: Workload, source: PromptSource) -> Longest:
    """The longest request ``workload`` plans with its prompts made (``source``): a
    distribution's top, or a file's longest record with its planned answer; conversations
    their first turn (their user turn's top)."""
    answers = workload_answers(workload, source)
    if workload.conversations is not None:
        d = workload.conversations.user_tokens
        top = fixed_length(d) if d.dist == "fixed" else d.max
        return Longest(
            top,
            workload.longest_answer,
            "workload.conversations.user_tokens",
            _answer_from(workload),
        )
    if isinstance(source, Records):
        best, at = -1, 0
        for seq in range(len(source)):
            n = source.length(seq) + ((answers(seq) if answers else None) or workload.max_tokens)
            if n > best:
                best, at = n, seq
        answer = (answers(at) if answers else None) or workload.max_tokens
        where = f"workload.prompts.file: {source.label(source.record_of(at))}"
        return Longest(best - answer, answer, where, where)
    d = workload.prompts.input_tokens
    top = fixed_length(d) if d.dist == "fixed" else d.max
    return Longest(
        top, workload.longest_answer, "workload.prompts.input_tokens", _answer_from(workload)
    )


def _answer_from(workload: Workload) -> str:
    return (
        "workload.prompts.output_tokens"
        if workload.prompts.output_tokens
        else "workload.max_tokens"
    )


def check_fits(cfg: Config, longest: Longest, said: Mapping[str, int | None]) -> None:
    """ConfigError, one line a target, for each target whose context (its config's
    ``max_model_len``, else ``said``: its models list's at the start) is shorter than the
    plan's longest request."""
    problems = []
    for i, t in enumerate(cfg.targets):
        context = t.max_model_len or said.get(t.name)
        if context is None or longest.tokens <= context:
            continue
        given = f"targets[{i}].max_model_len" if t.max_model_len else f"{t.name}'s models list"
        problems.append(
            f"targets[{i}] ({t.name}): its context is {context:,} tokens ({given}), but the "
            f"plan's longest request is {longest.tokens:,}: {longest.words()}; shorten them, "
            f"or set targets[{i}].max_model_len if the server takes more"
        )
    if problems:
        raise ConfigError.of(problems)
