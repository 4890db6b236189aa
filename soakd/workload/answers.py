"""Workload, answers: each request's planned answer length, and how a target is asked to
serve it whole.

A planned length depends only on (seed, seq), as a prompt does, so every target is asked
for the same answer length for the same seq (a fair A/B): a prompt file's line gives its
own (``"output_tokens"``), else ``workload.prompts.output_tokens`` draws one, else none is
planned and the request asks ``workload.max_tokens``, a cap the answer may stop short of.
A planned length is the request's ``max_tokens`` (``workload.max_tokens`` does not cap
it); a target then serves it whole when asked with ``ignore_eos`` or ``min_tokens``
(``targets[].planned_output``; docs/workloads.md, "Planned output lengths"). The report
rebuilds the planned lengths from the stored config and the seqs it journaled
(soakd/report/output_tokens.py): nothing more is stored per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from soakd.tracing import is_local_url
from soakd.workload.prompts import (
    Lengths,
    PromptSource,
    Records,
    describe_lengths,
    draw_length,
    fixed_length,
    make_prompt_source,
    seq_hash,
)

if TYPE_CHECKING:
    from soakd.config import Config, TargetConfig, Workload

PlannedOutput = Literal["ignore_eos", "min_tokens", "none"]
_MODES: Final[dict[str, PlannedOutput]] = {
    "ignore_eos": "ignore_eos",
    "min_tokens": "min_tokens",
    "none": "none",
}

_SALT: Final = 0x6F7574707574  # "output": the answers' draws, apart from the prompts'


class AnswerLengths:
    """The planned answer length of each seq (None: none planned)."""

    def __init__(
        self, lengths: Lengths | None, seed: int = 0, lines: Records | None = None
    ) -> None:
        self.lengths = lengths
        self._key = seq_hash(_SALT, seed)  # not the prompts' key: the two draws are apart
        self._fixed = (
            fixed_length(lengths) if lengths is not None and lengths.dist == "fixed" else 0
        )
        self._lines = lines if lines is not None and lines.plans_outputs else None

    @property
    def planned(self) -> bool:
        """Some request has a planned answer length."""
        return self.lengths is not None or self._lines is not None

    def __call__(self, seq: int) -> int | None:
        if self._lines is not None:
            n = self._lines.output_tokens(seq)
            if n is not None:
                return n
        if self.lengths is None:
            return None
        return self._fixed or draw_length(self.lengths, seq_hash(self._key, seq))


def answer_lengths(
    lengths: Lengths | None, seed: int, source: PromptSource | None = None
) -> AnswerLengths | None:
    """The planned answer lengths of a workload (None: none is planned): ``lengths`` is
    ``workload.prompts.output_tokens``, ``source`` the prompts (a file's records may plan)."""
    answers = AnswerLengths(lengths, seed, source if isinstance(source, Records) else None)
    return answers if answers.planned else None


def workload_answers(workload: Workload, source: PromptSource | None) -> AnswerLengths | None:
    """``answer_lengths`` of a config's workload, its prompts as made."""
    return answer_lengths(workload.prompts.output_tokens, workload.seed, source)


def asked_as(
    setting: str | None, base_url: str, simulator: object, kind: str = "openai"
) -> PlannedOutput:
    """How a target is asked to serve planned answer lengths, for a target as configured
    (``target_asks``) or as a journal stored it: ``setting`` as given, else ``ignore_eos``
    for a local server (a simulator, a loopback or private address: vLLM, llama.cpp and
    SGLang honour it) and ``none`` for others: a cloud API refuses a key it does not know
    (OpenAI's 400 "Unrecognized request argument"), and Azure's is one."""
    mode = _MODES.get(setting or "")
    if mode is not None:
        return mode
    if kind == "azure":
        return "none"
    return "ignore_eos" if simulator is not None or is_local_url(base_url) else "none"


def target_asks(cfg: TargetConfig) -> PlannedOutput:
    """``asked_as`` for a configured target (its own address: a gateway soakd starts in
    front of it resolves this before it takes the target's place: soakd/gateway/fronts.py)."""
    return asked_as(cfg.planned_output, cfg.base_url, cfg.simulator, cfg.kind)


def asked_whole(asks: PlannedOutput, tokens: int) -> dict[str, object]:
    """The body fields that ask for a planned answer length whole: no early end at EOS."""
    if asks == "ignore_eos":
        return {"ignore_eos": True}
    return {"min_tokens": tokens} if asks == "min_tokens" else {}


def answer_lines(cfg: Config) -> list[str]:
    """What ``soakd check`` says of the answers' planned lengths (nothing: none planned)."""
    wl = cfg.workload
    source = make_prompt_source(wl) if wl.prompts.source != "synthetic" else None
    if workload_answers(wl, source) is None:
        return []
    shown = []
    if isinstance(source, Records) and source.plans_outputs:
        shown.append(
            "the prompt file's lines'"
            if wl.prompts.source == "file"
            else f"the {wl.prompts.source} file's records'"
        )
    if wl.prompts.output_tokens is not None:
        shown.append(f"{describe_lengths(wl.prompts.output_tokens)} tokens, seed {wl.seed}")
    lines = [f"answers: planned, {', else '.join(shown)}: each request's max_tokens"]
    for t in cfg.targets:
        mode = target_asks(t)
        lines.append(
            f"  {t.name}: asked with {mode}"
            if mode != "none"
            else f"  {t.name}: asked with max_tokens alone: an answer may end early at its "
            "own EOS (targets[].planned_output)"
        )
    return lines
