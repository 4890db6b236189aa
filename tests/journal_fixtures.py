"""Synthetic runs for the journal and report tests: a fake plan clock and made-up outcomes."""

from __future__ import annotations

import random
import time
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soakd.config import Config, JournalConfig, config_from_dict
from soakd.journal import Journal, RunInfo, config_doc, plan_doc, rollup_window_ns
from soakd.metrics import JournalMetrics, Metrics
from soakd.model import ErrorKind, Outcome, Phase, Plan
from soakd.workload.plan import build_plan

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


def run_info(cfg: Config, run_id: str = "syn-1") -> tuple[RunInfo, Plan]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    plan = build_plan(cfg, start)
    opts: dict[str, float | None] = {"rehearse_s": None, "duration_s": None}
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


def open_test_journal(
    run_dir: Path,
    cfg: Config,
    clock: FakeClock,
    *,
    journal_cfg: JournalConfig | None = None,
    forward: Metrics | None = None,
    metrics: JournalMetrics | None = None,
) -> Journal:
    info, _ = run_info(cfg)
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
