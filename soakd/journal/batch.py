"""Journal batch room: outcomes in columns, the way they travel to the journal's writer
process. Pure: no IO.

``Columns.add`` appends an outcome's fields to one typed array per field (a handful of C
appends, no object kept); ``encode`` writes the arrays one after the other behind a small
header, and ``decode`` rebuilds the outcomes in the writer. Target and phase names (and
why a usage was rejected) travel once per batch (a string table), error kinds as their
index in ``ErrorKind``, ITL gaps as
raw int64, and their digest buckets as (key, count) pairs when the worker that timed the
request counted them (none: the writer counts them). No pickle: both ends are the same
installed soakd, and nothing in a batch is code.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Iterator
from itertools import chain
from typing import Final

from soakd.model import ErrorKind, Outcome

VERSION: Final = 1
KINDS: Final = tuple(ErrorKind)
_KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}
_NO_KIND: Final = 255
_NONE: Final = -1
_NO_DELTA: Final = -(1 << 63)
_NO_NAME: Final = 0xFFFF
_HEAD = struct.Struct("<BI")  # version, outcomes
_LEN = struct.Struct("<I")
_BIG = sys.byteorder == "big"

# (name, array type): the order of the columns in an encoded batch
COLUMNS: Final = (
    ("target", "H"),
    ("phase", "H"),
    ("seq", "q"),
    ("scheduled", "q"),
    ("sent", "q"),
    ("first_token", "q"),  # -1: none
    ("end", "q"),
    ("wall", "d"),
    ("status", "H"),
    ("error", "B"),  # 255: ok
    ("flags", "B"),  # 1: oom, 2: usage reported, 4: an unreadable Retry-After
    ("usage_delta", "q"),  # _NO_DELTA: none
    ("usage_rejected", "H"),  # the reason in the string table; _NO_NAME: none
    ("prompt_tokens", "q"),  # -1: none
    ("output_tokens", "I"),
    ("n_gaps", "I"),
    ("n_keys", "I"),
    ("gaps", "q"),  # every outcome's gaps, one after the other (ns)
    ("keys", "I"),  # every outcome's (digest key, count) pairs
)


class Columns:
    """A batch being built (the parent's side) or decoded (the writer's)."""

    __slots__ = ("_ids", "ints", "names", "wall")

    def __init__(self) -> None:
        self.ints: dict[str, array[int]] = {n: array(c) for n, c in COLUMNS if c != "d"}
        self.wall: array[float] = array("d")
        self.names: list[str] = []  # the string table: targets and phases
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.wall)

    def _column(self, name: str) -> array[int] | array[float]:
        return self.wall if name == "wall" else self.ints[name]

    def _name(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def add(self, o: Outcome) -> None:
        """Append one finished request's fields (what its row and its fold need)."""
        c = self.ints
        c["target"].append(self._name(o.target))
        c["phase"].append(self._name(o.phase))
        c["seq"].append(o.seq)
        c["scheduled"].append(o.scheduled_ns)
        c["sent"].append(o.sent_ns)
        first = o.first_token_ns
        c["first_token"].append(_NONE if first is None else first)
        c["end"].append(o.end_ns)
        self.wall.append(o.wall_start)
        c["status"].append(o.status)
        error = o.error
        c["error"].append(_NO_KIND if error is None else _KIND_INDEX[error])
        c["flags"].append(o.oom | o.usage_reported << 1 | o.retry_after_unreadable << 2)
        prompt = o.prompt_tokens
        c["prompt_tokens"].append(_NONE if prompt is None else prompt)
        c["output_tokens"].append(o.output_tokens)
        gaps = o.itl_ns
        c["n_gaps"].append(len(gaps))
        c["gaps"].extend(gaps)
        keys = o.itl_keys
        if keys:
            c["n_keys"].append(len(keys))
            c["keys"].extend(chain.from_iterable(keys.items()))  # key, count, key, count...
        else:
            c["n_keys"].append(0)
        delta = o.usage_delta
        c["usage_delta"].append(_NO_DELTA if delta is None else delta)
        rejected = o.usage_rejected
        c["usage_rejected"].append(self._name(rejected) if rejected else _NO_NAME)

    def encode(self) -> bytes:
        """``version, count | len, names (JSON) | len, column`` for each column in order."""
        names = json.dumps(self.names).encode()
        parts = [_HEAD.pack(VERSION, len(self)), _LEN.pack(len(names)), names]
        for name, _ in COLUMNS:
            col = self._column(name)
            if _BIG:
                col = col[:]
                col.byteswap()
            raw = col.tobytes()
            parts += (_LEN.pack(len(raw)), raw)
        return b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes) -> Columns:
        """The batch ``encode`` wrote; ValueError when it is not one."""
        out = cls()
        try:
            version, count = _HEAD.unpack_from(payload, 0)
            if version != VERSION:
                raise ValueError(f"journal batch version {version}, expected {VERSION}")
            at = _HEAD.size
            (n,) = _LEN.unpack_from(payload, at)
            at += _LEN.size
            out.names = json.loads(payload[at : at + n])
            at += n
            for name, _ in COLUMNS:
                (n,) = _LEN.unpack_from(payload, at)
                at += _LEN.size
                col = out._column(name)
                col.frombytes(payload[at : at + n])
                if _BIG:
                    col.byteswap()
                at += n
        except struct.error as exc:
            raise ValueError(f"journal batch cut short: {exc}") from None
        if at != len(payload) or len(out) != count:
            raise ValueError("journal batch of the wrong length")
        return out

    def outcomes(self) -> Iterator[Outcome]:
        """The outcomes again (the writer's side), in the order they were added."""
        c, names, walls = self.ints, self.names, self.wall
        targets, phases, seqs, scheduled = c["target"], c["phase"], c["seq"], c["scheduled"]
        sent, firsts, ends, statuses = c["sent"], c["first_token"], c["end"], c["status"]
        errors, flags, prompts, outputs = (
            c["error"],
            c["flags"],
            c["prompt_tokens"],
            c["output_tokens"],
        )
        n_gaps, n_keys, gaps, keys = c["n_gaps"], c["n_keys"], c["gaps"], c["keys"]
        deltas, rejected = c["usage_delta"], c["usage_rejected"]
        at_gap = at_key = 0
        for i, wall in enumerate(walls):
            o = Outcome(names[targets[i]], names[phases[i]], seqs[i], scheduled[i])
            o.sent_ns = sent[i]
            first = firsts[i]
            o.first_token_ns = None if first == _NONE else first
            o.end_ns = ends[i]
            o.wall_start = wall
            o.status = statuses[i]
            error = errors[i]
            o.error = None if error == _NO_KIND else KINDS[error]
            o.oom = bool(flags[i] & 1)
            o.usage_reported = bool(flags[i] & 2)
            o.retry_after_unreadable = bool(flags[i] & 4)
            delta = deltas[i]
            o.usage_delta = None if delta == _NO_DELTA else delta
            reason = rejected[i]
            o.usage_rejected = "" if reason == _NO_NAME else names[reason]
            prompt = prompts[i]
            o.prompt_tokens = None if prompt == _NONE else prompt
            o.output_tokens = outputs[i]
            n = n_gaps[i]
            o.itl_ns = gaps[at_gap : at_gap + n]
            at_gap += n
            k = n_keys[i]
            if k:
                pairs = keys[at_key : at_key + 2 * k]
                o.itl_keys = dict(zip(pairs[::2], pairs[1::2], strict=True))
                at_key += 2 * k
            yield o
