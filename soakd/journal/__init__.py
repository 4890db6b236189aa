"""Journal room: the run's durable store (SQLite in WAL mode) and the resume state read from it.

One package, one concern per module (docs/architecture.md, "The journal's rooms"):

- ``schema``: the tables, the versions (v1 -> v2 -> v3 migration), opening and checking a file;
- ``codec``: Outcome <-> row, ITL gaps as BLOBs (compact or exact), ``TargetStats`` blobs;
- ``handoff``: the one queue between the event loop and the writer thread, both ways;
- ``writer``: ``Journal``, the sink the run records to, and its writer thread;
- ``progress``: the session's heartbeat of the plan clock, downtime, run events;
- ``rollups``: totals, histogram buckets and rollup windows beside the rows;
- ``retention``: deleting old rows in very long runs;
- ``resume``: ``ResumeState``, ``read_resume_state``, the run-dir lock;
- ``integrity``: damage checks, the mark a lost WAL is counted against, salvage;
- ``reader``: ``JournalReader`` for the report and the export.

Everything other modules import is re-exported here: ``from soakd.journal import X``.
The config as stored (``config_doc``) lives in ``soakd.config.redact``.
"""

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
from soakd.journal.handoff import PUMP_SLICE, HandOff
from soakd.journal.integrity import MARK_FILE, SALVAGED_FILE, Loss, Mark, Salvaged
from soakd.journal.progress import PlanClock
from soakd.journal.reader import JournalReader, Rollup
from soakd.journal.resume import Restored, ResumeState, plan_doc, read_resume_state
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
from soakd.journal.writer import (
    IDLE_HEARTBEAT_S,
    MAX_BATCH,
    RETENTION_EVERY_S,
    RETRY_MAX_S,
    Journal,
    RunInfo,
    open_journal,
)

__all__ = [
    "APPLICATION_ID",
    "IDLE_HEARTBEAT_S",
    "JOURNAL_FILE",
    "LOCK_FILE",
    "MARK_FILE",
    "MAX_BATCH",
    "PAGE_SIZE",
    "PUMP_SLICE",
    "READS_SCHEMAS",
    "REQUEST_COLUMNS",
    "RETENTION_EVERY_S",
    "RETRY_MAX_S",
    "SALVAGED_FILE",
    "SCHEMA_VERSION",
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
