"""Synthetic runs for the journal and report tests: a fake plan clock, made-up outcomes,
and the checks the journal tests share (rows written, a resume that restores what soakd
counted)."""

from __future__ import annotations

import random
import re
import sqlite3
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from soakd.config import Config, JournalConfig, config_from_dict
from soakd.journal import (
    FoldSink,
    Journal,
    RunInfo,
    config_doc,
    plan_doc,
    read_resume_state,
    rollup_window_ns,
)
from soakd.journal.counts import WriterCounts
from soakd.journal.messages import WriterConfig
from soakd.journal.metrics import JournalMetrics
from soakd.journal.progress import ClockState
from soakd.journal.store import Store
from soakd.measure.fold import Fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome, Phase, Plan, Sample
from soakd.workload.plan import build_plan
from tests.scraping import scraped

S = 1_000_000_000
MS = 1_000_000
US = 1_000


@dataclass
class FakeClock:
    """The runner as the journal sees it: the plan started ``offset_s`` ago."""

    offset_s: float = 0.0
    phase: Phase | None = None
    finished: bool = False
    stopping: bool = False
    stopped_ns: int = 0
    next_seq: dict[str, int] = field(default_factory=dict)
    missed: dict[tuple[str, str, str], int] = field(default_factory=dict)
    origin_ns: int = 0

    def __post_init__(self) -> None:
        self.origin_ns = time.perf_counter_ns() - int(self.offset_s * S)


def config(**extra: Any) -> Config:
    raw: dict[str, Any] = {
        "run": {"name": "syn"},
        "targets": [
            {"name": "alpha", "base_url": "http://127.0.0.1:1", "cost": {"per_hour": 2.0}},
            {"name": "beta", "base_url": "http://127.0.0.1:2"},
        ],
        "phases": [
            {"name": "warm", "duration": "30m", "load": {"mode": "closed", "concurrency": 2}},
            {"name": "hot", "duration": "30m", "load": {"mode": "poisson", "rate": 5}},
        ],
        "report": {"energy_price_per_kwh": 0.5},
    }
    raw.update(extra)
    return config_from_dict(raw)


def run_info(
    cfg: Config, run_id: str = "syn-1", rehearse_s: float | None = None
) -> tuple[RunInfo, Plan]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    plan = build_plan(cfg, start, rehearse_s=rehearse_s)
    opts: dict[str, float | None] = {"rehearse_s": rehearse_s, "duration_s": None}
    info = RunInfo(run_id, config_doc(cfg), plan_doc(plan), start, opts, rollup_window_ns(plan))
    return info, plan


def outcome(
    rng: random.Random,
    clock: FakeClock,
    target: str,
    phase: str,
    seq: int,
    end_offset_s: float,
    *,
    slow: float = 1.0,
    error: ErrorKind | None = None,
) -> Outcome:
    """A finished request ending ``end_offset_s`` into the plan; whole microseconds."""
    tokens = rng.randint(2, 40)
    ttft = rng.randint(20_000, 400_000) * US
    gaps = array("q", [rng.randint(2_000, 60_000) * US for _ in range(tokens - 1)])
    e2e = int((ttft + sum(gaps) + rng.randint(0, 2_000) * US) * slow)
    end = clock.origin_ns + int(end_offset_s * S)
    sent = end - e2e
    o = Outcome(target, phase, seq, sent - rng.randint(0, 3_000) * US)
    o.sent_ns = sent
    o.wall_start = time.time()
    o.first_token_ns = sent + ttft
    o.end_ns = end
    o.status = 200
    o.output_tokens = tokens
    o.prompt_tokens = rng.randint(10, 300)
    o.usage_reported = True
    o.itl_ns = gaps
    if error is not None:
        o.error = error
        o.status = {ErrorKind.HTTP_5XX: 503, ErrorKind.HTTP_429: 429}.get(error, 0)
        if error in (ErrorKind.TIMEOUT_CONNECT, ErrorKind.CONNECT_REFUSED):
            o.first_token_ns = None
            o.output_tokens = 0
            o.itl_ns = array("q")
        o.oom = error is ErrorKind.HTTP_5XX and seq % 3 == 0
    return o


MIXED_KINDS = [None] * 12 + [ErrorKind.HTTP_5XX, ErrorKind.HTTP_429, ErrorKind.TIMEOUT_CONNECT]
"""``make_outcomes``' errors: one request in five fails (a 5xx, a 429, a connect timeout)."""


