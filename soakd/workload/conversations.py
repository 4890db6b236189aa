"""Workload, conversations: what each turn of a multi-turn conversation says.

A conversation's plan depends only on (seed, conversation number, turn), never on what a
target answered: every target gets the same user turns, the same planned lengths and the
same think times for the same conversation (a fair A/B), while each target's history holds
its own server's answers. The runner numbers each target's conversations on its own, as it
numbers requests (soakd/workload/runner.py).

``Conversations`` is the protocol a source of conversations speaks: the synthetic one here
(``workload.conversations``), a dataset's (ShareGPT's multi-turn) alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Final, Protocol

from soakd.workload.answers import AnswerLengths
from soakd.workload.calibration import Calibration
from soakd.workload.datasets import ConversationSource, ShareGPTPrompts, Turn
from soakd.workload.prompts import (
    SyntheticPrompts,
    describe_lengths,
    draw_length,
    make_prompt_source,
    seq_hash,
)

if TYPE_CHECKING:
    from soakd.config import Conversations as ConversationsConfig
    from soakd.config import ThinkTime, Workload

TURN_STRIDE: Final = 1024
"""A turn's draws are those of the index ``conversation * TURN_STRIDE + turn`` (above
``MAX_TURNS``, so no two turns share one)."""
_TURNS_SALT: Final = 0x7475726E73  # "turns"
_THINK_SALT: Final = 0x7468696E6B  # "think"
_USER_SALT: Final = 0x75736572  # "user": the user turns' words, apart from the prompts'


class Conversations(Protocol):
    """A source of conversations, numbered from 0. Deterministic: the same conversation
    number gives the same turns on every target and in every process."""

    def turns(self, conv: int) -> int:
        """How many user turns conversation ``conv`` has (at least one)."""
        ...

    def user(self, conv: int, turn: int) -> tuple[str, int]:
        """(text, planned tokens) of the user's message at ``turn``."""
        ...

    def user_tokens(self, conv: int, turn: int) -> int:
        """The planned tokens of that message, without building its text."""
        ...

    def answer_tokens(self, conv: int, turn: int) -> int | None:
        """The planned answer length of ``turn`` (None: none planned, max_tokens caps it)."""
        ...

    def system(self, conv: int) -> str | None:
        """The conversation's system message (None: none)."""
        ...

    def think_s(self, conv: int, turn: int) -> float:
        """Seconds between the answer to ``turn - 1`` and the send of ``turn`` (> 0)."""
        ...


def turn_index(conv: int, turn: int) -> int:
    """The one index a turn's draws are keyed by."""
    return conv * TURN_STRIDE + turn


class SyntheticConversations:
    """``workload.conversations``: turns, user turns of seeded words (prompts.py's, sized by
    the latest calibration: a conversation's history is rebuilt for each of its turns and
    must read the same every time), think times, and the answers' planned lengths from
    ``workload.prompts.output_tokens``."""

    def __init__(
        self,
        cfg: ConversationsConfig,
        seed: int = 0,
        answers: AnswerLengths | None = None,
        calibrations: Sequence[Calibration] = (),
    ) -> None:
        self.cfg = cfg
        self._turns_key = seq_hash(_TURNS_SALT, seed)
        self._think_key = seq_hash(_THINK_SALT, seed)
        self._seed = seed
        self._answers = answers
        self._users = self._user_prompts(calibrations)

    def _user_prompts(self, calibrations: Sequence[Calibration]) -> SyntheticPrompts:
        latest = [replace(calibrations[-1], from_seq=0)] if calibrations else []
        return SyntheticPrompts(self.cfg.user_tokens, self._seed ^ _USER_SALT, latest)

    def calibrate(self, cal: Calibration) -> None:
        """Size user turns by ``cal`` from now on (given once, at the start: the run checks
        no calibration against conversation turns, whose history must not change)."""
        self._users = self._user_prompts([cal])

    def turns(self, conv: int) -> int:
        return draw_length(self.cfg.turns, seq_hash(self._turns_key, conv))

    def user(self, conv: int, turn: int) -> tuple[str, int]:
        return self._users.spec_fields(turn_index(conv, turn))

    def user_tokens(self, conv: int, turn: int) -> int:
        return self._users.length(turn_index(conv, turn))

    def answer_tokens(self, conv: int, turn: int) -> int | None:
        return None if self._answers is None else self._answers(turn_index(conv, turn))

    def system(self, conv: int) -> str | None:
        return None

    def think_s(self, conv: int, turn: int) -> float:
        return draw_think(self.cfg.think_time, seq_hash(self._think_key, turn_index(conv, turn)))


def draw_think(d: ThinkTime, h: int) -> float:
    """The think time ``d`` gives the draw ``h`` (a ``seq_hash``), clamped to min..max."""
    u = (h >> 11) / 9007199254740992.0  # [0, 1)
    if d.dist == "uniform":
        s = d.min + u * (d.max - d.min)
    elif d.dist == "exponential":
        s = -d.mean * math.log1p(-u)
    else:
        s = d.mean
    return min(d.max, max(d.min, s))


