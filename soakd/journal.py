"""Journal room: the run's durable store (SQLite in WAL mode) and the resume state read from it.

One writer thread owns the database. The event loop only appends to a bounded deque
(``record``/``sample``/``event``: a length check and an append, never IO, never a
lock wait); the thread drains it every ``flush_interval`` (0.5 s) into one
transaction. Durability (docs/journal.md has the long form):

- WAL makes every commit atomic: after any crash the journal opens at the last
  commit, never half-written.
- A killed process loses nothing committed (the WAL is in the OS page cache); what it
  loses is the batch in memory, at most one flush interval.
- A power cut loses what the disk never got. With ``synchronous=NORMAL`` SQLite syncs
  the WAL only at checkpoints (every ~1000 pages: minutes of a busy run), so that is
  not "the last second"; soakd therefore defaults to ``synchronous=FULL``, one fsync
  per commit, which at 2 commits/s costs nothing measurable (docs/journal.md).

Prometheus counters are fed *after* the commit (the writer hands committed outcomes
back to the loop), so the counters Prometheus scrapes never exceed what the journal
holds, and a resumed run that restores them from the journal cannot step backwards
(which Prometheus would read as a reset and turn into a spike in every rate).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import json
import os
import sqlite3
import sys
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import structlog

from soakd import __version__
from soakd.analysis import Digest, TargetStats
from soakd.config import Config, JournalConfig
from soakd.metrics import HISTOGRAM_BUCKETS, NS, JournalMetrics
from soakd.model import ErrorKind, Outcome, Phase, Plan, Sample, status_class
from soakd.types import OutcomeSink

log = structlog.get_logger()

SCHEMA_VERSION = 2
READS_SCHEMAS = frozenset({1, 2})
_MISSED_TABLE = """CREATE TABLE missed (
    target TEXT NOT NULL, phase TEXT NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (target, phase, reason)
) WITHOUT ROWID"""
"""v2: planned sends not made (soakd/workload/ledger.py), whole run. A v1 journal gains the
table, empty, when a v2 soakd continues it."""
APPLICATION_ID = 0x736F616B  # "soak": tells a soakd journal from any other SQLite file
JOURNAL_FILE = "journal.db"
LOCK_FILE = "journal.lock"
PAGE_SIZE = 16384
MAX_BATCH = 5000  # records per transaction; more wait for the next one
RETENTION_EVERY_S = 60.0
IDLE_HEARTBEAT_S = 1.0
RETRY_MAX_S = 30.0
_BIG = sys.byteorder == "big"

# --- schema ---------------------------------------------------------------------------------

_SCHEMA = """
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
    output_tokens INTEGER NOT NULL,
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
""" + _MISSED_TABLE + ";\n"

_INSERT_REQUEST = "INSERT INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
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
)


PUMP_SLICE = 64
"""Committed outcomes handed to Metrics per event-loop callback."""


class JournalError(Exception):
    """A journal that cannot be used as asked, phrased for the user as one line."""


class PlanClock(Protocol):
    """What the journal reads from the runner (from its own thread: plain attribute reads)."""

    @property
    def origin_ns(self) -> int: ...
    @property
    def phase(self) -> Phase | None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def next_seq(self) -> dict[str, int]: ...
    @property
    def missed(self) -> dict[tuple[str, str, str], int]: ...


# --- documents stored in meta ----------------------------------------------------------------

_SECRETISH = ("auth", "key", "token", "secret", "password", "cookie", "session", "signature")
_UNCOMPARED = ("exporter", "logging", "journal", "report", "probes", "run.drain_timeout")


def config_doc(cfg: Config) -> dict[str, Any]:
    """The effective config as stored: key *references* only (never a key), and header
    values or URL query values whose name looks secret replaced, in case someone put one
    there."""
    doc = cfg.model_dump(mode="json")
    for target in doc.get("targets", []):
        for name in list(target.get("headers", {})):
            if any(s in name.lower() for s in _SECRETISH):
                target["headers"][name] = "<redacted>"
        for key in ("base_url", "metrics_url", "health_url", "proxy"):
            if target.get(key):
                target[key] = _scrub_url(target[key])
    gpu = doc.get("gpu", {})
    if gpu.get("dcgm_url"):
        gpu["dcgm_url"] = _scrub_url(gpu["dcgm_url"])
    return doc


def _scrub_url(url: str) -> str:
    parts = urlsplit(url)
    if not parts.query:
        return url
    query = "&".join(f"{kv.partition('=')[0]}=<redacted>" for kv in parts.query.split("&"))
    return urlunsplit(parts._replace(query=query))


def plan_doc(plan: Plan) -> dict[str, Any]:
    return {
        "scale": plan.scale,
        "phases": [
            {
                "index": p.index,
                "name": p.name,
                "start_ns": p.start_ns,
                "end_ns": p.end_ns,
                "loads": {
                    t: {
                        "mode": s.mode,
                        "concurrency": s.concurrency,
                        "rate": s.rate,
                        "rate_end": s.rate_end,
                        "max_in_flight": s.max_in_flight,
                    }
                    for t, s in sorted(p.loads.items())
                },
            }
            for p in plan.phases
        ],
    }


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted paths where two JSON documents differ (list items by ``name`` when they have one)."""
    if path.strip(".") in _UNCOMPARED:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _diff(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            name = x.get("name") if isinstance(x, dict) else None
            out += _diff(x, y, f"{path}[{name or i}]")
        return out
    return [] if a == b else [path or "config"]


def rollup_window_ns(plan: Plan) -> int:
    """The journal's aggregation window: 1 s for a short run, up to 60 s (72 h -> 4320
    windows), so a report has ~1000 points of history whatever the run's length."""
    seconds = min(60, max(1, round(plan.duration_ns / 1e9 / 1000)))
    return seconds * 1_000_000_000


# --- resume -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumeState:
    """What a new session needs to continue a run (read before anything else starts)."""

    run_id: str
    created_wall: float
    plan_start: datetime
    options: dict[str, float | None]
    config: dict[str, Any]
    plan: dict[str, Any]
    sessions: int
    offset_ns: int  # the plan clock at the last heartbeat
    last_wall: float
    next_seq: dict[str, int]
    finished: bool
    written_by: str

    def check(self, cfg: Config, plan: Plan, *, force: bool) -> list[str]:
        """Same config and plan as stored, or JournalError (``force``: the differences)."""
        diffs = _diff(self.config, config_doc(cfg))
        if not diffs and plan_doc(plan) != self.plan:
            diffs = ["plan"]
        if diffs and not force:
            shown = ", ".join(diffs[:5]) + (f" and {len(diffs) - 5} more" if len(diffs) > 5 else "")
            raise JournalError(
                f"run {self.run_id}: the config differs from the one the run started with "
                f"({shown}); resume with the original config, or pass --force to continue "
                "with this one (recorded in the journal)"
            )
        if plan.duration_ns and self.offset_ns >= plan.duration_ns:
            raise JournalError(
                f"run {self.run_id} already ran its whole plan; nothing is left to resume "
                "(use a new --run-dir, or `soakd report` on this one)"
            )
        return diffs


def _take_lock(run_dir: Path) -> int:
    """One soakd per run dir: an flock on journal.lock (released by the OS on any exit)."""
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise JournalError(f"{run_dir} is in use by another soakd (pid {holder})") from None
    return fd


def read_resume_state(path: Path) -> ResumeState | None:
    """The state of the run journaled at ``path``; None when there is no journal yet.

    Raises JournalError for a finished run, a run dir another soakd is writing, another
    program's file, or a schema this soakd cannot continue."""
    if not path.exists():
        return None
    os.close(_take_lock(path.parent))  # fail before anything touches the run dir
    conn = _connect(path, readonly=True)
    try:
        meta = _check_schema(conn, path, writing=True)
        rows = conn.execute(
            "SELECT session, wall, offset_ns, seqs, stopped FROM progress ORDER BY session"
        ).fetchall()
        seqs: dict[str, int] = {}
        for _, _, _, text, _ in rows:
            for name, n in json.loads(text).items():
                seqs[name] = max(seqs.get(name, 0), int(n))
        for name, top in conn.execute("SELECT target, MAX(seq) FROM requests GROUP BY target"):
            seqs[name] = max(seqs.get(name, 0), int(top) + 1)
        finished = (
            conn.execute(
                "SELECT 1 FROM events "
                "WHERE kind = 'run_stopped' AND json_extract(data, '$.completed')"
            ).fetchone()
            is not None
        )
    finally:
        conn.close()
    run_id = meta["run_id"]
    if finished:
        raise JournalError(
            f"run {run_id} in {path.parent} has finished; it is not restarted by accident "
            "(use a new --run-dir, or `soakd report` on this one)"
        )
    last = rows[-1] if rows else None
    return ResumeState(
        run_id=run_id,
        created_wall=float(meta["created_wall"]),
        plan_start=datetime.fromisoformat(meta["plan_start"]),
        options=meta["options"],
        config=meta["config"],
        plan=meta["plan"],
        sessions=len(rows),
        offset_ns=int(last[2]) if last else 0,
        last_wall=float(last[1]) if last else float(meta["created_wall"]),
        next_seq=seqs,
        finished=False,
        written_by=meta["soakd_version"],
    )


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.Error as exc:
        raise JournalError(f"{path}: cannot open the journal: {exc}") from None
    return conn


def _check_schema(conn: sqlite3.Connection, path: Path, *, writing: bool) -> dict[str, Any]:
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise JournalError(f"{path}: not a soakd journal")
        meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"{path}: not a readable soakd journal ({exc})") from None
    if version not in READS_SCHEMAS:
        by = meta.get("soakd_version", "?")
        newer = version > SCHEMA_VERSION
        raise JournalError(
            f"{path}: journal schema v{version} (written by soakd {by}) is "
            + ("newer than" if newer else "not readable by")
            + f" this soakd {__version__} (schema v{SCHEMA_VERSION})"
            + ("; upgrade soakd" if newer else "; use the soakd version that wrote it")
        )
    if writing and version != SCHEMA_VERSION:
        raise JournalError(
            f"{path}: journal schema v{version} can be read but not continued by soakd "
            f"{__version__}"
        )
    return meta


