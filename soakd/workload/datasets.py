"""Workload, datasets: prompts from a dataset or trace file (``workload.prompts.source``
``sharegpt``, ``mooncake``, ``burstgpt``), read from local files only.

Each file is checked whole at ``soakd check`` and at start, in one streaming pass
(``records.py``): a bad record is one line naming the field, the file and the line, exit 2.
Seq ``s`` sends record ``s % len`` (``record_of``), the records cycled, the same on every
target; ``label`` names a record in its file, so a slow request can be found there.

- ``sharegpt``: a JSON array of ``{"conversations": [{"from": ..., "value": ...}]}``. A
  request is the conversation's first human turn, its planned answer the gpt turn after
  it; ``turns`` gives every turn for multi-turn replay (``ConversationSource``).
- ``mooncake``: a JSONL trace of ``input_length``, ``output_length`` and ``hash_ids``; each
  id is a block of 512 tokens of the synthetic words, the same text for the same id, so
  the trace's shared prefixes are sent as shared text; the last block is cut to make
  ``input_length``.
- ``burstgpt``: a CSV whose ``Request tokens`` and ``Response tokens`` plan the lengths;
  the text is the synthetic prompts'. A row with no response tokens (a failed request in
  BurstGPT) or no request tokens is skipped, and counted with its reason.

Mooncake and BurstGPT prompts are synthetic prompts whose lengths the file plans, so they
are sized in the target's own tokens as synthetic prompts are (``sizing.py``).
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import ValidationError

from soakd.config import MAX_TOKENS, ConfigError, TokenLength, Workload
from soakd.workload.calibration import Calibration, LocalTokenizer
from soakd.workload.prompts import (
    CHARS_PER_TOKEN,
    Records,
    SyntheticPrompts,
    describe_lengths,
    make_prompt_source,
    seq_hash,
)
from soakd.workload.records import WHERE, BadRecord, csv_rows, index_array, index_lines

BLOCK_TOKENS: Final = 512
"""The tokens of one Mooncake hash id (the trace's block size)."""
_BLOCK_SALT: Final = 0x626C6F636B  # "block": the Mooncake blocks' text, apart from the rest

USER_ROLES: Final = frozenset({"human", "user"})
ANSWER_ROLES: Final = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM_ROLES: Final = frozenset({"system"})


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of a conversation: its text, its planned length, and the planned
    length of the answer the dataset gives it (None: the dataset has none)."""

    user: str
    user_tokens: int
    answer_tokens: int | None


class ConversationSource(Protocol):
    """Conversations for multi-turn replay: each one's user turns, and its system prompt."""

    def __len__(self) -> int: ...
    def turns(self, conv: int) -> list[Turn]: ...
    def system(self, conv: int) -> str | None: ...


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _tokens(obj: dict[str, Any], key: str) -> int:
    n = obj.get(key)
    if type(n) is not int or not 1 <= n <= MAX_TOKENS:
        raise BadRecord(
            f'"{key}" must be a whole number of tokens from 1 to {MAX_TOKENS:,}, got {_shown(n)}'
        )
    return n


def _counter(workload: Workload) -> tuple[Callable[[str], int], str]:
    """How a dataset's text is counted in tokens, and that in words."""
    if workload.tokenizer is not None:
        tok = LocalTokenizer(workload.tokenizer)
        return (
            lambda text: max(1, tok.count(text, as_sent=False).count),
            f"counted by {workload.tokenizer}",
        )
    return (
        lambda text: max(1, round(len(text) / CHARS_PER_TOKEN)),
        f"planned at {CHARS_PER_TOKEN} characters a token",
    )


# --- ShareGPT ------------------------------------------------------------------------------


def _check_conversation(obj: Any, _i: int) -> None:
    """A ShareGPT item: an object whose "conversations" hold a human turn with text."""
    if not isinstance(obj, dict):
        raise BadRecord(f'expected an object with "conversations", got {type(obj).__name__}')
    turns = obj.get("conversations")
    if not isinstance(turns, list):
        raise BadRecord('"conversations" must be a list of turns')
    asked = False
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadRecord(f"conversations[{j}] must be an object")
        role, value = turn.get("from"), turn.get("value")
        if not isinstance(role, str) or role not in USER_ROLES | ANSWER_ROLES | SYSTEM_ROLES:
            raise BadRecord(
                f'conversations[{j}].from must be "human", "gpt" or "system", got {_shown(role)}'
            )
        if not isinstance(value, str):
            raise BadRecord(f"conversations[{j}].value must be a string")
        if len(value) > MAX_TOKENS * CHARS_PER_TOKEN:
            raise BadRecord(f"conversations[{j}].value: {len(value):,} characters, too long")
        asked = asked or (role in USER_ROLES and bool(value))
    if not asked:
        raise BadRecord('"conversations" hold no human turn with text')


class ShareGPTPrompts:
    """A ShareGPT file: single-turn prompts (``PromptSource``) and conversations
    (``ConversationSource``)."""

    kind: Final = "sharegpt"

    def __init__(self, path: Path, count: Callable[[str], int], counted: str) -> None:
        self.path = path
        self.counted = counted
        self._count = count
        self._file = index_array(path, _check_conversation)
        self.plans_outputs = True

    def __len__(self) -> int:
        return len(self._file)

    @property
    def index_bytes(self) -> int:
        return self._file.index_bytes

    def record_of(self, seq: int) -> int:
        return seq % len(self._file)

    def label(self, record: int) -> str:
        return f"{self.path.name}:{self._file.line(record)} (item {record})"

    def _turns(self, conv: int) -> list[dict[str, str]]:
        turns: list[dict[str, str]] = json.loads(self._file.read(conv))["conversations"]
        return turns

    def turns(self, conv: int) -> list[Turn]:
        """Its user turns with text, each with the length of the answer that follows it
        (answers before the first user turn are left out)."""
        out: list[Turn] = []
        pending: str | None = None
        answer: int | None = None
        for t in self._turns(conv):
            role, value = t["from"], t["value"]
            if role in USER_ROLES and value:
                if pending is not None:
                    out.append(Turn(pending, self._count(pending), answer))
                pending, answer = value, None
            elif role in ANSWER_ROLES and pending is not None and answer is None and value:
                answer = min(MAX_TOKENS, self._count(value))
        if pending is not None:
            out.append(Turn(pending, self._count(pending), answer))
        return out

    def system(self, conv: int) -> str | None:
        for t in self._turns(conv):
            if t["from"] in SYSTEM_ROLES and t["value"]:
                return t["value"]
        return None

    def _first(self, seq: int) -> Turn:
        """The first user turn with text and the answer after it (only these counted)."""
        text: str | None = None
        for t in self._turns(self.record_of(seq)):
            role, value = t["from"], t["value"]
            if text is None and role in USER_ROLES and value:
                text = value
            elif text is not None and role in ANSWER_ROLES and value:
                return Turn(text, self._count(text), min(MAX_TOKENS, self._count(value)))
            elif text is not None and role in USER_ROLES and value:
                break
        assert text is not None  # checked when the file was read
        return Turn(text, self._count(text), None)

    def spec_fields(self, seq: int) -> tuple[str, int]:
        turn = self._first(seq)
        return turn.user, turn.user_tokens

    def length(self, seq: int) -> int:
        return self._first(seq).user_tokens

    def output_tokens(self, seq: int) -> int | None:
        return self._first(seq).answer_tokens

    def describe(self) -> list[str]:
        return [
            f"prompts: sharegpt {self.path}, {len(self):,} conversations, each one's first "
            f"human turn ({self.counted}); its answer's planned length: the gpt turn after it"
        ]


# --- Mooncake ------------------------------------------------------------------------------


class MooncakePrompts(SyntheticPrompts):
    """A Mooncake trace: each record's ``hash_ids`` as blocks of synthetic words."""

    kind: Final = "mooncake"

    def __init__(self, path: Path, seed: int, calibrations: Sequence[Calibration] = ()) -> None:
        self.path = path
        self._inputs = array("i")
        self._outputs = array("i")
        self._file = index_lines(path, self._check)
        self.plans_outputs = True
        self._block_key = seq_hash(_BLOCK_SALT, seed)
        super().__init__(TokenLength(mean=BLOCK_TOKENS, max=MAX_TOKENS), seed, calibrations)

    def _check(self, obj: Any, _i: int) -> None:
        if not isinstance(obj, dict):
            raise BadRecord(
                f"expected an object with input_length, output_length and hash_ids, "
                f"got {type(obj).__name__}"
            )
        stamp = obj.get("timestamp")
        if stamp is not None and (type(stamp) not in (int, float) or stamp < 0):
            raise BadRecord(f'"timestamp" must be milliseconds from 0 on, got {_shown(stamp)}')
        n_in, n_out = _tokens(obj, "input_length"), _tokens(obj, "output_length")
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not ids or not all(type(i) is int and i >= 0 for i in ids):
            raise BadRecord('"hash_ids" must be a non-empty list of whole numbers from 0 on')
        if n_in > BLOCK_TOKENS * len(ids):
            raise BadRecord(
                f'"input_length" {n_in} is more than its {len(ids)} hash_ids hold '
                f"({BLOCK_TOKENS} tokens each)"
            )
        self._inputs.append(n_in)
        self._outputs.append(n_out)

    def __len__(self) -> int:
        return len(self._inputs)

    @property
    def index_bytes(self) -> int:
        return self._file.index_bytes + 4 * (len(self._inputs) + len(self._outputs))

    def record_of(self, seq: int) -> int:
        return seq % len(self._inputs)

    def label(self, record: int) -> str:
        return f"{self.path.name}:{self._file.line(record)}"

    def _length(self, seq: int, h1: int) -> int:
        return self._inputs[seq % len(self._inputs)]

    def output_tokens(self, seq: int) -> int | None:
        return self._outputs[seq % len(self._outputs)]

    def hash_ids(self, record: int) -> list[int]:
        ids: list[int] = json.loads(self._file.read(record))["hash_ids"]
        return ids

    def build(self, seq: int) -> tuple[str, int, float]:
        """The record's blocks, each id's text the same wherever it comes; the last cut to
        make ``input_length`` with what the calibration says a request adds around it."""
        record = self.record_of(seq)
        n = self._inputs[record]
        left = n - self._sizing_of(seq).cal.overhead
        parts = []
        for block in self.hash_ids(record):
            if left < 1:
                break
            text, cost = self.window(self._block_key ^ block, min(BLOCK_TOKENS, left), seq)
            if not text:
                break
            parts.append(text)
            left -= cost
        return " ".join(parts), n, n - left

    def reuse(self) -> tuple[int, int]:
        """(prompt tokens in blocks an earlier record sent, prompt tokens), over one pass of
        the trace: the share a prefix cache that kept everything would hit. Reads the trace
        again (``soakd check`` and the report ask, never a run)."""
        seen: set[int] = set()
        reused = total = 0
        for r in range(len(self)):
            n = self._inputs[r]
            total += n
            for j, block in enumerate(self.hash_ids(r)):
                size = max(0, min(BLOCK_TOKENS, n - j * BLOCK_TOKENS))
                if block in seen:
                    reused += size
                seen.add(block)
        return reused, total

    def describe(self) -> list[str]:
        reused, total = self.reuse()
        return [
            f"prompts: mooncake {self.path}, {len(self):,} requests, prompts "
            f"{min(self._inputs)}-{max(self._inputs)} tokens, answers "
            f"{min(self._outputs)}-{max(self._outputs)}; blocks of {BLOCK_TOKENS} tokens "
            f"sent before: {reused / max(1, total):.1%} of the prompt tokens"
        ]


# --- BurstGPT ------------------------------------------------------------------------------

BURST_REQUEST: Final = "Request tokens"
BURST_RESPONSE: Final = "Response tokens"


class BurstGPTPrompts(SyntheticPrompts):
    """A BurstGPT CSV: synthetic prompts of each row's request tokens, its response tokens
    the planned answer."""

    kind: Final = "burstgpt"

    def __init__(self, path: Path, seed: int, calibrations: Sequence[Calibration] = ()) -> None:
        self.path = path
        self._inputs = array("i")  # MAX_TOKENS fits
        self._outputs = array("i")
        self._lines = array("i")
        self.skipped: Counter[str] = Counter()
        self._read()
        self.plans_outputs = True
        longest = max(self._inputs)
        super().__init__(TokenLength(mean=longest, max=MAX_TOKENS), seed, calibrations)

    def _read(self) -> None:
        rows = csv_rows(self.path)
        header = next(rows, None)
        if header is None:
            raise ConfigError(f"{WHERE}: {self.path} holds no records")
        names = header[1]
        missing = [c for c in (BURST_REQUEST, BURST_RESPONSE) if c not in names]
        if missing:
            raise ConfigError(
                f"{WHERE}: {self.path}:1: the header has no {' or '.join(map(repr, missing))} "
                "column (BurstGPT's: Timestamp,Model,Request tokens,Response tokens,...)"
            )
        at_in, at_out = names.index(BURST_REQUEST), names.index(BURST_RESPONSE)
        for line, row in rows:
            if not row:
                continue
            if len(row) != len(names):
                raise ConfigError(
                    f"{WHERE}: {self.path}:{line}: {len(row)} fields, the header has {len(names)}"
                )
            n_in = self._whole(row[at_in], BURST_REQUEST, line)
            n_out = self._whole(row[at_out], BURST_RESPONSE, line)
            if n_out == 0:
                self.skipped["no response tokens (a failed request)"] += 1
            elif n_in == 0:
                self.skipped["no request tokens"] += 1
            else:
                self._inputs.append(n_in)
                self._outputs.append(n_out)
                self._lines.append(line)
        if not self._inputs:
            why = f" (skipped: {self._skips()})" if self.skipped else ""
            raise ConfigError(f"{WHERE}: {self.path} holds no records{why}")

    def _whole(self, value: str, column: str, line: int) -> int:
        try:
            n = int(value)
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_TOKENS:
            raise ConfigError(
                f'{WHERE}: {self.path}:{line}: "{column}" must be a whole number of tokens '
                f"from 0 to {MAX_TOKENS:,}, got {_shown(value)}"
            )
        return n

    def _skips(self) -> str:
        return ", ".join(f"{n:,} {why}" for why, n in sorted(self.skipped.items()))

    def __len__(self) -> int:
        return len(self._inputs)

    @property
    def index_bytes(self) -> int:
        return sum(
            a.buffer_info()[1] * a.itemsize for a in (self._inputs, self._outputs, self._lines)
        )

    def record_of(self, seq: int) -> int:
        return seq % len(self._inputs)

    def label(self, record: int) -> str:
        return f"{self.path.name}:{self._lines[record]}"

    def _length(self, seq: int, h1: int) -> int:
        return self._inputs[seq % len(self._inputs)]

    def output_tokens(self, seq: int) -> int | None:
        return self._outputs[seq % len(self._outputs)]

    def describe(self) -> list[str]:
        lines = [
            f"prompts: burstgpt {self.path}, {len(self):,} requests, prompts "
            f"{min(self._inputs)}-{max(self._inputs)} tokens of synthetic words, answers "
            f"{min(self._outputs)}-{max(self._outputs)}"
        ]
        if self.skipped:
            lines.append(f"  skipped rows: {self._skips()}")
        return lines


Dataset = ShareGPTPrompts | MooncakePrompts | BurstGPTPrompts


def open_dataset(workload: Workload, calibrations: Sequence[Calibration] = ()) -> Dataset:
    """The dataset source ``workload.prompts`` names, its file checked whole."""
    prompts = workload.prompts
    path = prompts.file
    assert path is not None  # the config model guarantees it
    if prompts.source == "sharegpt":
        count, counted = _counter(workload)
        return ShareGPTPrompts(path, count, counted)
    if prompts.source == "mooncake":
        return MooncakePrompts(path, workload.seed, calibrations)
    if prompts.source == "burstgpt":
        return BurstGPTPrompts(path, workload.seed, calibrations)
    raise ValueError(f"not a dataset source: {prompts.source}")


def source_lines(workload: Workload, source: object) -> list[str]:
    """What ``soakd check`` says of the prompts' source: what it is, its records and what
    they plan, the records skipped and why, the shared prefixes."""
    prompts = workload.prompts
    if workload.conversations is not None:  # their user turns are the prompts
        lines = ["prompts: synthetic, the conversations' user turns"]
    elif isinstance(source, ShareGPTPrompts | MooncakePrompts | BurstGPTPrompts):
        lines = source.describe()
    elif prompts.source == "file":
        lines = [f"prompts: {prompts.file}, planned at {CHARS_PER_TOKEN} characters a token"]
    else:
        shape = describe_lengths(prompts.input_tokens)
        lines = [f"prompts: synthetic, {shape} tokens, seed {workload.seed}"]
    p = prompts.prefix
    if p is not None and p.share > 0:
        lines.append(
            f"  shared prefixes: {p.share:.0%} of the requests (drawn from seed "
            f"{workload.seed}) open with one of {p.count:,} prefixes of {p.tokens:,} tokens, "
            "part of their planned length"
        )
    return lines


def stored_source(prompts: Any, seed: int, tokenizer: str | None) -> Records | None:
    """The records of a stored run's file source (``workload.prompts`` as the journal kept
    it), read again for the report; None when they cannot be (the file is gone, changed
    into a bad one, or the source is synthetic)."""
    if prompts.source == "synthetic" or prompts.file is None:
        return None
    wanted: dict[str, Any] = {"source": prompts.source, "file": prompts.file}
    if prompts.prefix is not None:
        wanted["prefix"] = prompts.prefix.model_dump()
    try:
        wl = Workload.model_validate({"prompts": wanted, "seed": seed, "tokenizer": tokenizer})
        source = make_prompt_source(wl)
    except (ConfigError, ValidationError):
        return None
    return source if isinstance(source, Records) else None