def describe_think(d: ThinkTime) -> str:
    """A think time in words: "fixed 0.5 s", "uniform 1-5 s", "exponential, mean 2 s"."""
    if d.dist == "uniform":
        return f"uniform {d.min:g}-{d.max:g} s"
    if d.dist == "exponential":
        return f"exponential, mean {d.mean:g} s (at most {d.max:g} s)"
    return f"fixed {min(d.max, max(d.min, d.mean)):g} s"


def conversation_lines(workload: Workload) -> list[str]:
    """What ``soakd check`` says of the conversations (nothing: single requests)."""
    cfg = workload.conversations
    if cfg is None:
        return []
    if workload.prompts.source == "sharegpt":
        return [
            f"conversations: the sharegpt file's, its user turns and answer lengths, think "
            f"time {describe_think(cfg.think_time)}, seed {workload.seed}; after a failed "
            f"turn: {cfg.on_failure}",
            "  the load unit: a closed loop's concurrency is conversations at once, an open "
            "loop's arrival starts one; each turn sends every earlier turn and its answer",
        ]
    return [
        f"conversations: {describe_lengths(cfg.turns)} turns, user turns "
        f"{describe_lengths(cfg.user_tokens)} tokens, think time {describe_think(cfg.think_time)}"
        f", seed {workload.seed}; after a failed turn: {cfg.on_failure}",
        "  the load unit: a closed loop's concurrency is conversations at once, an open "
        "loop's arrival starts one; each turn sends every earlier turn and its answer",
    ]


class DatasetConversations:
    """A ShareGPT file's conversations (``workload.prompts.source: sharegpt`` with
    ``workload.conversations``): conversation ``conv`` is the file's item ``conv`` (cycled),
    its user turns and the lengths of the answers that followed them in the dataset (the
    answers planned); the think times are the config's. A conversation's turns are read
    again from the file for each of its turns (one ``pread``), the last few kept."""

    def __init__(self, cfg: ConversationsConfig, source: ConversationSource, seed: int = 0) -> None:
        self.cfg = cfg
        self._source = source
        self._think_key = seq_hash(_THINK_SALT, seed)
        self._read = lru_cache(maxsize=_KEPT)(self._turns)

    def _turns(self, item: int) -> tuple[Turn, ...]:
        return tuple(self._source.turns(item))

    def _turn(self, conv: int, turn: int) -> Turn:
        return self._read(conv % len(self._source))[turn]

    def calibrate(self, cal: Calibration) -> None:
        """Nothing: a dataset's text is its own."""

    def turns(self, conv: int) -> int:
        return len(self._read(conv % len(self._source)))

    def user(self, conv: int, turn: int) -> tuple[str, int]:
        t = self._turn(conv, turn)
        return t.user, t.user_tokens

    def user_tokens(self, conv: int, turn: int) -> int:
        return self._turn(conv, turn).user_tokens

    def answer_tokens(self, conv: int, turn: int) -> int | None:
        return self._turn(conv, turn).answer_tokens

    def system(self, conv: int) -> str | None:
        return self._source.system(conv % len(self._source))

    def think_s(self, conv: int, turn: int) -> float:
        return draw_think(self.cfg.think_time, seq_hash(self._think_key, turn_index(conv, turn)))


_KEPT: Final = 64
"""Dataset conversations whose turns a process keeps parsed (a closed loop's few at once)."""


def make_conversations(
    workload: Workload, calibrations: Sequence[Calibration] = (), source: object = None
) -> SyntheticConversations | DatasetConversations | None:
    """The workload's conversations (None: single requests): a ShareGPT file's when the
    prompts' source is one (``source``, the prompts as made, else read here), else
    synthetic."""
    cfg = workload.conversations
    if cfg is None:
        return None
    if workload.prompts.source == "sharegpt":
        if not isinstance(source, ShareGPTPrompts):
            made = make_prompt_source(workload)
            assert isinstance(made, ShareGPTPrompts)  # the source the config names
            source = made
        return DatasetConversations(cfg, source, workload.seed)
    lengths = workload.prompts.output_tokens
    answers = AnswerLengths(lengths, workload.seed) if lengths is not None else None
    return SyntheticConversations(cfg, workload.seed, answers, calibrations)


def conversation_key(target: str) -> str:
    """The key of a target's next conversation number in the runner's seq counters (the
    journal stores them as they are, and a resume reads them back: no target name holds a
    slash)."""
    return f"{target}/conversation"


class ConversationTally:
    """One target's conversations: started, run to their last turn, ended early (by
    reason: the failed turn's outcome, ``not_sent``, ``phase_ended``, ``stopped``)."""

    __slots__ = ("ended", "finished", "started")

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.ended: dict[str, int] = {}

    @property
    def ended_early(self) -> int:
        return sum(self.ended.values())

    def doc(self) -> dict[str, object]:
        return {
            "started": self.started,
            "finished": self.finished,
            "ended_early": dict(sorted(self.ended.items())),
        }
