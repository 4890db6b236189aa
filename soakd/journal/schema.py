"""Journal schema room: the tables, the schema versions, opening a journal and checking it.

The version is in ``PRAGMA user_version`` and in ``meta``; ``PRAGMA application_id`` tells a
soakd journal from any other SQLite file. v2 added the ``missed`` table; v3 the ``itl_hist``
column of ``requests`` (compact ITL gaps, codec.py); v4 the ``usage_delta`` and
``usage_rejected`` columns and the ``notes`` table (soakd/measure/notes.py); v5 lets
``requests.output_tokens`` be NULL (unknown: a non-streamed answer with text whose usage was
absent or not taken); v6 the ``conversation`` and ``turn`` columns of ``requests`` (NULL:
a single request, no conversation). An older journal is brought up to date when this soakd
continues it (``migrate``: v1 -> ... -> v6, nothing rewritten; its old rows keep their exact
gaps, NULL usage columns and NULL conversations) and read as it is (``request_columns``).
docs/journal.md has the table list.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from soakd import __version__

SCHEMA_VERSION = 6
READS_SCHEMAS = frozenset({1, 2, 3, 4, 5, 6})
MIGRATES_FROM = frozenset({1, 2, 3, 4, 5})  # continued after ``migrate``
_MISSED_TABLE = """CREATE TABLE missed (
    target TEXT NOT NULL, phase TEXT NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (target, phase, reason)
) WITHOUT ROWID"""
"""v2: planned sends not made (soakd/workload/ledger.py), whole run. A v1 journal gains the
table, empty, when a v2 soakd continues it."""
_ITL_HIST_COLUMN = "ALTER TABLE requests ADD COLUMN itl_hist BLOB"
"""v3: ITL gaps as ``Digest`` buckets (codec.pack_itl_hist), the default; ``itl`` keeps exact
gaps only with ``journal.itl: exact``. Added last, so a v2 table gains it as it is."""
_USAGE_COLUMNS = (
    "ALTER TABLE requests ADD COLUMN usage_delta INTEGER",
    "ALTER TABLE requests ADD COLUMN usage_rejected TEXT",
)
"""v4: per request, the server's usage against the stream: ``usage_delta`` (usage's
completion tokens minus the content chunks streamed; NULL: not a stream, or no usage
taken) and ``usage_rejected`` (why a usage was not taken; NULL: none was rejected)."""
_NOTES_TABLE = """CREATE TABLE notes (
    target TEXT NOT NULL, note TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (target, note)
) WITHOUT ROWID"""
"""v4: per target, how many answers carried each note (soakd/measure/notes.py), dropped rows
included: the counters a resume continues, and the report's notes."""
_OUTPUT_NOT_NULL = "output_tokens INTEGER NOT NULL,"
_OUTPUT_NULLABLE = "output_tokens INTEGER,          -- NULL: unknown (v5)"
"""v5: ``requests.output_tokens`` NULL when the count is unknown. Before v5 the column was
NOT NULL; ``migrate`` drops the constraint in place (``_drop_output_not_null``)."""
_CONVERSATION_COLUMNS = (
    "ALTER TABLE requests ADD COLUMN conversation INTEGER",
    "ALTER TABLE requests ADD COLUMN turn INTEGER",
)
"""v6: the conversation a request is a turn of and its turn, from 0 (both NULL: a single
request, ``Outcome.conversation`` -1). Added last: an older table gains them as it is,
its rows NULL."""
APPLICATION_ID = 0x736F616B  # "soak": tells a soakd journal from any other SQLite file
JOURNAL_FILE = "journal.db"
LOCK_FILE = "journal.lock"
PAGE_SIZE = 16384

