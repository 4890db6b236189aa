"""Journal mark room: the journal's last commit, kept outside the database too
(``journal.mark``, rewritten after every commit by the writer): integrity.py compares it
with the database to count the commits a damaged write-ahead log dropped. Standard library
only: the writer process imports it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

MARK_FILE = "journal.mark"


@dataclass(frozen=True)
class Mark:
    """The journal's last commit, as the writer saw it commit."""

    session: int
    last_id: int  # the last request row id committed (0: none yet)
    requests: int  # requests in the totals
    offset_ns: int  # the plan clock of that heartbeat
    seqs: dict[str, int] = field(default_factory=dict)  # next seq per target


class MarkFile:
    """``journal.mark``, rewritten in place after every commit: one ``pwrite`` (~1 us; a
    new file renamed over the old cost 1.5 ms on ext4). It can only lag the database (it
    is written after the commit, and fails quietly on a full disk), and a write a crash
    tore reads as no mark (not JSON): it can hide a loss, never invent one."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / MARK_FILE
        self._fd: int | None = None
        self._size = 0

    def write(self, mark: Mark) -> bool:
        data = json.dumps(asdict(mark)).encode()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
                self._size = os.fstat(self._fd).st_size
            os.pwrite(self._fd, data.ljust(self._size), 0)  # (spaces: still one JSON)
        except OSError:
            return False
        self._size = max(self._size, len(data))
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_mark(run_dir: Path) -> Mark | None:
    """The mark, or None (none yet, or unreadable). Read until two reads agree: a read
    that met the writer's ``pwrite`` halfway could mix the digits of two marks."""
    path = run_dir / MARK_FILE
    try:
        text = path.read_bytes()
        for _ in range(3):
            again = path.read_bytes()
            if again == text:
                break
            text = again
        else:
            return None
        doc = json.loads(text)
        return Mark(
            int(doc["session"]),
            int(doc["last_id"]),
            int(doc["requests"]),
            int(doc["offset_ns"]),
            {str(k): int(v) for k, v in dict(doc.get("seqs") or {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
