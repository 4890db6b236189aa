"""Export room: the journal's per-request rows as CSV or JSON lines, for pandas and friends.

Streamed row by row from a read-only cursor: constant memory whatever the run's size.
Times are plan offsets and durations in seconds (floats), ``wall`` is Unix seconds.
With ``--itl`` each row has its inter-token gaps in microseconds, in one of two columns
as the journal kept them (docs/journal.md, "ITL gaps"): ``itl_us``, every gap in arrival
order (``journal.itl: exact``, and every row of a v1/v2 journal), or ``itl_sorted_us``, the
2 % buckets' middles in ascending order (``journal.itl: compact``, the default: the order
of the gaps is not stored). ``trace_id`` is the one the request's ``traceparent`` carried
(soakd/tracing.py), empty for a target that sent none. ``source_record`` names the dataset
record a request was built from (``trace.jsonl:812``; a conversation's, the ShareGPT item
it replays), so a slow request can be found in the dataset: derived from the seq and the
stored source, read again (empty for synthetic prompts, or when the file is gone or
changed). ``usage_delta`` and
``usage_rejected`` say how the server's usage compared with the stream
(soakd/targets/stream.py).
"""

from __future__ import annotations

import csv
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from soakd.journal import JournalReader, row_itl_ns, unpack_itl
from soakd.journal.schema import REQUEST_COLUMNS
from soakd.tracing import trace_id
from soakd.workload.datasets import stored_source

_GAPS = ("itl", "itl_hist")  # a row's ITL gaps: the --itl columns (ITL_COLUMNS), decoded


def _exported(column: str) -> str:
    """A journal column's name in an export: nanoseconds become seconds (``ttft_ns`` ->
    ``ttft_s``); the dispatch lag says what it is."""
    if column == "lag_ns":
        return "dispatch_lag_s"
    return column.removesuffix("_ns") + "_s" if column.endswith("_ns") else column


_SECONDS = {_exported(c): c for c in REQUEST_COLUMNS if c.endswith("_ns")}
_DERIVED = ("trace_id", "source_record")
COLUMNS = (*(_exported(c) for c in REQUEST_COLUMNS if c not in _GAPS), *_DERIVED)
"""The export's columns: the journal's ``requests`` in their order (seconds for
nanoseconds, the gaps apart), then ``trace_id`` and ``source_record`` (derived, in
``records()``)."""


def records(reader: JournalReader, *, itl: bool = False) -> Iterator[dict[str, Any]]:
    """One dict per request, in journal order."""
    run_id = reader.stored.run_id
    traced = reader.stored.config.traced()
    named = _record_names(reader)
    for row in reader.request_rows(itl=itl):
        rec = _record(row, itl)
        target = rec["target"]
        rec["trace_id"] = trace_id(run_id, target, rec["seq"]) if target in traced else None
        rec["source_record"] = named(rec["seq"], rec["conversation"])
        yield rec


def _record_names(reader: JournalReader) -> Callable[[int, int | None], str | None]:
    """(seq, conversation) -> the dataset record it was built from (None: none, synthetic)."""
    wl = reader.stored.config.workload
    source = None
    if wl.prompts.source != "synthetic":
        source = stored_source(wl.prompts, wl.seed, wl.tokenizer)
    if source is None:
        return lambda _seq, _conv: None
    found = source

    def named(seq: int, conv: int | None) -> str:
        # a conversation replays the dataset's item ``conv`` (cycled), a request its seq's
        return found.label(conv % len(found) if conv is not None else found.record_of(seq))

    return named


def _record(row: sqlite3.Row, itl: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in COLUMNS:
        src = _SECONDS.get(col)
        if src is not None:
            v = row[src]
            out[col] = None if v is None else v / 1e9
        elif col in ("oom", "usage_reported"):
            out[col] = bool(row[col])
        elif col not in _DERIVED:  # derived, in records()
            out[col] = row[col]
    if itl:
        exact = row["itl"]  # else compact: bucket middles, ascending (docs/journal.md)
        gaps = list(unpack_itl(exact)) if exact else [g // 1000 for g in row_itl_ns(row)]
        out["itl_us"] = gaps if exact else None
        out["itl_sorted_us"] = None if exact else gaps
    return out


ITL_COLUMNS = ("itl_us", "itl_sorted_us")


def itl_note(reader: JournalReader) -> str | None:
    """What ``--itl`` gives for a run whose rows keep compact gaps (their order is lost)."""
    journal = reader.stored.config.journal
    if journal.itl != "compact" or not journal.itl_gaps:
        return None
    return (
        "itl_sorted_us: this run kept each request's ITL gaps as 2 % buckets "
        "(journal.itl: compact, the default): their middles, in ascending order, not the "
        "gaps in the order they came; journal.itl: exact keeps that order (itl_us)"
    )


def export(
    run_dir: Path,
    fmt: str,
    out: IO[str],
    *,
    itl: bool = False,
    salvage: bool = False,
    warn: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> int:
    """Write every request row to ``out``; returns how many. ``salvage``: a damaged
    journal's readable rows (integrity.py); ``warn`` hears what the journal lost, first,
    ``note`` what ``--itl`` gives for this run (``itl_note``)."""
    n = 0
    with JournalReader(run_dir, salvage=salvage) as reader:
        for lost in (reader.salvaged, reader.loss):
            if lost is not None and warn is not None:
                warn(lost.describe())
        said = itl_note(reader) if itl and note is not None else None
        if said is not None and note is not None:
            note(said)
        if fmt == "jsonl":
            for rec in records(reader, itl=itl):
                out.write(json.dumps(rec, separators=(",", ":")) + "\n")
                n += 1
            return n
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*COLUMNS, *ITL_COLUMNS] if itl else COLUMNS)
        for rec in records(reader, itl=itl):
            values = ["" if rec[c] is None else _csv(rec[c]) for c in COLUMNS]
            if itl:
                values += [" ".join(map(str, rec[c] or ())) for c in ITL_COLUMNS]
            writer.writerow(values)
            n += 1
    return n


def _csv(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return repr(value)
    return value
