"""Workload, the builder: a request's text, made in the process that sends it.

The runner plans a request by its numbers alone (seq; conversation and turn; a turn's
history of answers): no text crosses from the planner to a sender worker. Each sending
process, soakd's own with ``run.workers: 1`` or each worker, holds one ``Builder`` made from
the workload and the calibrations measured at the start (and any correction after it,
soakd/workers/wire.py's CALIBRATE), so the same seq gives the same bytes wherever it is
built (docs/workloads.md, "Where the text is built").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from soakd.model import RequestSpec
from soakd.workload.calibration import UNCALIBRATED, Calibration
from soakd.workload.conversations import make_conversations
from soakd.workload.prompts import SyntheticPrompts, make_prompt_source

if TYPE_CHECKING:
    from soakd.config import Workload

Message = dict[str, str]


class Builds(Protocol):
    """What a client asks of a builder: a chat body's messages, a completions prompt."""

    def messages(self, spec: RequestSpec) -> list[Message]: ...
    def text(self, spec: RequestSpec) -> str: ...


class Given:
    """The spec's own text (``RequestSpec.prompt``): the preflight's probe, a test's."""

    def messages(self, spec: RequestSpec) -> list[Message]:
        return [{"role": "user", "content": spec.prompt}]

    def text(self, spec: RequestSpec) -> str:
        return spec.prompt


GIVEN = Given()


class Builder:
    """Turns a ``RequestSpec`` into what a chat or completions body says."""

    def __init__(self, workload: Workload, calibrations: Sequence[Calibration] = ()) -> None:
        if calibrations and calibrations[0].from_seq > 0:
            # the seqs before the first calibration were sized by none (the usage fallback
            # measures from the first answers): a worker started later builds them alike
            calibrations = [UNCALIBRATED, *calibrations]
        self.prompts = make_prompt_source(workload, calibrations)
        self.conversations = make_conversations(workload, calibrations, self.prompts)

    def calibrate(self, cal: Calibration) -> None:
        """Size what is built from ``cal.from_seq`` on by ``cal`` (soakd/workload/sizing.py)."""
        if isinstance(self.prompts, SyntheticPrompts):
            self.prompts.calibrate(cal)
        if self.conversations is not None:
            self.conversations.calibrate(cal)

    def text(self, spec: RequestSpec) -> str:
        """A single request's prompt (a completions body's ``prompt``): the text the spec
        was given outright (a check's), else its seq's."""
        return spec.prompt or self.prompts.spec_fields(spec.seq)[0]

    def messages(self, spec: RequestSpec) -> list[Message]:
        """A chat body's ``messages``: the prompt as one user message; a conversation's
        turn as its system message, each earlier user turn and the answer its server gave
        (``spec.history``, an empty one where none arrived), then this turn's user message."""
        conv = spec.conversation
        if conv < 0 or self.conversations is None:
            return [{"role": "user", "content": self.text(spec)}]
        plan = self.conversations
        out: list[Message] = []
        system = plan.system(conv)
        if system:
            out.append({"role": "system", "content": system})
        history = spec.history
        for t in range(spec.turn):
            out.append({"role": "user", "content": plan.user(conv, t)[0]})
            out.append({"role": "assistant", "content": history[t] if t < len(history) else ""})
        out.append({"role": "user", "content": plan.user(conv, spec.turn)[0]})
        return out
