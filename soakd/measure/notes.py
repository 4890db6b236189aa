"""Notes room: what soakd noticed about a target's answers that is no error of the request.

- ``usage_rejected:<reason>``: the answer's ``usage`` was not taken (a count that is not an
  integer, negative, or more than the answer could hold: soakd/targets/stream.py); its
  output tokens are the streamed count, unknown (None) for a non-streamed answer;
- ``usage_mismatch:above`` / ``usage_mismatch:below``: a streamed answer's usage, taken,
  is above (below) the content chunks it streamed by more than one. Above is what a
  server that sends several tokens a chunk does, legitimately: vLLM does it under load
  (its API server merges the tokens a slow reader has not taken yet: measured +1 and +2
  on a CPU box at 4 concurrent); usage is then the true count, and the one used. Below
  is a miscount (a content chunk holds at least one token); usage is still the count
  used, as long as it is plausible;
- ``retry_after_unreadable``: a 429 or 503 carried a Retry-After soakd could not read; the
  target paused for ``rate_limit.default_pause`` instead (soakd/workload/guard.py).

Each is counted per target by ``count_notes``, the one count: the writer's fold calls it
(the journal's ``notes`` table, which a resume continues and the report reads, and Metrics,
from the folds the journal hands back), and so does the ``Notes`` sink (``/status``); each
is named once in the log, at its first occurrence. Pure apart from the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from soakd.childlog import ChildLog
from soakd.model import USAGE_REJECTED_REASONS, Finished

log = ChildLog()  # structlog here; this module is also imported by the journal's writer

USAGE_REJECTED: Final = "usage_rejected"
USAGE_MISMATCH: Final = "usage_mismatch"
MISMATCH_DIRECTIONS: Final = ("above", "below")
RETRY_AFTER_UNREADABLE: Final = "retry_after_unreadable"
NOTES: Final = (
    *(f"{USAGE_REJECTED}:{r}" for r in USAGE_REJECTED_REASONS),
    *(f"{USAGE_MISMATCH}:{d}" for d in MISMATCH_DIRECTIONS),
    RETRY_AFTER_UNREADABLE,
)
"""Every note, as the journal stores it (bounded: safe as labels)."""
NoteKey = tuple[str, str]
"""(target, note): one row of the journal's ``notes`` table."""

_SAY: Final = {
    USAGE_REJECTED: "the server's usage is not taken for such answers: their output tokens "
    "are the content chunks soakd counted (a stream), else unknown (a non-streamed answer: "
    "not counted in the token totals)",
    f"{USAGE_MISMATCH}:above": "the server's usage.completion_tokens is above the content "
    "chunks streamed by more than one: a server that sends several tokens a chunk does "
    "so legitimately (vLLM under load); usage is the count used",
    f"{USAGE_MISMATCH}:below": "the server's usage.completion_tokens is below the content "
    "chunks streamed by more than one: a miscount (a chunk holds at least one token); "
    "usage is still the count used",
    RETRY_AFTER_UNREADABLE: "the 429/503's Retry-After is no delay-seconds or HTTP date "
    "soakd can read: the target pauses for rate_limit.default_pause instead",
}


def notes_of(o: Finished) -> Iterator[str]:
    """The notes one answer carries (most carry none)."""
    if o.usage_rejected:
        yield f"{USAGE_REJECTED}:{o.usage_rejected}"
    if o.usage_mismatch:
        yield f"{USAGE_MISMATCH}:{'above' if (o.usage_delta or 0) > 0 else 'below'}"
    if o.retry_after_unreadable:
        yield RETRY_AFTER_UNREADABLE


def count_notes(o: Finished, counts: dict[NoteKey, int]) -> tuple[str, ...]:
    """Add the notes ``o`` carries to ``counts``; returns those it counted for the first
    time. Most answers carry none, and cost one test here (per outcome, in the writer)."""
    if not (o.usage_rejected or o.usage_mismatch or o.retry_after_unreadable):
        return ()
    first = []
    for note in notes_of(o):
        key = (o.target, note)
        n = counts[key] = counts.get(key, 0) + 1
        if n == 1:
            first.append(note)
    return tuple(first)


class Notes:
    """An OutcomeSink counting each target's notes over the run (``count_notes``); each
    note is logged once per target, when first seen (a resumed run's are not logged
    again)."""

    def __init__(self) -> None:
        self.counts: dict[NoteKey, int] = {}

    def restore(self, counts: Iterable[tuple[str, str, int]]) -> None:
        """A resumed run's counts so far, (target, note, count): not logged again."""
        for target, note, n in counts:
            self.counts[(target, note)] = self.counts.get((target, note), 0) + n

    def record(self, outcome: Finished) -> None:
        for note in count_notes(outcome, self.counts):
            _log_first(outcome, note)

    def row(self, target: str) -> dict[str, int]:
        """One target's notes so far, for ``/status`` (only those seen)."""
        return dict(sorted((note, n) for (t, note), n in self.counts.items() if t == target))


def by_target(counts: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """(target, note, count) rows -> per target, note -> count."""
    out: dict[str, dict[str, int]] = {}
    for target, note, n in counts:
        mine = out.setdefault(target, {})
        mine[note] = mine.get(note, 0) + n
    return out


def describe(notes: Mapping[str, int], stream: bool = True) -> list[str]:
    """One target's notes in words, for the report (empty: nothing noticed). ``stream``:
    the target's answers were streamed (else a usage not taken leaves no count)."""
    lines = []
    rejected = {k.split(":", 1)[1]: n for k, n in notes.items() if k.startswith(USAGE_REJECTED)}
    if rejected:
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(rejected.items()))
        lines.append(
            f"usage not taken for {sum(rejected.values()):,} answers ({why}): "
            + (
                "their output tokens are the streamed count"
                if stream
                else "their output tokens are unknown (not streamed: nothing counted), "
                "left out of the token totals"
            )
        )
    above = notes.get(f"{USAGE_MISMATCH}:above", 0)
    below = notes.get(f"{USAGE_MISMATCH}:below", 0)
    if above:
        lines.append(
            f"usage above the stream by more than one token in {above:,} answers (usage "
            "counted: a server that sends several tokens a chunk, as vLLM does under load)"
        )
    if below:
        lines.append(
            f"usage below the stream by more than one token in {below:,} answers: the "
            "server miscounts (usage still counted)"
        )
    if notes.get(RETRY_AFTER_UNREADABLE):
        lines.append(
            f"{notes[RETRY_AFTER_UNREADABLE]:,} Retry-After headers soakd could not read "
            "(paused for rate_limit.default_pause instead)"
        )
    return lines


def _log_first(o: Finished, note: str) -> None:
    kind = note.split(":", 1)[0]
    data: dict[str, object] = {}
    if kind == USAGE_REJECTED:
        data["reason"] = o.usage_rejected
    elif kind == USAGE_MISMATCH:
        data["usage"] = o.output_tokens
        data["streamed"] = o.content_chunks
    else:
        data["status"] = o.status
    say = _SAY.get(note) or _SAY[kind]
    log.warning(kind, target=o.target, **data, note=say, logged="once per target and kind")
