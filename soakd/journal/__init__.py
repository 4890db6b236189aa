"""Journal room: the run's durable store (SQLite in WAL mode) and the resume state read from it.

One package, one concern per module (docs/architecture.md, "The journal's rooms"):

- ``schema``: the tables, the versions (v1 -> v2 -> v3 migration), opening and checking a file;
- ``codec``: Outcome <-> row, ITL gaps as BLOBs (compact or exact), ``TargetStats`` blobs;
- ``batch``: outcomes as their records (soakd/outcome_record.py), as they travel to the writer;
- ``jsondoc``: the one JSON codec of the journal's dataclasses (events, the link's frames);
- ``messages``: the frames between soakd and the writer process, one dataclass each;
- ``handoff``: the one queue between the event loop and the writer's link, both ways;
- ``writer``: ``Journal``, the sink the run records to, on the event loop;
- ``link``: ``WriterLink``, the link thread and the writer process it starts and restarts;
- ``process``: the writer process (``python -m soakd.journal.process``);
- ``opening``: the writer opens the database and reads back what it continues from;
- ``store``: the writer's side: the batches, the commit rule, retention;
- ``counts``: the writer's own figures, sent to soakd's ``JournalMetrics``;
- ``progress``: the session's heartbeat of the plan clock, downtime, run events;
- ``rollups``: totals, histogram buckets and rollup windows beside the rows;
- ``budget``, ``retention``: the disk budget and reserve, deleting old rows in long runs;
- ``resume``: ``ResumeState``, ``read_resume_state``, the run-dir lock;
- ``integrity``, ``mark``: damage checks, the mark a lost WAL is counted against, salvage;
- ``reader``: ``JournalReader`` for the report and the export.

Everything other modules import is re-exported here: ``from soakd.journal import X``. The
names are loaded when first used (PEP 562), so the writer process, which imports the
package, loads only its own rooms: not the config models, the reader or soakd's side.
The config as stored (``config_doc``) lives in ``soakd.config.redact``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soakd.config.redact import config_doc
    from soakd.journal.codec import (
        outcome_from_row,
        pack_itl,
        pack_itl_hist,
        row_itl_ns,
        stats_from_blob,
        stats_to_blob,
        unpack_itl,
        unpack_itl_hist,
    )
    from soakd.journal.handoff import FoldSink, HandOff
    from soakd.journal.integrity import SALVAGED_FILE, Loss, Salvaged
    from soakd.journal.mark import MARK_FILE, Mark
    from soakd.journal.messages import Restored, RunInfo
    from soakd.journal.progress import PlanClock
    from soakd.journal.reader import JournalReader, Rollup
    from soakd.journal.resume import ResumeState, plan_doc, read_resume_state
    from soakd.journal.rollups import rollup_window_ns, unfolded_rollups
    from soakd.journal.schema import (
        APPLICATION_ID,
        JOURNAL_FILE,
        LOCK_FILE,
        PAGE_SIZE,
        READS_SCHEMAS,
        REQUEST_COLUMNS,
        SCHEMA_VERSION,
        JournalDamaged,
        JournalError,
    )
    from soakd.journal.store import IDLE_HEARTBEAT_S, MAX_BATCH, RETENTION_EVERY_S, RETRY_MAX_S
    from soakd.journal.writer import Journal, open_journal

_WHERE = {
    "config_doc": "soakd.config.redact",
    **dict.fromkeys(
        (
            "outcome_from_row",
            "pack_itl",
            "pack_itl_hist",
            "row_itl_ns",
            "stats_from_blob",
            "stats_to_blob",
            "unpack_itl",
            "unpack_itl_hist",
        ),
        "soakd.journal.codec",
    ),
    "FoldSink": "soakd.journal.handoff",
    "SALVAGED_FILE": "soakd.journal.integrity",
    "Loss": "soakd.journal.integrity",
    "Salvaged": "soakd.journal.integrity",
    "MARK_FILE": "soakd.journal.mark",
    "Mark": "soakd.journal.mark",
    "HandOff": "soakd.journal.handoff",
    "PlanClock": "soakd.journal.progress",
    "JournalReader": "soakd.journal.reader",
    "Rollup": "soakd.journal.reader",
    "ResumeState": "soakd.journal.resume",
    "plan_doc": "soakd.journal.resume",
    "read_resume_state": "soakd.journal.resume",
    "rollup_window_ns": "soakd.journal.rollups",
    "unfolded_rollups": "soakd.journal.rollups",
    **dict.fromkeys(
        (
            "APPLICATION_ID",
            "JOURNAL_FILE",
            "LOCK_FILE",
            "PAGE_SIZE",
            "READS_SCHEMAS",
            "REQUEST_COLUMNS",
            "SCHEMA_VERSION",
            "JournalDamaged",
            "JournalError",
        ),
        "soakd.journal.schema",
    ),
    **dict.fromkeys(
        (
            "IDLE_HEARTBEAT_S",
            "MAX_BATCH",
            "RETENTION_EVERY_S",
            "RETRY_MAX_S",
        ),
        "soakd.journal.store",
    ),
    "Restored": "soakd.journal.messages",
    "RunInfo": "soakd.journal.messages",
    "Journal": "soakd.journal.writer",
    "open_journal": "soakd.journal.writer",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)


__all__ = [
    "APPLICATION_ID",
    "IDLE_HEARTBEAT_S",
    "JOURNAL_FILE",
    "LOCK_FILE",
    "MARK_FILE",
    "MAX_BATCH",
    "PAGE_SIZE",
    "READS_SCHEMAS",
    "REQUEST_COLUMNS",
    "RETENTION_EVERY_S",
    "RETRY_MAX_S",
    "SALVAGED_FILE",
    "SCHEMA_VERSION",
    "FoldSink",
    "HandOff",
    "Journal",
    "JournalDamaged",
    "JournalError",
    "JournalReader",
    "Loss",
    "Mark",
    "PlanClock",
    "Restored",
    "ResumeState",
    "Rollup",
    "RunInfo",
    "Salvaged",
    "config_doc",
    "open_journal",
    "outcome_from_row",
    "pack_itl",
    "pack_itl_hist",
    "plan_doc",
    "read_resume_state",
    "rollup_window_ns",
    "row_itl_ns",
    "stats_from_blob",
    "stats_to_blob",
    "unfolded_rollups",
    "unpack_itl",
    "unpack_itl_hist",
]
