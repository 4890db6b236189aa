"""Journal batch room: outcomes as they travel to the journal's writer process. Pure: no IO.

A batch is the outcomes' records one after the other (soakd/outcome_record.py, the format a
sender worker sends them in), behind a small header: a version, the count, and the target
and phase names the records index (a string table, once per batch). ``Batch.add`` copies a
worker's record as it came (``Outcome.packed``) and fills in its identity, or packs an
Outcome built in soakd's own process (``run.workers: 1``, a record that had to move to
soakd's clock); ``decode`` and ``outcomes`` rebuild the outcomes in the writer. No pickle:
both ends are the same installed soakd, and nothing in a batch is code.
"""

from __future__ import annotations

import json
import struct
from typing import Final

from soakd import outcome_record
from soakd.model import Outcome

VERSION: Final = 2
"""1: typed columns, one per field (before the records); a writer reads its own soakd's."""
_HEAD = struct.Struct("<BII")  # version, outcomes, len(names JSON)


class Batch:
    """A batch being built (soakd's side) or decoded (the writer's)."""

    __slots__ = ("_ids", "count", "names", "records")

    def __init__(self) -> None:
        self.records = bytearray()
        self.names: list[str] = []  # the string table: targets and phases
        self.count = 0
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return self.count

    def _name(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def add(self, o: Outcome) -> None:
        """Append one finished request's record."""
        target, phase = self._name(o.target), self._name(o.phase)
        packed, buf = o.packed, self.records
        if packed is None:
            outcome_record.pack(buf, o, target, phase)
        else:
            at = len(buf)
            buf += packed
            outcome_record.IDENT.pack_into(buf, at, target, phase, o.seq, o.scheduled_ns)
        self.count += 1

    def encode(self) -> bytes:
        """``version, count, len(names) | names (JSON) | records``."""
        names = json.dumps(self.names).encode()
        return b"".join((_HEAD.pack(VERSION, self.count, len(names)), names, self.records))

    @classmethod
    def decode(cls, payload: bytes) -> Batch:
        """The batch ``encode`` wrote; ValueError when it is not one."""
        out = cls()
        try:
            version, out.count, n = _HEAD.unpack_from(payload, 0)
        except struct.error as exc:
            raise ValueError(f"journal batch cut short: {exc}") from None
        if version != VERSION:
            raise ValueError(f"journal batch version {version}, expected {VERSION}")
        at = _HEAD.size
        out.names = json.loads(payload[at : at + n])
        out.records = bytearray(payload[at + n :])
        return out

    def outcomes(self) -> list[Outcome]:
        """The outcomes again (the writer's side), in the order they were added; ValueError
        (``outcome_record.RecordError``) when the records are not whole or not ``count``:
        nothing of such a batch is taken."""
        got = list(outcome_record.read_all(bytes(self.records), self.names))
        if len(got) != self.count:
            raise outcome_record.RecordError(
                f"journal batch of {len(got)} records, not {self.count}"
            )
        return got
