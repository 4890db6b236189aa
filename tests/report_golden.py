"""The fixed journal the report is held to (tests/unit/test_report_golden.py): two sessions of
a run (the second a resume, so a downtime), two targets, every error kind the report groups
(failed, shed, cut by soakd), sends not made for every reason, answers' notes, probe samples
(GPU, restarts, OOM, the guard gateway's breaker, rejections and limit), and every event the
report reads (phases and gateway modes, a failing target's pause, a spend-cap pause, a server
that closes after answers, a calibration, the journal's own losses).

``python -m tests.report_golden DIR`` writes it, and the report JSON the current code builds
from it, to DIR (``journal.db``, ``report.json``): the files in tests/data/report-golden were
made so, before the journal's vocabulary was typed (issue 27), and the report must stay
byte-identical on them.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from soakd.config import Config, JournalConfig
from soakd.journal import Journal, read_resume_state, records
from soakd.model import ErrorKind, Outcome, PauseReason, Sample, SpendCap
from tests.journal_fixtures import HOUR, FakeClock, config, outcome, run_info

KINDS = [None] * 20 + [
    ErrorKind.HTTP_5XX,
    ErrorKind.HTTP_429,
    ErrorKind.TIMEOUT_TTFT,
    ErrorKind.STREAM_TRUNCATED,
    ErrorKind.CANCELLED,
    ErrorKind.WORKER_LOST,
    ErrorKind.SHED_QUEUE_FULL,
    ErrorKind.SHED_VRAM_BREAKER,
    ErrorKind.CONNECTION_CLOSED_UNANNOUNCED,
]


def golden_config() -> Config:
    """alpha traced and costed; beta behind a guard gateway, judged against alpha."""
    return config(
        targets=[
            {
                "name": "alpha",
                "base_url": "http://127.0.0.1:1",
                "cost": {"per_hour": 2.0},
                "traceparent": True,
                "slo": {"ttft_p99": "300ms"},
            },
            {
                "name": "beta",
                "base_url": "http://127.0.0.1:2",
                "gateway": {},
                "cost": {"per_mtok": {"output": 0.5}},
            },
        ],
        phases=[
            {"name": "warm", "duration": "30m", "load": {"mode": "closed", "concurrency": 2}},
            {
                "name": "hot",
                "duration": "30m",
                "load": {"mode": "ramp", "rate": 2, "rate_end": 6, "max_in_flight": 8},
                "gateway": {"beta": {"vram_breaker": True, "adaptive": False}},
            },
        ],
        slo={"e2e_p99": "9s", "error_ratio": 0.2, "jitter": 0.5},
        compare={"baseline": "alpha", "candidate": "beta", "max_regression": {"e2e_p99": 0.5}},
        workload={
            "seed": 3,
            "max_tokens": 64,
            "prompts": {"input_tokens": {"dist": "normal", "mean": 120, "stddev": 30}},
        },
        alert_limits={"dispatch_lag": "50ms"},
    )


def _noted(o: Outcome, rng: random.Random) -> Outcome:
    """Some answers carry notes (soakd/measure/notes.py)."""
    roll = rng.random()
    if roll < 0.03:
        o.usage_rejected = "negative"
    elif roll < 0.06:
        o.usage_delta = 3
    elif roll < 0.08 and o.status == 429:
        o.retry_after_unreadable = True
    return o


def _session(
    j: Journal,
    clock: FakeClock,
    rng: random.Random,
    seq: dict[str, int],
    slices: range,
) -> None:
    for k in slices:  # 5-minute slices, each slower or faster: jitter
        for target, slow in (("alpha", 1.0 + 0.1 * (k % 4)), ("beta", 1.3 + 0.25 * (k % 3))):
            for _ in range(rng.randint(25, 40)):
                end = k * 300 + rng.uniform(1, 299)
                phase = "warm" if end < 1800 else "hot"
                o = outcome(
                    rng, clock, target, phase, seq[target], end, slow=slow, error=rng.choice(KINDS)
                )
                j.record(_noted(o, rng))
                seq[target] += 1


def _samples(j: Journal, base_wall: float, start: int, end: int) -> None:
    for t in range(start, end, 60):  # a sample a minute
        wall = base_wall + t + 0.5
        mem = 2e9 + 5e6 * t / HOUR
        j.sample(
            Sample(wall, "soakd_gpu_process_memory_bytes", mem, (("gpu", "0"), ("target", "alpha")))
        )
        j.sample(Sample(wall, "soakd_gpu_memory_used_bytes", mem + 5e8, (("gpu", "0"),)))
        j.sample(Sample(wall, "soakd_gpu_memory_used_bytes", 3e9 + 1e3 * t, (("gpu", "1"),)))
        j.sample(Sample(wall, "soakd_gpu_energy_joules_total", 100.0 * t, (("gpu", "0"),)))
        j.sample(Sample(wall, "soakd_gpu_power_watts", 100.0 + t % 7, (("gpu", "1"),)))
        j.sample(
            Sample(
                wall,
                "soakd_gateway_concurrency_limit",
                8.0 + (t // 600),
                (("target", "beta"),),
            )
        )
    for t, v in ((start + 100, 0), (start + 900, 1)):
        j.sample(Sample(base_wall + t, "soakd_target_restarts_total", v, (("target", "alpha"),)))
    j.sample(
        Sample(
            base_wall + start + 200,
            "soakd_target_oom_events_total",
            1,
            (("source", "xid"), ("target", "beta")),
        )
    )
    for t, v in ((start + 50, 0), (start + 1500, 2)):
        j.sample(
            Sample(
                base_wall + t,
                "soakd_gateway_breaker_transitions_total",
                v,
                (("breaker", "vram"), ("target", "beta"), ("to", "open")),
            )
        )
        j.sample(
            Sample(
                base_wall + t,
                "soakd_gateway_rejections_total",
                3 * v,
                (("reason", "queue_full"), ("target", "beta")),
            )
        )


def _events_first(j: Journal) -> None:
    j.event(records.Preflight("alpha", True, "alpha: ok", 0.01))
    j.event(
        records.PromptCalibration(
            records.CalibrationStage.START,
            source="tokenize",
            reference="alpha",
            costs=None,
            scale=1.25,
            overhead=7.0,
            from_seq=0,
            planned=120.0,
            served={"alpha": 150.0, "beta": 151.0},
            failed={},
            requests=8,
            seconds=0.2,
        )
    )
    j.event(records.Phase("warm", 0))
    j.event(records.NoReuse("beta", 200, closes=True))
    j.event(
        records.TargetPaused(
            "alpha",
            PauseReason.FAILING,
            cause="http_5xx",
            detail="503 upstream down",
            failures=12,
            failing_for_s=4.0,
        )
    )
    j.event(records.TargetResumed("alpha", PauseReason.FAILING, 40.0))
    j.event(records.AuthFailed("beta", 401))


def _events_second(j: Journal) -> None:
    j.event(records.ConfigChanged(("slo.jitter",)))
    j.event(records.JournalLoss(3, 4, 2000 * 10**9, 1990 * 10**9))
    j.event(records.Phase("hot", 1))
    j.event(records.GatewayModes("beta", vram_breaker=True, adaptive=False))
    j.event(
        records.TargetPaused(
            "beta", PauseReason.SPEND_CAP, None, SpendCap.TOKENS, limit=100, used=120.0
        )
    )
    j.event(records.NoReuse("beta", 200, closes=False))
    j.event(
        records.JournalWriteErrors("disk I/O error", 2500 * 10**9, 3, 2510 * 10**9, until_end=False)
    )
    j.event(records.RowsStopped(1_900_000_000, 2_000_000_000))
    j.event(records.Retention())


def write_golden_run(d: Path) -> Path:
    """The journal (see the module's docstring) in ``d``."""
    cfg = golden_config()
    info, _ = run_info(cfg, run_id="golden-1")
    d.mkdir(parents=True, exist_ok=True)
    db = d / "journal.db"
    rng = random.Random(27)
    seq = {"alpha": 0, "beta": 0}
    # session 1: the first 40 minutes of plan time
    clock = FakeClock(offset_s=2400.5, missed={("alpha", "warm", "late"): 5})
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    j = Journal(db, info, JournalConfig(flush_interval=0.05))
    j.start()
    j.attach(clock)
    _events_first(j)
    _session(j, clock, rng, seq, range(8))
    _samples(j, base_wall, 0, 2400)
    clock.missed |= {("alpha", "hot", "failing"): 7, ("beta", "hot", "in_flight_cap"): 11}
    clock.next_seq = dict(seq)
    j.close(completed=False)
    # session 2: resumed after a pause, to the end of the hour
    state = read_resume_state(db)
    assert state is not None
    time.sleep(1.0)  # a downtime the report shows
    clock2 = FakeClock(offset_s=HOUR + 1, missed=dict(clock.missed))
    clock2.missed |= {("beta", "hot", "spend_cap"): 9, ("beta", "hot", "no_worker"): 2}
    base2 = time.time() - (time.perf_counter_ns() - clock2.origin_ns) / 1e9
    j2 = Journal(db, info, JournalConfig(flush_interval=0.05), resume=state)
    j2.start()
    j2.attach(clock2)
    _events_second(j2)
    _session(j2, clock2, rng, seq, range(8, 12))
    _samples(j2, base2, 2400, 3600)
    clock2.next_seq = dict(seq)
    j2.close(completed=True)
    return d


JUDGE_BY = """\
slo: {e2e_p99: 2s, error_ratio: 0.25}
compare: {baseline: beta, candidate: alpha, max_regression: {ttft_p99: 10%}}
report: {currency: EUR}
targets:
  - {name: beta, slo: {ttft_p99: 1s}, cost: {per_hour: 1.5}}
"""
"""``soakd report --config``: other decisions over the same journal."""

REPORTS = {
    "report.json": [],
    "report-judged.json": [
        "--config",
        "{dir}/judge.yaml",
        "--energy-price",
        "0.3",
        "--slowest",
        "3",
    ],
}
"""The expected reports (tests/data/report-golden) and the ``soakd report`` flags of each."""


def report_args(name: str, run_dir: Path, out: Path) -> list[str]:
    """``soakd report``'s arguments for the expected report ``name`` of ``run_dir``."""
    extra = [a.format(dir=run_dir) for a in REPORTS[name]]
    return ["report", str(run_dir), "--format", "json", "-o", str(out), *extra]


def fleet_args(run_dirs: list[Path], out: Path) -> list[str]:
    return ["report", *map(str, run_dirs), "--fleet", "--format", "json", "-o", str(out)]


def main(out: Path) -> None:
    from soakd.cli import main as soakd

    write_golden_run(out)
    (out / "judge.yaml").write_text(JUDGE_BY, encoding="utf-8")
    for name in REPORTS:
        soakd(report_args(name, out, out / name))
    (out / "fleet").mkdir(exist_ok=True)
    twin = out / "fleet" / "twin"
    twin.mkdir(exist_ok=True)
    for f in ("journal.db", "journal.mark"):
        (twin / f).write_bytes((out / f).read_bytes())
    soakd(fleet_args([out, twin], out / "fleet.json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