def make_outcomes(clock: FakeClock, n: int, seed: int = 1) -> list[Outcome]:
    """``n`` requests 10 ms apart from 10 s into the plan, alternating alpha and beta, the
    first half in warm, the rest in hot."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        target = ("alpha", "beta")[i % 2]
        phase = "warm" if i < n // 2 else "hot"
        out.append(
            outcome(rng, clock, target, phase, i // 2, 10 + i * 0.01, error=rng.choice(MIXED_KINDS))
        )
    return out


def open_test_journal(
    run_dir: Path,
    cfg: Config,
    clock: FakeClock,
    *,
    journal_cfg: JournalConfig | None = None,
    forward: Sequence[FoldSink] = (),
    metrics: JournalMetrics | None = None,
    rehearse_s: float | None = None,
) -> Journal:
    info, _ = run_info(cfg, rehearse_s=rehearse_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    j = Journal(
        run_dir / "journal.db",
        info,
        journal_cfg or JournalConfig(flush_interval=0.05),
        forward=forward,
        metrics=metrics,
    )
    j.start()
    j.attach(clock)
    return j


def before_v6(db: Path) -> None:
    """The journal without the ``requests.conversation`` and ``turn`` columns, as every
    v1-v5 journal on disk is (schema v5 otherwise: for the tests that make an older journal
    of a new one)."""
    with sqlite3.connect(db) as conn:
        for column in ("conversation", "turn"):
            conn.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
        conn.execute("PRAGMA user_version = 5")


def output_not_null(db: Path) -> None:
    """``requests.output_tokens`` as soakd before schema v5 made it: NOT NULL, as in every
    v1-v4 journal on disk (``before_v6`` first: for the tests that make an older journal
    of a new one)."""
    before_v6(db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'requests'"
        ).fetchone()
        old, n = re.subn(r"output_tokens INTEGER,[^\n]*", "output_tokens INTEGER NOT NULL,", sql)
        assert n == 1, sql
        conn.execute("BEGIN")
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_schema SET sql = ? WHERE name = 'requests'", (old,))
        conn.execute(f"PRAGMA schema_version = {version + 1}")
        conn.execute("COMMIT")
        conn.execute("PRAGMA writable_schema = OFF")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


HOUR = 3600.0
KINDS = [None] * 24 + [
    ErrorKind.HTTP_5XX,
    ErrorKind.HTTP_429,
    ErrorKind.TIMEOUT_TTFT,
    ErrorKind.STREAM_TRUNCATED,
    ErrorKind.CANCELLED,
    ErrorKind.SHED_QUEUE_FULL,
]
"""The error a synthetic request gets: one in five does not succeed; four kinds fail, one
is cut by soakd (not judged), one shed by the guard (out of the error ratios)."""


def write_hour_run(d: Path) -> Path:
    """A finished run in ``d``: one hour of plan time (two 30 min phases), two targets
    (alpha, beta) with errors of four kinds, a probe sample a minute, restarts and an
    OOM: the report tests' journal."""
    clock = FakeClock(offset_s=HOUR + 1)
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    j = open_test_journal(d, config(), clock)
    rng = random.Random(7)
    seq = {"alpha": 0, "beta": 0}
    for k in range(12):  # twelve 5-minute slices, each slower or faster: jitter
        for target, slow in (("alpha", 1.0 + 0.1 * (k % 4)), ("beta", 1.3 + 0.25 * (k % 3))):
            for _ in range(rng.randint(60, 90)):
                end = k * 300 + rng.uniform(1, 299)
                phase = "warm" if end < 1800 else "hot"
                j.record(
                    outcome(
                        rng,
                        clock,
                        target,
                        phase,
                        seq[target],
                        end,
                        slow=slow,
                        error=rng.choice(KINDS),
                    )
                )
                seq[target] += 1
    for t in range(0, 3600, 60):  # probes: a sample a minute
        wall = base_wall + t + 0.5
        j.sample(
            Sample(
                wall,
                "soakd_gpu_process_memory_bytes",
                2e9 + 5e6 * t / HOUR,
                (("gpu", "0"), ("target", "alpha")),
            )
        )
        j.sample(
            Sample(wall, "soakd_gpu_process_memory_bytes", 3e9, (("gpu", "1"), ("target", "beta")))
        )
        j.sample(
            Sample(wall, "soakd_gpu_memory_used_bytes", 2.5e9 + 5e6 * t / HOUR, (("gpu", "0"),))
        )
        j.sample(Sample(wall, "soakd_gpu_energy_joules_total", 100.0 * t, (("gpu", "0"),)))
        j.sample(Sample(wall, "soakd_gpu_energy_joules_total", 1000.0 * t, (("gpu", "1"),)))
        j.sample(Sample(wall, "soakd_gpu_power_watts", 100.0, (("gpu", "0"),)))
    # restarts of alpha: one in warm, one in hot, then soakd itself restarted (counter back
    # to 0) and one more in hot
    for t, v in ((100, 0), (1000, 1), (2500, 2), (3000, 0), (3300, 1)):
        j.sample(Sample(base_wall + t, "soakd_target_restarts_total", v, (("target", "alpha"),)))
    j.sample(
        Sample(
            base_wall + 2000,
            "soakd_target_oom_events_total",
            1,
            (("source", "xid"), ("target", "beta")),
        )
    )
    j.close(completed=True)
    return d


