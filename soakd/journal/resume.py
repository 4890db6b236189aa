"""Journal resume room: what a new session needs to continue a run, and the lock that keeps
one soakd per run dir.

``read_resume_state`` runs before anything else starts (it fails before a run dir is
touched); ``ResumeState.check`` refuses a changed config or plan unless forced. What the
writer found in the journal for ``Metrics.restore`` is ``store.Restored``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from soakd.config import Config
from soakd.config.redact import config_doc
from soakd.journal.integrity import Loss, check_whole, emptied, lost, read_mark
from soakd.journal.jsondoc import Json
from soakd.journal.records import EventKind, PromptCalibration, Unreadable, read_as
from soakd.journal.schema import LOCK_FILE, JournalError, check_schema, connect
from soakd.journal.stored import StoredPlan, StoredRun, read_stored
from soakd.jsondiff import differences
from soakd.model import Plan

_UNCOMPARED = (
    "exporter",
    "logging",
    "journal",
    "report",
    "probes",
    "run.drain_timeout",
    "run.workers",  # how many processes send changes nothing of what is sent
)


def plan_doc(plan: Plan) -> dict[str, Json]:
    """The resolved plan as stored in ``meta`` (and compared on resume)."""
    return {
        "scale": plan.scale,
        "phases": [
            {
                "index": p.index,
                "name": p.name,
                "start_ns": p.start_ns,
                "end_ns": p.end_ns,
                "loads": {t: s.doc() for t, s in sorted(p.loads.items())},
            }
            for p in plan.phases
        ],
    }


def _diff(stored: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """The dotted paths where the stored config and this one differ, sorted, but for
    what changes nothing of what is sent (``_UNCOMPARED``)."""
    found = differences(stored, now, skip=_UNCOMPARED, sort_keys=True)
    return [d.path or "config" for d in found]


def _as_read_now(doc: Mapping[str, object]) -> Mapping[str, object]:
    """The stored config as this soakd reads it: a key a newer soakd added takes its
    default, so an upgrade alone is no config change (a key set away from its default
    still is). A document this soakd cannot read is compared as it is."""
    try:
        return config_doc(Config.model_validate(doc))
    except ValueError:  # pydantic's ValidationError: a key this soakd dropped or renamed
        return doc


@dataclass(frozen=True)
class ResumeState:
    """What a new session needs to continue a run (read before anything else starts).
    ``stored`` is the run as its first session stored it, read (journal/stored.py):
    ``check`` compares its config document whole, and its plan."""

    stored: StoredRun
    run_id: str
    created_wall: float
    plan_start: datetime
    sessions: int
    offset_ns: int  # the plan clock at the last heartbeat
    last_wall: float
    next_seq: dict[str, int]
    finished: bool
    written_by: str
    # the prompts' sizing, reused as it was (soakd/workload/sizing.py)
    calibrations: list[PromptCalibration | Unreadable] = field(default_factory=list)
    loss: Loss | None = None  # what a damaged write-ahead log took (integrity.py)

    def check(self, cfg: Config, plan: Plan, *, force: bool) -> list[str]:
        """Same config and plan as stored, or JournalError (``force``: the differences)."""
        diffs = _diff(_as_read_now(self.stored.config_document), config_doc(cfg))
        if not diffs and StoredPlan.model_validate(plan_doc(plan)) != self.stored.plan:
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


def take_lock(run_dir: Path) -> int:
    """One soakd per run dir: an flock on journal.lock (released by the OS on any exit)."""
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise JournalError(f"{run_dir} is in use by another soakd (pid {holder})") from None
    return fd


RECENT_ROWS = 100_000
"""Rows a resume checks the seq numbers of, beyond what the heartbeats stored."""


def read_resume_state(path: Path) -> ResumeState | None:
    """The state of the run journaled at ``path``; None when there is no journal yet.

    Raises JournalError for a finished run, a run dir another soakd is writing, another
    program's file, a schema this soakd cannot continue, or a damaged journal. Commits a
    damaged write-ahead log took are ``loss``: the plan clock and the seq numbers go on
    from the last commit the journal made (its mark), not from what it still holds."""
    if not path.exists():
        return None
    os.close(take_lock(path.parent))  # fail before anything touches the run dir
    mark = read_mark(path.parent)  # before the database (integrity.py)
    conn = connect(path, readonly=True)
    try:
        try:
            meta = check_schema(conn, path, writing=True)
        except JournalError as exc:  # not a soakd journal: unless its mark says it was one
            raise (emptied(path, mark) or exc) from None
        check_whole(conn, path, resume=True)
        loss = lost(conn, mark)
        rows = conn.execute(
            "SELECT session, wall, offset_ns, seqs, stopped FROM progress ORDER BY session"
        ).fetchall()
        seqs: dict[str, int] = {}
        for _, _, _, text, _ in rows:
            for name, n in json.loads(text).items():
                seqs[name] = max(seqs.get(name, 0), int(n))
        # every committed row went in with a heartbeat whose seqs are past it; the rows
        # are a second check, over the recent ones only (a rowid range: no full scan)
        for name, top in conn.execute(
            "SELECT target, MAX(seq) FROM requests "
            "WHERE id > (SELECT MAX(id) FROM requests) - ? GROUP BY target",
            (RECENT_ROWS,),
        ):
            seqs[name] = max(seqs.get(name, 0), int(top) + 1)
        finished = (
            conn.execute(
                "SELECT 1 FROM events WHERE kind = ? AND json_extract(data, '$.completed')",
                (EventKind.RUN_STOPPED,),
            ).fetchone()
            is not None
        )
        calibrations = [
            read_as(PromptCalibration, json.loads(data))
            for (data,) in conn.execute(
                "SELECT data FROM events WHERE kind = ? ORDER BY id",
                (EventKind.PROMPT_CALIBRATION,),
            )
        ]
    finally:
        conn.close()
    stored = read_stored(meta, path)
    run_id = stored.run_id
    if finished:
        raise JournalError(
            f"run {run_id} in {path.parent} has finished; it is not restarted by accident "
            "(use a new --run-dir, or `soakd report` on this one)"
        )
    last = rows[-1] if rows else None
    offset_ns = int(last[2]) if last else 0
    if loss is not None and mark is not None:  # go on from what had run, not from before
        offset_ns = max(offset_ns, mark.offset_ns)
        for name, n in mark.seqs.items():
            seqs[name] = max(seqs.get(name, 0), n)
    return ResumeState(
        stored=stored,
        run_id=run_id,
        created_wall=stored.created_wall,
        plan_start=datetime.fromisoformat(stored.plan_start),
        sessions=len(rows),
        offset_ns=offset_ns,
        last_wall=float(last[1]) if last else stored.created_wall,
        next_seq=seqs,
        finished=False,
        written_by=stored.soakd_version,
        calibrations=calibrations,
        loss=loss,
    )