# --- rows -----------------------------------------------------------------------------------


def pack_itl(gaps_ns: array[int]) -> bytes:
    """Inter-token gaps as uint32 little-endian microseconds: 4 bytes a gap, ~71 min max."""
    try:
        packed = array("I", [g // 1000 for g in gaps_ns])
    except OverflowError:  # a negative or > 71 min gap: clamp (never seen, never fatal)
        packed = array("I", [min(max(g, 0) // 1000, 0xFFFFFFFF) for g in gaps_ns])
    if _BIG:
        packed.byteswap()
    return packed.tobytes()


def unpack_itl(blob: bytes | None) -> array[int]:
    """Microseconds, as packed by ``pack_itl``."""
    out = array("I")
    if blob:
        out.frombytes(blob)
        if _BIG:
            out.byteswap()
    return out


def outcome_from_row(row: Mapping[str, Any] | sqlite3.Row) -> Outcome:
    """An Outcome rebuilt from a row, on the plan-offset axis (for TargetStats.add)."""
    sent = row["sent_ns"]
    o = Outcome(row["target"], row["phase"], row["seq"], row["scheduled_ns"])
    o.sent_ns = sent or 0
    o.wall_start = row["wall"]
    if sent is not None and row["ttft_ns"] is not None:
        o.first_token_ns = sent + row["ttft_ns"]
    o.end_ns = sent + row["e2e_ns"] if sent is not None and row["e2e_ns"] is not None else 0
    o.status = row["status"]
    o.error = ErrorKind(row["error"]) if row["error"] else None
    o.oom = bool(row["oom"])
    o.prompt_tokens = row["prompt_tokens"]
    o.output_tokens = row["output_tokens"]
    o.usage_reported = bool(row["usage_reported"])
    o.itl_ns = array("q", [us * 1000 for us in unpack_itl(row["itl"])])
    return o


def stats_to_blob(stats: TargetStats) -> bytes:
    doc = {
        "requests": stats.requests,
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "output_tokens": stats.output_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "digests": {
            name: getattr(stats, name).to_state() for name in ("ttft", "e2e", "itl", "tpot", "lag")
        },
    }
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def stats_from_blob(blob: bytes) -> TargetStats:
    doc = json.loads(zlib.decompress(blob))
    stats = TargetStats(
        requests=doc["requests"],
        ok=doc["ok"],
        output_tokens=doc["output_tokens"],
        prompt_tokens=doc["prompt_tokens"],
    )
    stats.errors.update(doc["errors"])
    for name, state in doc["digests"].items():
        setattr(stats, name, Digest.from_state(state))
    return stats


def _copy(stats: TargetStats) -> TargetStats:
    out = TargetStats()
    out.merge(stats)
    return out


@dataclass(slots=True)
class _Window:
    """One rollup (target, phase, window) the writer holds in memory."""

    stats: TargetStats
    wall_min: float
    wall_max: float
    upto_id: int = 0  # rows of this window with id <= upto_id are in its stored row
    first_id: int = 0  # the first row not in the stored row yet (0: nothing unstored)


@dataclass(slots=True)
class _Batch:
    """One transaction's worth of records, and the aggregates they add."""

    items: list[Any]
    forwarded: bool = False
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    totals: dict[tuple[str, str, str, str], list[int]] = field(default_factory=dict)
    hists: dict[tuple[str, str], tuple[list[int], float]] = field(default_factory=dict)
    windows: dict[tuple[str, str, int], _Window] = field(default_factory=dict)


@dataclass(frozen=True)
class Restored:
    """What the journal held when this session opened it (for Metrics.restore)."""

    totals: list[tuple[str, str, str, str, int, int, int, int]]
    histograms: dict[tuple[str, str], tuple[list[int], float]]
    downtime_s: float
    resumes: int
    missed: dict[tuple[str, str, str], int] = field(default_factory=dict)  # sends not made


# --- the writer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """What the journal stores about the run when it creates it."""

    run_id: str
    config: dict[str, Any]
    plan: dict[str, Any]
    plan_start: datetime
    options: dict[str, float | None]
    window_ns: int


class Journal:
    """The run's journal: an OutcomeSink (``record``), a sample sink (``sample``), events.

    ``forward``: where committed outcomes go next (Metrics), on the loop that opened the
    journal. A full queue or a failing disk never stops the measurement: those outcomes
    are forwarded at once and counted (``soakd_journal_dropped_records_total``,
    ``soakd_journal_write_errors_total``)."""

    def __init__(
        self,
        path: Path,
        run: RunInfo,
        cfg: JournalConfig | None = None,
        *,
        metrics: JournalMetrics | None = None,
        forward: OutcomeSink | None = None,
        resume: ResumeState | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.run = run
        self.cfg = cfg or JournalConfig()
        self.metrics = metrics
        self._forward = forward
        self._resume = resume
        self._wall = wall
        self._q: deque[Any] = deque()
        self._qmax = self.cfg.queue_size
        self._wake_at = min(MAX_BATCH, self._qmax // 2)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: deque[list[Outcome]] = deque()
        self._pump_scheduled = False
        self._clock: PlanClock | None = None
        self._closed = False
        self._dropped: dict[tuple[str, str, str, str], tuple[int, int, int, int]] = {}
        self._drop_logged = False
        self.restored: Restored | None = None
        self.session = 0
        self.downtime_s = 0.0
        # writer-thread state
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._next_id = 1
        self._next_series = 1
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._totals: dict[tuple[str, str, str, str], list[int]] = {}
        self._hists: dict[tuple[str, str], tuple[list[int], float]] = {}
        self._windows: dict[tuple[str, str, int], _Window] = {}
        self._window_ns = run.window_ns
        self._pending: _Batch | None = None
        self._frozen_offset: int | None = None
        self._clock_seen = False
        self._last_commit = 0.0
        self._last_offset = resume.offset_ns if resume else 0
        self._started_offset = self._last_offset
        self._started_wall = 0.0
        self._last_retention = 0.0
        self._errors_in_row = 0
        self._retry_at = 0.0
        self._early: set[int] = set()  # ids of outcomes forwarded before their commit
        self._seqs: dict[str, int] = dict(resume.next_seq) if resume else {}
        self._missed: dict[tuple[str, str, str], int] = {}  # as committed

    # --- lifecycle (loop side) ---------------------------------------------------------------

    def start(self) -> None:
        """Open (or create) the database in the writer thread; raises JournalError."""
        if self._loop is None:
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._main, name="soakd-journal", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            self._thread.join()
            err = self._open_error
            if isinstance(err, JournalError):
                raise err
            raise JournalError(f"{self.path}: cannot open the journal: {err}") from err
        m, restored = self.metrics, self.restored
        if m is not None:
            m.queue_depth.set_function(self._q.__len__)
            if restored is not None:  # continue the run's own counters too
                m.downtime.inc(restored.downtime_s)
                m.resumes.inc(restored.resumes + (self._resume is not None))

    def attach(self, clock: PlanClock) -> None:
        """Read the plan clock from the runner: offsets of rows, heartbeats, seq numbers."""
        self._clock = clock

    def close(self, completed: bool = False) -> None:
        """Write everything still queued, the final heartbeat and the stop event; blocks."""
        if self._closed:
            return
        self.event("run_stopped", completed=completed)
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._pump()

    async def aclose(self, completed: bool = False) -> None:
        if self._closed:
            return
        await asyncio.to_thread(self.close, completed)
        self._pump()

    # --- the hot path (loop side) --------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        """OutcomeSink: enqueue, or (queue full, journal closed) count and forward now."""
        q = self._q
        n = len(q)
        if n < self._qmax and not self._closed:
            if self._errors_in_row and self._forward is not None:
                # the disk is failing: the metrics must not wait for it (nor freeze until
                # the queue fills); once committed, _hand_back does not count it twice
                self._early.add(id(outcome))
                self._forward.record(outcome)
            q.append(outcome)
            if n == self._wake_at:
                self._wake.set()
            return
        if self._closed:  # after the run: nothing left to journal it
            if self._forward is not None:
                self._forward.record(outcome)
            return
        self._drop("request")
        o = outcome
        key = (o.target, o.phase, o.outcome, status_class(o.status))
        d = self._dropped.get(key, (0, 0, 0, 0))
        self._dropped[key] = (
            d[0] + 1,
            d[1] + o.output_tokens,
            d[2] + (o.prompt_tokens or 0),
            d[3] + o.oom,
        )
        if self._forward is not None:
            self._forward.record(outcome)

    def sample(self, sample: Sample) -> None:
        """A probe reading (the probes' ``emit``)."""
        if len(self._q) < self._qmax and not self._closed:
            self._q.append(sample)
        else:
            self._drop("sample")

    def event(self, kind: str, **data: Any) -> None:
        """A run event (phase change, stop...). Events are rare: never dropped."""
        if self._closed:
            return
        self._q.append(("event", self._wall(), self._offset_now(), kind, data))

    def _drop(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.dropped.labels(kind).inc()
        if not self._drop_logged:
            self._drop_logged = True
            log.error(
                "journal_queue_full",
                kind=kind,
                queue=len(self._q),
                note="records are dropped from the journal (metrics go on); "
                "the disk may be too slow or stalled",
            )

    def _offset_now(self) -> int | None:
        clock = self._clock
        if clock is None or not clock.origin_ns:
            return None
        return time.perf_counter_ns() - clock.origin_ns

    def _pump(self) -> None:
        """On the loop: committed outcomes to the next sink (Metrics)."""
        self._pump_scheduled = False
        sink = self._forward
        while self._done:
            try:
                batch = self._done.popleft()
            except IndexError:  # emptied by a pump on another thread meanwhile
                return
            if sink is not None:
                for o in batch:
                    sink.record(o)

    def _pump_slice(self) -> None:
        """On the loop: one slice of committed outcomes to Metrics, then yield.

        A whole commit (up to half a second of outcomes) in one callback held the loop
        ~5-10 ms at 500 req/s, stamping tokens read meanwhile late; slices of
        ``PUMP_SLICE`` keep each callback well under a millisecond."""
        self._pump_scheduled = False
        try:
            batch = self._done.popleft()
        except IndexError:
            return
        sink = self._forward
        if sink is not None:
            for o in batch:
                sink.record(o)
        if self._done and not self._pump_scheduled and self._loop is not None:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump_slice)

    def _hand_back(self, outcomes: list[Outcome]) -> None:
        """From the writer thread: give committed outcomes back to the loop."""
        early = self._early
        if early:  # forwarded by record() while the disk was failing
            kept = []
            for o in outcomes:
                if id(o) in early:
                    early.discard(id(o))
                else:
                    kept.append(o)
            outcomes = kept
        if not outcomes or self._forward is None:
            return
        for i in range(0, len(outcomes), PUMP_SLICE):
            self._done.append(outcomes[i : i + PUMP_SLICE])
        loop = self._loop
        if loop is None:
            self._pump()
            return
        if not self._pump_scheduled:
            self._pump_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: close() pumps
                loop.call_soon_threadsafe(self._pump_slice)

    # --- the writer thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._open()
        except BaseException as exc:  # handed to start(), which raises it
            self._open_error = exc
            self._ready.set()
            self._unlock()
            return
        self._ready.set()
        try:
            interval = self.cfg.flush_interval
            while not self._stop.is_set():
                if len(self._q) < MAX_BATCH or self._pending is not None:
                    self._wake.wait(interval)  # a backlog of full batches: no pause
                self._wake.clear()
                self._cycle()
            self._final()
        except Exception:
            log.exception("journal_writer_failed")
        finally:
            with contextlib.suppress(sqlite3.Error):
                if self._conn is not None:
                    self._conn.close()
            self._unlock()

    def _lock(self) -> None:
        fd = _take_lock(self.path.parent)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open(self) -> None:
        self._lock()
        new = not self.path.exists()
        if new and self._resume is not None:
            raise JournalError(f"{self.path}: the journal vanished before the resume")
        conn = self._conn = _connect(self.path, readonly=False)
        if new:  # rows of 2 KB (512 ITL gaps) half-fill 4 KiB pages; 16 KiB ones hold 7
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.cfg.synchronous.upper()}")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # WAL back to 64 MiB after use
        now = self._wall()
        if new:
            conn.execute("BEGIN")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            r = self.run
            doc = {
                "schema_version": SCHEMA_VERSION,
                "soakd_version": __version__,
                "run_id": r.run_id,
                "created_wall": now,
                "created": datetime.fromtimestamp(now, UTC).isoformat(),
                "plan_start": r.plan_start.isoformat(),
                "options": r.options,
                "config": r.config,
                "plan": r.plan,
                "window_ns": r.window_ns,
            }
            conn.executemany(
                "INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in doc.items()]
            )
            conn.execute("COMMIT")
        elif conn.execute("PRAGMA user_version").fetchone()[0] == 1:
            conn.execute("BEGIN")
            conn.execute(_MISSED_TABLE)  # v1 -> v2: nothing else changed
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        meta = _check_schema(conn, self.path, writing=True)
        if meta["run_id"] != self.run.run_id:
            raise JournalError(f"{self.path}: holds run {meta['run_id']}, not {self.run.run_id}")
        self._window_ns = int(meta["window_ns"])
        self._load_state(conn)
        self._started_wall = now
        conn.execute("BEGIN")
        self._repair(conn)
        conn.execute(
            "INSERT INTO progress VALUES (?,?,?,?,?,?,?,?,?,?,0)",
            (
                self.session,
                __version__,
                os.getpid(),
                now,
                self._started_offset,
                now,
                self._started_offset,
                None,
                json.dumps(self._seqs),
                self._next_id,
            ),
        )
        if self._resume is None:
            self._insert_event(conn, now, 0, "run_started", {"version": __version__})
        else:
            # the downtime is written when the plan clock runs again (_clock_started)
            self._insert_event(
                conn,
                now,
                self._started_offset,
                "run_resumed",
                {"version": __version__, "session": self.session},
            )
        conn.execute("COMMIT")
        self._update_size()

    def _load_state(self, conn: sqlite3.Connection) -> None:
        self.session = 1 + (conn.execute("SELECT MAX(session) FROM progress").fetchone()[0] or 0)
        self._next_id = 1 + (conn.execute("SELECT MAX(id) FROM requests").fetchone()[0] or 0)
        for sid, name, labels in conn.execute("SELECT id, name, labels FROM series"):
            skey = (name, tuple((str(k), str(v)) for k, v in json.loads(labels)))
            self._series[skey] = sid
            self._next_series = max(self._next_series, sid + 1)
        totals = []
        for row in conn.execute("SELECT * FROM totals"):
            self._totals[(row[0], row[1], row[2], row[3])] = [row[4], row[5], row[6], row[7]]
            totals.append((row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]))
        for kind, target, counts, total in conn.execute("SELECT * FROM histograms"):
            self._hists[(kind, target)] = (json.loads(counts), total)
        downtime = sum(
            json.loads(d)["seconds"]
            for (d,) in conn.execute("SELECT data FROM events WHERE kind = 'downtime'")
        )
        resumes = conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'run_resumed'").fetchone()
        self._missed = {(t, p, r): n for t, p, r, n in conn.execute("SELECT * FROM missed")}
        self.restored = Restored(totals, dict(self._hists), downtime, resumes[0],
                                 dict(self._missed))

    def _repair(self, conn: sqlite3.Connection) -> None:
        """Fold rows a killed session committed but never rolled up into the rollups."""
        start = conn.execute(
            "SELECT MIN(rollup_from_id) FROM progress "
            "WHERE session = (SELECT MAX(session) FROM progress)"
        ).fetchone()[0]
        if start is None:
            return
        found = unfolded_rollups(conn, start, self._window_ns)
        for key, (stats, wall_min, wall_max, upto) in found.items():
            self._store_window(conn, key, stats, wall_min, wall_max, upto)
        if found:
            log.info("journal_rollups_repaired", windows=len(found))

    # --- one flush ---------------------------------------------------------------------------

    def _cycle(self) -> None:
        now = time.monotonic()
        if self._pending is not None and now < self._retry_at:
            return
        batch = self._pending or self._take()
        if not batch.items and now - self._last_commit < IDLE_HEARTBEAT_S:
            return  # nothing new: a heartbeat a second is enough (and spares the disk)
        try:
            self._commit(batch, final=False)
        except sqlite3.Error as exc:
            self._failed(batch, exc)
            return
        self._last_commit = now
        if self._errors_in_row:
            log.warning("journal_writes_resumed", after_errors=self._errors_in_row)
        self._errors_in_row = 0
        self._pending = None
        if now - self._last_retention >= RETENTION_EVERY_S:
            self._last_retention = now
            self._retention()

    def _take(self) -> _Batch:
        q = self._q
        items = [q.popleft() for _ in range(min(len(q), MAX_BATCH))]
        return _Batch(items)

    def _final(self) -> None:
        """Closing: write everything queued (a few retries on errors), then every window."""
        attempts = 0
        while True:
            batch = self._pending or self._take()
            last = not self._q
            try:
                self._commit(batch, final=last)
            except sqlite3.Error as exc:
                self._failed(batch, exc)
                attempts += 1
                if attempts >= 3:
                    lost = len(batch.items) + len(self._q)
                    log.exception("journal_close_incomplete", unwritten=lost)
                    return
                time.sleep(1.0)
                continue
            self._pending = None
            if last:
                break
        with contextlib.suppress(sqlite3.Error):
            assert self._conn is not None
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._update_size()

    def _failed(self, batch: _Batch, exc: sqlite3.Error) -> None:
        """Disk full, read-only, I/O error: keep the batch, retry later, keep measuring."""
        with contextlib.suppress(sqlite3.Error):
            assert self._conn is not None
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        for key in [k for k, sid in self._series.items() if sid >= self._next_series]:
            del self._series[key]
        self._errors_in_row += 1
        delay = min(RETRY_MAX_S, 0.5 * 2 ** min(self._errors_in_row, 6))
        self._retry_at = time.monotonic() + delay
        self._pending = batch
        if self.metrics is not None:
            self.metrics.write_errors.inc()
        if self._errors_in_row == 1 or self._errors_in_row % 20 == 0:
            log.error(
                "journal_write_failed",
                error=f"{type(exc).__name__}: {exc}",
                records=len(batch.items),
                retry_in_s=delay,
                failures=self._errors_in_row,
            )
        if not batch.forwarded:  # metrics must not wait for the disk
            batch.forwarded = True
            self._hand_back([o for o in batch.items if type(o) is Outcome])

    def _commit(self, batch: _Batch, *, final: bool) -> None:
        """One transaction: rows, samples, events, aggregates, heartbeat. The in-memory
        state moves on only after COMMIT, so a failed batch can be retried as it was."""
        conn = self._conn
        assert conn is not None
        t0 = time.perf_counter()
        rows: list[tuple[Any, ...]] = []
        samples: list[tuple[float, int, float]] = []
        events: list[tuple[float, int | None, str, dict[str, Any]]] = []
        new_series: list[tuple[int, str, str]] = []
        outcomes: list[Outcome] = []
        next_id = self._next_id
        next_series = self._next_series
        deltas = _Batch([])
        origin = self._clock.origin_ns if self._clock is not None else 0
        for item in batch.items:
            kind = type(item)
            if kind is Outcome:
                rows.append(self._row(item, next_id, origin, deltas))
                outcomes.append(item)
                next_id += 1
            elif kind is Sample:
                key = (item.name, item.labels)
                sid = self._series.get(key)
                if sid is None:
                    sid = self._series[key] = next_series
                    next_series += 1
                    new_series.append((sid, item.name, json.dumps(item.labels)))
                samples.append((item.wall, sid, item.value))
            else:
                _, wall, offset, name, data = item
                events.append((wall, offset, name, data))
        last_id = next_id - 1
        now_window = (self._offset_now() or self._last_offset) // self._window_ns
        conn.execute("BEGIN")
        if new_series:
            conn.executemany("INSERT INTO series VALUES (?,?,?)", new_series)
        if rows:
            conn.executemany(_INSERT_REQUEST, rows)
        if samples:
            conn.executemany("INSERT INTO samples VALUES (?,?,?)", samples)
        for wall, offset, name, data in events:
            self._insert_event(conn, wall, offset, name, data)
        totals = self._write_totals(conn, deltas)
        staged, stored = self._write_windows(conn, deltas, last_id, now_window, final)
        from_id = min(
            (w.first_id for k, w in staged.items() if w.first_id and k not in stored),
            default=next_id,
        )
        downtime = self._clock_started(conn, final)
        offset, phase_index = self._plan_clock()
        missed = self._missed_changes()
        if missed:
            conn.executemany("INSERT OR REPLACE INTO missed VALUES (?,?,?,?)",
                             [(*k, n) for k, n in missed.items()])
        conn.execute(
            "UPDATE progress SET wall = ?, offset_ns = ?, phase_index = ?, seqs = ?, "
            "rollup_from_id = ?, stopped = ? WHERE session = ?",
            (
                self._wall(),
                offset,
                phase_index,
                json.dumps(self._seqs),
                from_id,
                int(final),
                self.session,
            ),
        )
        conn.execute("COMMIT")
        # committed: the in-memory state moves on
        self._missed.update(missed)
        self._next_id = next_id
        self._next_series = next_series
        self._totals.update(totals)
        for hkey, (counts, total) in deltas.hists.items():
            self._hists[hkey] = _add_hist(self._hists.get(hkey), counts, total)
        for wkey, win in staged.items():
            if wkey in stored:
                win.upto_id, win.first_id = last_id, 0
            self._windows[wkey] = win
        for wkey in [
            k for k, w in self._windows.items() if not w.first_id and k[2] < now_window - 3
        ]:
            del self._windows[wkey]  # stored and quiet: the database has it
        self._last_offset = offset
        if downtime is not None:
            self.downtime_s = downtime
        m = self.metrics
        if m is not None:
            if downtime:
                m.downtime.inc(downtime)
            m.commit.observe(time.perf_counter() - t0)
            m.last_commit.set(self._wall())
            if rows:
                m.records.labels("request").inc(len(rows))
            if samples:
                m.records.labels("sample").inc(len(samples))
            if events:
                m.records.labels("event").inc(len(events))
            self._update_size()
        if not batch.forwarded:
            batch.forwarded = True
            self._hand_back(outcomes)

    def _clock_started(self, conn: sqlite3.Connection, final: bool) -> float | None:
        """The first time the plan clock runs in this session: stamp the session's start on
        it (wall <-> plan time for the report) and, when resumed, write the downtime: from
        the last heartbeat before the crash or stop to now (soakd's own start-up included).
        A session stopped before its clock ever ran was down all along."""
        if self._clock_seen:
            return None
        clock = self._clock
        running = clock is not None and bool(clock.origin_ns)
        if not running and not final:
            return None
        self._clock_seen = True
        now = self._wall()
        start_wall = now
        if clock is not None and clock.origin_ns:
            ran_ns = time.perf_counter_ns() - clock.origin_ns - self._started_offset
            start_wall = now - max(0, ran_ns) / 1e9
            conn.execute(
                "UPDATE progress SET started_wall = ? WHERE session = ?",
                (start_wall, self.session),
            )
        if self._resume is None:
            return None
        last = self._resume.last_wall
        seconds = max(0.0, start_wall - last)
        self._insert_event(
            conn,
            start_wall,
            self._started_offset,
            "downtime",
            {"seconds": seconds, "from_wall": last, "to_wall": start_wall},
        )
        return seconds

    def _plan_clock(self) -> tuple[int, int | None]:
        """The plan offset to store: it stops when sending stops, not when the drain ends."""
        clock = self._clock
        if clock is None or not clock.origin_ns:
            return self._last_offset, None
        if self._frozen_offset is None:
            current = time.perf_counter_ns() - clock.origin_ns
            if clock.finished:
                self._frozen_offset = max(current, self._last_offset)
            elif clock.stopping:
                self._frozen_offset = self._last_offset  # the last heartbeat before the stop
        offset = self._frozen_offset if self._frozen_offset is not None else current
        self._seqs.update(clock.next_seq)
        phase = clock.phase
        return offset, phase.index if phase is not None else None

    def _missed_changes(self) -> dict[tuple[str, str, str], int]:
        """The ledger's counts (whole run: it starts from the restored ones) that moved."""
        clock = self._clock
        if clock is None:
            return {}
        counts = dict(clock.missed)  # one C-level copy: atomic under the GIL
        return {k: n for k, n in counts.items() if self._missed.get(k) != n}

    def _row(self, o: Outcome, rid: int, origin: int, deltas: _Batch) -> tuple[Any, ...]:
        sent = o.sent_ns - origin if o.sent_ns else None
        end_ns = max(0, (o.end_ns or time.perf_counter_ns()) - origin)
        ok = o.error is None
        gaps = o.itl_ns
        n = len(gaps)
        itl_mean = itl_p50 = itl_max = None
        blob = None
        ordered: list[int] = []
        if n:
            ordered = sorted(gaps)
            itl_mean = sum(ordered) // n
            itl_p50 = (ordered[(n - 1) // 2] + ordered[n // 2]) // 2
            itl_max = ordered[-1]
            if self.cfg.itl_gaps:
                blob = pack_itl(gaps)
        ttft = o.ttft_ns
        tpot = o.tpot_ns
        e2e = o.e2e_ns if o.sent_ns and o.end_ns else None
        # totals, as Metrics counts them
        tkey = (o.target, o.phase, o.outcome, status_class(o.status))
        t = deltas.totals.get(tkey)
        if t is None:
            t = deltas.totals[tkey] = [0, 0, 0, 0]
        t[0] += 1
        t[1] += o.output_tokens
        t[2] += o.prompt_tokens or 0
        t[3] += o.oom
        # histogram buckets, as Metrics observes them
        hists = deltas.hists
        if o.sent_ns:
            _observe(hists, "lag", o.target, [o.dispatch_lag_ns * NS])
        if ok:
            _observe(hists, "e2e", o.target, [o.e2e_ns * NS])
            if ttft is not None:
                _observe(hists, "ttft", o.target, [ttft * NS])
            if tpot is not None:
                _observe(hists, "tpot", o.target, [tpot * NS])
            if ordered:
                _observe(hists, "itl", o.target, [g * NS for g in ordered])
        # the rollup window it completed in
        wkey = (o.target, o.phase, end_ns // self._window_ns)
        win = deltas.windows.get(wkey)
        if win is None:
            win = deltas.windows[wkey] = _Window(
                TargetStats(), o.wall_start, o.wall_start, first_id=rid
            )
        win.stats.add(o)
        win.wall_min = min(win.wall_min, o.wall_start)
        win.wall_max = max(win.wall_max, o.wall_start)
        return (
            rid,
            self.session,
            o.wall_start,
            o.target,
            o.phase,
            o.seq,
            o.scheduled_ns - origin,
            sent,
            end_ns,
            o.dispatch_lag_ns if o.sent_ns else None,
            ttft,
            e2e,
            tpot,
            n,
            itl_mean,
            itl_p50,
            itl_max,
            blob,
            o.status,
            None if ok else o.outcome,
            int(o.oom),
            o.prompt_tokens,
            o.output_tokens,
            int(o.usage_reported),
        )

    def _write_totals(
        self, conn: sqlite3.Connection, deltas: _Batch
    ) -> dict[tuple[str, str, str, str], list[int]]:
        """Totals (what Prometheus' counters restart from) and histogram buckets.
        Dropped outcomes are in the totals too: Metrics counted them."""
        new_totals: dict[tuple[str, str, str, str], list[int]] = {}
        for key, d in deltas.totals.items():
            base = self._totals.get(key, [0, 0, 0, 0])
            new_totals[key] = [a + b for a, b in zip(base, d, strict=True)]
        dropped = dict(self._dropped)  # the loop replaces values, never mutates them
        for key in set(new_totals) | set(dropped):
            total = new_totals.get(key) or self._totals.get(key, [0, 0, 0, 0])
            extra = dropped.get(key, (0, 0, 0, 0))
            conn.execute(
                "INSERT OR REPLACE INTO totals VALUES (?,?,?,?,?,?,?,?)",
                (*key, *(a + b for a, b in zip(total, extra, strict=True))),
            )
        for hkey, (counts, total_s) in deltas.hists.items():
            merged = _add_hist(self._hists.get(hkey), counts, total_s)
            conn.execute(
                "INSERT OR REPLACE INTO histograms VALUES (?,?,?,?)",
                (*hkey, json.dumps(merged[0]), merged[1]),
            )
        return new_totals

    def _write_windows(
        self,
        conn: sqlite3.Connection,
        deltas: _Batch,
        last_id: int,
        now_window: int,
        final: bool,
    ) -> tuple[dict[tuple[str, str, int], _Window], set[tuple[str, str, int]]]:
        """Merge the batch into copies of its windows; store the windows that are over
        (two windows back: late requests still land), or all of them when closing."""
        staged: dict[tuple[str, str, int], _Window] = {}
        for wkey, dwin in deltas.windows.items():
            win = self._windows.get(wkey) or self._load_window(conn, wkey)
            if win is None:
                staged[wkey] = dwin
                continue
            stats = _copy(win.stats)
            stats.merge(dwin.stats)
            staged[wkey] = _Window(
                stats,
                min(win.wall_min, dwin.wall_min),
                max(win.wall_max, dwin.wall_max),
                win.upto_id,
                win.first_id or dwin.first_id,
            )
        for wkey, win in self._windows.items():
            if win.first_id and wkey not in staged:
                staged[wkey] = _Window(
                    win.stats, win.wall_min, win.wall_max, win.upto_id, win.first_id
                )
        stored = set()
        for wkey, win in staged.items():
            if win.first_id and (final or wkey[2] <= now_window - 2):
                self._store_window(conn, wkey, win.stats, win.wall_min, win.wall_max, last_id)
                stored.add(wkey)
        return staged, stored

    def _store_window(
        self,
        conn: sqlite3.Connection,
        key: tuple[str, str, int],
        stats: TargetStats,
        wall_min: float,
        wall_max: float,
        upto_id: int,
    ) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO rollups VALUES (?,?,?,?,?,?,?)",
            (*key, upto_id, wall_min, wall_max, stats_to_blob(stats)),
        )

    def _load_window(self, conn: sqlite3.Connection, key: tuple[str, str, int]) -> _Window | None:
        row = conn.execute(
            "SELECT upto_id, wall_min, wall_max, stats FROM rollups "
            "WHERE target = ? AND phase = ? AND window = ?",
            key,
        ).fetchone()
        if row is None:
            return None
        return _Window(stats_from_blob(row[3]), row[1], row[2], row[0], 0)

    def _insert_event(
        self,
        conn: sqlite3.Connection,
        wall: float,
        offset: int | None,
        kind: str,
        data: dict[str, Any],
    ) -> None:
        conn.execute(
            "INSERT INTO events (session, wall, offset_ns, kind, data) VALUES (?,?,?,?,?)",
            (self.session, wall, offset, kind, json.dumps(data, default=str)),
        )

    def _update_size(self) -> None:
        if self.metrics is None:
            return
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{self.path}{suffix}").st_size
        self.metrics.size.set(size)

    # --- retention -----------------------------------------------------------------------------

    def _retention(self) -> None:
        """Delete old samples/requests by age, then the oldest rows while over max_bytes.
        Totals, histograms and rollups are never deleted: the report stays whole-run."""
        cfg = self.cfg
        if cfg.keep_samples is None and cfg.keep_requests is None and cfg.max_bytes is None:
            return
        conn = self._conn
        assert conn is not None
        now = self._wall()
        try:
            deleted: dict[str, int] = {}
            for table, keep in (("samples", cfg.keep_samples), ("requests", cfg.keep_requests)):
                if keep is not None:
                    deleted[table] = self._delete_before(conn, table, now - keep)
            if cfg.max_bytes is not None:
                for _ in range(20):
                    page_size, pages, free = (
                        conn.execute(f"PRAGMA {p}").fetchone()[0]
                        for p in ("page_size", "page_count", "freelist_count")
                    )
                    if (pages - free) * page_size <= cfg.max_bytes * 0.9:
                        break
                    oldest = self._oldest_table(conn)
                    if oldest is None:
                        break
                    deleted[oldest] = deleted.get(oldest, 0) + self._delete_oldest(conn, oldest)
            deleted = {k: v for k, v in deleted.items() if v}
            if deleted:
                conn.execute("BEGIN")
                self._insert_event(conn, now, self._last_offset, "retention", deleted)
                conn.execute("COMMIT")
                log.info("journal_retention", deleted=deleted)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            log.warning("journal_retention_failed", error=str(exc))

    def _delete_before(self, conn: sqlite3.Connection, table: str, cutoff: float) -> int:
        # rows are appended in time order: find the first one to keep by rowid
        row = conn.execute(
            f"SELECT rowid FROM {table} WHERE wall >= ? ORDER BY rowid LIMIT 1",  # noqa: S608
            (cutoff,),
        ).fetchone()
        top = row[0] if row else conn.execute(f"SELECT MAX(rowid) + 1 FROM {table}").fetchone()[0]  # noqa: S608
        if top is None:
            return 0
        conn.execute("BEGIN")
        n = conn.execute(f"DELETE FROM {table} WHERE rowid < ?", (top,)).rowcount  # noqa: S608
        conn.execute("COMMIT")
        return n

    def _oldest_table(self, conn: sqlite3.Connection) -> str | None:
        oldest = []
        for table in ("samples", "requests"):
            row = conn.execute(f"SELECT wall FROM {table} ORDER BY rowid LIMIT 1").fetchone()  # noqa: S608
            if row is not None:
                oldest.append((row[0], table))
        return min(oldest)[1] if oldest else None

    def _delete_oldest(self, conn: sqlite3.Connection, table: str) -> int:
        lo, hi = conn.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {table}").fetchone()  # noqa: S608
        if lo is None:
            return 0
        top = lo + max(1000, (hi - lo) // 20)  # the oldest 5 %
        conn.execute("BEGIN")
        n = conn.execute(f"DELETE FROM {table} WHERE rowid < ?", (top,)).rowcount  # noqa: S608
        conn.execute("COMMIT")
        return n


def _observe(
    hists: dict[tuple[str, str], tuple[list[int], float]],
    kind: str,
    target: str,
    values: list[float],
) -> None:
    """Count ``values`` (sorted for ITL) into Prometheus' buckets: the first bound >= value."""
    bounds = HISTOGRAM_BUCKETS[kind]
    entry = hists.get((kind, target))
    counts, total = entry if entry is not None else ([0] * (len(bounds) + 1), 0.0)
    if len(values) == 1:
        counts[bisect.bisect_left(bounds, values[0])] += 1
    else:
        below = 0
        for i, bound in enumerate(bounds):
            upto = bisect.bisect_right(values, bound)
            counts[i] += upto - below
            below = upto
        counts[-1] += len(values) - below
    hists[(kind, target)] = (counts, total + sum(values))


def _add_hist(
    base: tuple[list[int], float] | None, counts: list[int], total: float
) -> tuple[list[int], float]:
    if base is None:
        return list(counts), total
    return [a + b for a, b in zip(base[0], counts, strict=True)], base[1] + total


def unfolded_rollups(
    conn: sqlite3.Connection, from_id: int, window_ns: int
) -> dict[tuple[str, str, int], tuple[TargetStats, float, float, int]]:
    """Windows holding rows that are not in their stored rollup (a killed writer's last
    windows): stored stats plus the missing rows, with the wall range and last id."""
    conn.row_factory = sqlite3.Row
    try:
        out: dict[tuple[str, str, int], tuple[TargetStats, float, float, int]] = {}
        upto: dict[tuple[str, str, int], int] = {}
        for row in conn.execute(
            f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests WHERE id >= ? ORDER BY id",  # noqa: S608
            (from_id,),
        ):
            key = (row["target"], row["phase"], row["end_ns"] // window_ns)
            if key not in upto:
                stored = conn.execute(
                    "SELECT upto_id, wall_min, wall_max, stats FROM rollups "
                    "WHERE target = ? AND phase = ? AND window = ?",
                    key,
                ).fetchone()
                upto[key] = stored[0] if stored is not None else 0
                if stored is not None:
                    out[key] = (stats_from_blob(stored[3]), stored[1], stored[2], stored[0])
            if row["id"] <= upto[key]:
                continue
            stats, wmin, wmax, _ = out.get(key) or (TargetStats(), row["wall"], row["wall"], 0)
            stats.add(outcome_from_row(row))
            out[key] = (stats, min(wmin, row["wall"]), max(wmax, row["wall"]), row["id"])
        return {k: v for k, v in out.items() if v[3] > upto[k]}
    finally:
        conn.row_factory = None


async def open_journal(
    run_dir: Path,
    run: RunInfo,
    cfg: JournalConfig | None = None,
    *,
    metrics: JournalMetrics | None = None,
    forward: OutcomeSink | None = None,
    resume: ResumeState | None = None,
) -> Journal:
    """Open or create ``run_dir/journal.db`` and start its writer (async factory)."""
    journal = Journal(
        run_dir / JOURNAL_FILE, run, cfg, metrics=metrics, forward=forward, resume=resume
    )
    journal._loop = asyncio.get_running_loop()  # committed outcomes come back to this loop
    await asyncio.to_thread(journal.start)  # opening may fold a crashed session's rows in
    return journal


# --- reading ----------------------------------------------------------------------------------


@dataclass
class Rollup:
    """A stored window's stats, for the report."""

    target: str
    phase: str
    window: int
    wall_min: float
    wall_max: float
    stats: TargetStats


class JournalReader:
    """Read-only access for the report and the export; safe while a run writes."""

    def __init__(self, run_dir: Path) -> None:
        path = run_dir / JOURNAL_FILE if run_dir.is_dir() else run_dir
        if not path.exists():
            raise JournalError(f"{run_dir}: no journal ({JOURNAL_FILE}) there")
        self.path = path
        self.conn = _connect(path, readonly=True)
        self.meta = _check_schema(self.conn, path, writing=False)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def window_ns(self) -> int:
        return int(self.meta["window_ns"])

    def sessions(self) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM progress ORDER BY session")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur]

    def events(self) -> list[dict[str, Any]]:
        return [
            {"session": s, "wall": w, "offset_ns": o, "kind": k, "data": json.loads(d)}
            for s, w, o, k, d in self.conn.execute(
                "SELECT session, wall, offset_ns, kind, data FROM events ORDER BY id"
            )
        ]

    def missed(self) -> dict[tuple[str, str, str], int]:
        """(target, phase, reason) -> planned sends not made (empty for a v1 journal)."""
        try:
            rows = self.conn.execute("SELECT target, phase, reason, count FROM missed")
            return {(t, p, r): n for t, p, r, n in rows}
        except sqlite3.OperationalError:  # v1: no such table
            return {}

    def totals(self) -> list[tuple[str, str, str, str, int, int, int, int]]:
        return [
            (a, b, c, d, int(e), int(f), int(g), int(h))
            for a, b, c, d, e, f, g, h in self.conn.execute("SELECT * FROM totals")
        ]

    def rollups(self) -> list[Rollup]:
        """Every window, with what a killed writer left unrolled folded in (in memory)."""
        found: dict[tuple[str, str, int], Rollup] = {}
        for target, phase, window, wmin, wmax, blob in self.conn.execute(
            "SELECT target, phase, window, wall_min, wall_max, stats FROM rollups"
        ):
            found[(target, phase, window)] = Rollup(
                target, phase, window, wmin, wmax, stats_from_blob(blob)
            )
        last = self.conn.execute(
            "SELECT rollup_from_id, stopped FROM progress ORDER BY session DESC LIMIT 1"
        ).fetchone()
        if last is not None and not last[1]:  # not cleanly closed (or still running)
            for key, (stats, wmin, wmax, _) in unfolded_rollups(
                self.conn, last[0], self.window_ns
            ).items():
                found[key] = Rollup(*key, wmin, wmax, stats)
        return sorted(found.values(), key=lambda r: (r.window, r.target, r.phase))

    def series(self) -> dict[int, tuple[str, dict[str, str]]]:
        return {
            sid: (name, dict(json.loads(labels)))
            for sid, name, labels in self.conn.execute("SELECT id, name, labels FROM series")
        }

    def samples(self, names: tuple[str, ...]) -> dict[int, list[tuple[float, float]]]:
        """Readings of the series with these names, by series id, in time order."""
        ids = [sid for sid, (name, _) in self.series().items() if name in names]
        out: dict[int, list[tuple[float, float]]] = {sid: [] for sid in ids}
        if not ids:
            return out
        marks = ",".join("?" * len(ids))
        for sid, wall, value in self.conn.execute(
            f"SELECT series, wall, value FROM samples WHERE series IN ({marks}) ORDER BY rowid",  # noqa: S608
            ids,
        ):
            out[sid].append((wall, value))
        return out

    def request_rows(self, *, itl: bool = True) -> Iterator[sqlite3.Row]:
        """Every request row, streamed (constant memory), in commit order."""
        cols = [c for c in REQUEST_COLUMNS if itl or c != "itl"]
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        cur.execute(f"SELECT {', '.join(cols)} FROM requests ORDER BY id")  # noqa: S608
        while True:
            chunk = cur.fetchmany(1000)
            if not chunk:
                return
            yield from chunk