class StoreHarness:
    """The journal's writer side (soakd/journal/store.py) driven in this process, with no
    writer process between: what a packet adds, what a commit does, on a fake disk.
    Folds go to ``forward`` as soakd applies them; the writer's counts to ``metrics``."""

    def __init__(
        self,
        run_dir: Path,
        cfg: Config,
        clock: FakeClock,
        *,
        journal_cfg: JournalConfig | None = None,
        forward: Sequence[FoldSink] = (),
        metrics: JournalMetrics | None = None,
    ) -> None:
        info, _ = run_info(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.forward, self.metrics = forward, metrics
        self.counts = WriterCounts()
        jcfg = journal_cfg or JournalConfig(flush_interval=0.05)
        self.store = Store.open(
            run_dir / "journal.db",
            info,
            WriterConfig.of(jcfg),
            self,
            counts=self.counts,
        )
        self.restored = self.store.restored
        self.store.clock = ClockState.of(clock)
        self.seq = 0
        self.applied: list[tuple[int, bool]] = []  # (through, committed) of each fold

    def fold(self, f: Fold, through: int, committed: bool) -> None:
        self.applied.append((through, committed))
        for sink in self.forward:
            sink.apply(f)

    def committed(self, through: int) -> None:
        self.applied.append((through, True))

    def add(self, outcomes: Sequence[Outcome] = (), samples: Sequence[Sample] = ()) -> None:
        """One packet, as soakd sends it."""
        self.seq += 1
        self.store.add(self.seq, outcomes, samples)

    def cycle(self) -> None:
        """One flush: a commit (or, the disk failing, the folds handed over)."""
        self.store.cycle(force=True)
        self._counts()

    def close(self) -> None:
        self.store.final()
        self._counts()
        self.store.close()

    def _counts(self) -> None:
        if self.metrics is not None:
            self.metrics.add(self.counts.drain())


def written(metrics: Metrics) -> float:
    """Requests the journal's writer counted as written (soakd_journal_records_total)."""
    value = metrics.registry.get_sample_value("soakd_journal_records_total", {"kind": "request"})
    return value or 0.0


def resumed_equals_live(tmp_path: Path, live: Metrics) -> None:
    """A fresh registry restored from the journal exports what ``live`` counted: every
    request counter and every latency bucket (nothing lost, nothing counted twice)."""
    state = read_resume_state(tmp_path / "journal.db")
    assert state is not None
    j = Journal(tmp_path / "journal.db", run_info(config())[0], resume=state)
    j.start()
    j.close()
    assert j.restored is not None
    restored = Metrics()
    for t in ("alpha", "beta"):
        restored.add_target(t, ["warm", "hot"])
    assert restored.restore(j.restored.totals, j.restored.histograms) == []
    prefixes = ("soakd_requests", "soakd_output", "soakd_prompt", "soakd_oom", "soakd_request_d")
    before = {k: v for k, v in scraped(live, "soakd_").items() if k[0].startswith(prefixes)}
    after = {k: v for k, v in scraped(restored, "soakd_").items() if k[0].startswith(prefixes)}
    for name in ("soakd_time_to_first", "soakd_inter_token", "soakd_dispatch_lag"):
        before |= scraped(live, name)
        after |= scraped(restored, name)
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key] == pytest.approx(value, rel=1e-9), key