_SCHEMA = (
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    session INTEGER NOT NULL,
    wall REAL NOT NULL,              -- time.time() at send
    target TEXT NOT NULL,
    phase TEXT NOT NULL,
    seq INTEGER NOT NULL,
    scheduled_ns INTEGER NOT NULL,   -- plan offsets (ns since the plan's start)
    sent_ns INTEGER,                 -- NULL: never sent
    end_ns INTEGER NOT NULL,
    lag_ns INTEGER,
    ttft_ns INTEGER,
    e2e_ns INTEGER,
    tpot_ns INTEGER,
    itl_count INTEGER NOT NULL,
    itl_mean_ns INTEGER,
    itl_p50_ns INTEGER,
    itl_max_ns INTEGER,
    itl BLOB,                        -- every gap: uint32 little-endian microseconds
    status INTEGER NOT NULL,
    error TEXT,                      -- NULL: ok
    oom INTEGER NOT NULL,
    prompt_tokens INTEGER,
    output_tokens INTEGER,          -- NULL: unknown (v5)
    usage_reported INTEGER NOT NULL
);
CREATE TABLE series (id INTEGER PRIMARY KEY, name TEXT NOT NULL, labels TEXT NOT NULL,
                     UNIQUE (name, labels));
CREATE TABLE samples (wall REAL NOT NULL, series INTEGER NOT NULL, value REAL NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY, session INTEGER NOT NULL, wall REAL NOT NULL,
                     offset_ns INTEGER, kind TEXT NOT NULL, data TEXT NOT NULL);
CREATE TABLE progress (
    session INTEGER PRIMARY KEY, version TEXT NOT NULL, pid INTEGER NOT NULL,
    started_wall REAL NOT NULL, started_offset_ns INTEGER NOT NULL,
    wall REAL NOT NULL, offset_ns INTEGER NOT NULL, phase_index INTEGER,
    seqs TEXT NOT NULL, rollup_from_id INTEGER NOT NULL, stopped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE totals (
    target TEXT NOT NULL, phase TEXT NOT NULL, outcome TEXT NOT NULL,
    status_class TEXT NOT NULL, requests INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, oom INTEGER NOT NULL,
    PRIMARY KEY (target, phase, outcome, status_class)
) WITHOUT ROWID;
CREATE TABLE histograms (kind TEXT NOT NULL, target TEXT NOT NULL, counts TEXT NOT NULL,
                         sum REAL NOT NULL, PRIMARY KEY (kind, target)) WITHOUT ROWID;
CREATE TABLE rollups (
    target TEXT NOT NULL, phase TEXT NOT NULL, window INTEGER NOT NULL,
    upto_id INTEGER NOT NULL, wall_min REAL NOT NULL, wall_max REAL NOT NULL,
    stats BLOB NOT NULL, PRIMARY KEY (target, phase, window)
) WITHOUT ROWID;
"""
    + _MISSED_TABLE
    + ";\n"
    + _ITL_HIST_COLUMN
    + ";\n"
    + ";\n".join((*_USAGE_COLUMNS, _NOTES_TABLE, *_CONVERSATION_COLUMNS))
    + ";\n"
)

INSERT_REQUEST = (
    "INSERT INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
REQUEST_COLUMNS = (
    "id",
    "session",
    "wall",
    "target",
    "phase",
    "seq",
    "scheduled_ns",
    "sent_ns",
    "end_ns",
    "lag_ns",
    "ttft_ns",
    "e2e_ns",
    "tpot_ns",
    "itl_count",
    "itl_mean_ns",
    "itl_p50_ns",
    "itl_max_ns",
    "itl",
    "status",
    "error",
    "oom",
    "prompt_tokens",
    "output_tokens",
    "usage_reported",
    "itl_hist",
    "usage_delta",
    "usage_rejected",
    "conversation",
    "turn",
)


def request_columns(version: int, *, itl: bool = True) -> str:
    """The select list of ``requests`` for a journal of schema ``version`` (``itl_hist`` is
    NULL before v3, the usage columns before v4, the conversation's before v6); without
    ``itl``, both gap columns are left out."""
    cols = [c for c in REQUEST_COLUMNS if itl or c not in ("itl", "itl_hist")]
    since = {"itl_hist": 3, "usage_delta": 4, "usage_rejected": 4, "conversation": 6, "turn": 6}
    return ", ".join(f"NULL AS {c}" if version < since.get(c, 0) else c for c in cols)


class JournalError(Exception):
    """A journal that cannot be used as asked, phrased for the user as one line."""


class JournalDamaged(JournalError):
    """A journal whose pages cannot be read whole (integrity.py: ``--salvage`` may help)."""


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """An autocommit connection (transactions are explicit), or JournalError."""
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.Error as exc:
        raise JournalError(f"{path}: cannot open the journal: {exc}") from None
    return conn


def create(conn: sqlite3.Connection, meta: dict[str, Any]) -> None:
    """A new journal's tables, its identity pragmas and its ``meta`` rows, in one transaction."""
    conn.execute("BEGIN")
    for stmt in _SCHEMA.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.executemany(
        "INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()]
    )
    conn.execute("COMMIT")


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a journal this soakd continues to SCHEMA_VERSION, in one transaction:
    v1 -> v2 the missed table, v2 -> v3 the itl_hist column, v3 -> v4 the usage columns
    and the notes table, v4 -> v5 ``requests.output_tokens`` nullable, v5 -> v6 the
    conversation columns (nothing else changed). JournalError when the requests table is
    not one soakd made."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in MIGRATES_FROM:
        return  # current, or refused by check_schema
    conn.execute("BEGIN")
    if version == 1:
        conn.execute(_MISSED_TABLE)
    columns = {c[1] for c in conn.execute("PRAGMA table_info(requests)")}
    if "itl_hist" not in columns:
        conn.execute(_ITL_HIST_COLUMN)
    if "usage_delta" not in columns:
        for stmt in _USAGE_COLUMNS:
            conn.execute(stmt)
        conn.execute(_NOTES_TABLE)
    _drop_output_not_null(conn)
    if "conversation" not in columns:
        for stmt in _CONVERSATION_COLUMNS:
            conn.execute(stmt)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    conn.execute("COMMIT")


def _drop_output_not_null(conn: sqlite3.Connection) -> None:
    """v5: drop ``requests.output_tokens``' NOT NULL in place, inside the caller's
    transaction, by SQLite's own procedure for removing a NOT NULL constraint (its ALTER
    TABLE page, "Making Other Kinds Of Table Schema Changes"): the table's definition is
    edited, no row is read or rewritten, whatever the journal's size."""
    nullable = {c[1]: not c[3] for c in conn.execute("PRAGMA table_info(requests)")}
    if nullable.get("output_tokens"):
        return
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'requests'"
    ).fetchone()
    if sql.count(_OUTPUT_NOT_NULL) != 1:
        conn.execute("ROLLBACK")
        raise JournalError("the journal's requests table is not one soakd made: not continued")
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute(
            "UPDATE sqlite_schema SET sql = ? WHERE type = 'table' AND name = 'requests'",
            (sql.replace(_OUTPUT_NOT_NULL, _OUTPUT_NULLABLE),),
        )
        conn.execute(f"PRAGMA schema_version = {version + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")


def check_schema(conn: sqlite3.Connection, path: Path, *, writing: bool) -> dict[str, Any]:
    """The journal's ``meta``, once it is known to be a soakd journal this soakd can read
    (``writing``: and continue); JournalError otherwise."""
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise JournalError(f"{path}: not a soakd journal")
        meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    except (sqlite3.DatabaseError, ValueError, TypeError) as exc:  # TypeError: a NULL value
        raise JournalDamaged(f"{path}: not a readable soakd journal ({exc})") from None
    if version not in READS_SCHEMAS:
        by = meta.get("soakd_version", "?")
        newer = version > SCHEMA_VERSION
        raise JournalError(
            f"{path}: journal schema v{version} (written by soakd {by}) is "
            + ("newer than" if newer else "not readable by")
            + f" this soakd {__version__} (schema v{SCHEMA_VERSION})"
            + ("; upgrade soakd" if newer else "; use the soakd version that wrote it")
        )
    if writing and version != SCHEMA_VERSION and version not in MIGRATES_FROM:
        raise JournalError(
            f"{path}: journal schema v{version} can be read but not continued by soakd "
            f"{__version__}"
        )
    return meta
