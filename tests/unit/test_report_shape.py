"""The shapes other tools read: the JSON report's keys (``soakd report --format json``) and
a target's row in ``summary.json``, key for key and in order, as they were before the
report became a package. A key renamed, dropped or moved fails here first."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from soakd.journal import records
from soakd.measure.analysis import SessionRow, SummaryRow
from soakd.model import ErrorKind, Sample
from soakd.report import build_report, render_json
from soakd.run.stats import RunStats
from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome

HOUR = 3600.0

REPORT_KEYS = [
    "run_id",
    "created",
    "versions",
    "sessions",
    "completed",
    "active_s",
    "plan_s",
    "downtime_s",
    "downtimes",
    "targets",
    "phases",
    "overall",
    "by_phase",
    "gpus",
    "guard",
    "best",
    "plots",
    "notes",
    "currency",
    "slice_s",
    "verdicts",
    "phase_verdicts",
    "comparison",
    "passed",
    "slowest",  # target -> phase -> slow requests (soakd/report/slowest.py)
    "tested",  # what was tested (soakd/report/tested.py)
    "plot_phases",
    "plot_limits",
    "answer_notes",  # target -> note -> answers (soakd/measure/notes.py)
    "prompt_tokens",  # planned against served, per target (soakd/report/prompt_tokens.py)
    "prompt_sizing",
    "output_tokens",  # planned against served answer lengths (soakd/report/output_tokens.py)
    "prefix_cache",  # the server's prefix-cache hit ratio beside the plan (prefix_cache.py)
    "checks",  # the answers to checks (soakd/report/checks.py); null without checks
    "warnings",  # what the journal lost or could not keep: the report's first lines
    "breakdowns",  # latency by context length and by turn (soakd/report/breakdowns.py)
    "columns",
]
ROW_KEYS = [
    "target",
    "phase",
    "active_s",
    "offered",
    "missed",
    "missed_by_reason",
    "requests",
    "ok",
    "shed",
    "success_rate",
    "errors",
    "errors_by_kind",
    "oom_responses",
    "oom_events",
    "restarts",
    "output_tokens",
    "prompt_tokens",
    "rps",
    "output_tps",
    "goodput",
    "goodput_rps",
    "error_ratio",
    "correct_ratio",  # checks passed / judged (docs/checks.md)
    "latency_ms",
    "lag_p99_ms",
    "jitter",
    "jitter_slices",
    "vram_peak_bytes",
    "leak_bytes_per_hour",
    "leak_note",
    "energy_j",
    "energy_shared",
    "tokens_per_joule",
    "cost",
    "cost_per_mtok",
    "cost_per_month",
    "cost_basis",
    "not_judged",
    "server_errors",
    "server_error_ratio",
    "attempt_rps",
]
SHAPES = {
    "report": REPORT_KEYS,
    "row": ROW_KEYS,
    "latency_ms": ["ttft", "itl", "tpot", "e2e"],
    "quantiles": ["p50", "p95", "p99"],
    "gpu": [
        "gpu",
        "peak_used_bytes",
        "leak_bytes_per_hour",
        "energy_j",
        "mean_power_w",
        "targets",
        "leak_note",
    ],
    "slow": [
        "target",
        "phase",
        "seq",
        "wall",
        "offset_s",
        "e2e_s",
        "ttft_s",
        "outcome",
        "status",
        "output_tokens",
        "trace_id",
    ],
    "guard": [
        "phase",
        "target",
        "modes",
        "breaker_openings",
        "shed",
        "rejections",
        "limit_min",
        "limit_max",
    ],
    "series": ["label", "points", "group", "dashed"],
    "prompt_tokens": ["target", "requests", "planned", "served", "at_start"],
    "breakdown": ["target", "phase", "by_context", "by_turn"],
    "split_row": [
        "key",
        "requests",
        "errors",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "itl_p50_ms",
        "prompt_tokens_mean",
    ],
    "verdict": [
        "target",
        "phase",
        "criteria",
        "passed",
        "goodput",
        "goodput_rps",
        "error_ratio",
        "sent",
        "server_error_ratio",
    ],
    "criterion": ["name", "limit", "measured", "unit", "passed", "note"],
    "comparison": ["baseline", "candidate", "deltas", "passed"],
    "delta": [
        "key",
        "baseline",
        "candidate",
        "delta",
        "relative",
        "limit_kind",
        "limit",
        "regression",
        "passed",
        "note",
    ],
    "downtime": ["offset_h", "seconds"],
    "tested": [
        "run_name",
        "node",
        "site",
        "hosts",
        "started",
        "ended",
        "rehearsal",
        "scale",
        "configured_plan_s",
        "duration_cap_s",
        "prompts",
        "temperature",
        "targets",
        "phases",
    ],
    "tested_target": [
        "name",
        "model",
        "endpoint",
        "api",
        "stream",
        "gateway",
        "prompt_tokens_planned",
        "max_tokens",
        "prompt_tokens_served",
        "output_tokens_served",
        "output_tokens_planned",
    ],
    "tested_phase": ["name", "start_s", "duration_s", "configured_s", "times", "loads"],
    "column": ["key", "title", "better"],
}
SUMMARY_KEYS = [
    "requests",
    "ok",
    "errors",
    "error_ratio",
    "rps",
    "output_tps",
    "output_tokens",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "lag_p99_ms",
    "server_error_ratio",
    "not_judged",
    "attempt_rps",
    "top_error",
]
SESSION_KEYS = [
    *SUMMARY_KEYS,
    "offered",
    "missed",
    "missed_by_reason",
    "shed",
    "errors_by_kind",
    "goodput",
    "goodput_rps",
    "conversations",  # with workload.conversations only
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Everything a report can hold: two phases, errors and sheds, GPUs, a guard gateway's
    counts, a downtime, an SLO and a comparison."""
    d = tmp_path_factory.mktemp("shape")
    clock = FakeClock(offset_s=HOUR + 1)
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    cfg = config(
        slo={"ttft_p99": 0.5, "error_ratio": 0.2},
        compare={"baseline": "alpha", "candidate": "beta", "max_regression": {"ttft_p99": 0.5}},
    )
    j = open_test_journal(d, cfg, clock)
    rng = random.Random(11)
    kinds = [None] * 8 + [ErrorKind.HTTP_5XX, ErrorKind.SHED_VRAM_BREAKER]
    j.event(records.Phase("warm", 0))
    j.event(records.GatewayModes("alpha", vram_breaker=True, adaptive=False))
    j.event(records.Downtime(seconds=12.0))
    for i in range(600):
        end = 1 + i * HOUR / 600
        for target in ("alpha", "beta"):
            phase = "warm" if end < HOUR / 2 else "hot"
            j.record(outcome(rng, clock, target, phase, i, end, error=rng.choice(kinds)))
    for t in range(0, 3600, 60):
        wall = base_wall + t + 0.5
        j.sample(
            Sample(
                wall, "soakd_gpu_process_memory_bytes", 2e9 + t, (("gpu", "0"), ("target", "alpha"))
            )
        )
        j.sample(Sample(wall, "soakd_gpu_memory_used_bytes", 2.5e9, (("gpu", "0"),)))
        j.sample(Sample(wall, "soakd_gpu_energy_joules_total", 100.0 * t, (("gpu", "0"),)))
        j.sample(Sample(wall, "soakd_gpu_power_watts", 100.0, (("gpu", "0"),)))
        j.sample(
            Sample(
                wall,
                "soakd_gateway_breaker_transitions_total",
                t // 600,
                (("breaker", "vram"), ("target", "alpha"), ("to", "open")),
            )
        )
        j.sample(
            Sample(
                wall,
                "soakd_gateway_rejections_total",
                t // 60,
                (("reason", "vram_breaker_open"), ("target", "alpha")),
            )
        )
        j.sample(
            Sample(wall, "soakd_gateway_concurrency_limit", 4 + t // 900, (("target", "alpha"),))
        )
    j.close(completed=True)
    return d


def _keys(doc: Any, name: str, found: dict[str, list[str]]) -> None:
    assert isinstance(doc, dict), name
    keys = list(doc)
    assert found.setdefault(name, keys) == keys, name


def test_the_json_report_keeps_its_keys(run_dir: Path) -> None:
    doc = json.loads(render_json(build_report(run_dir)))
    found: dict[str, list[str]] = {}
    _keys(doc, "report", found)
    rows = [*doc["overall"].values(), *(r for p in doc["by_phase"].values() for r in p.values())]
    for row in rows:
        _keys(row, "row", found)
        _keys(row["latency_ms"], "latency_ms", found)
        for q in row["latency_ms"].values():
            _keys(q, "quantiles", found)
    for name, items in (
        ("gpu", doc["gpus"]),
        ("guard", doc["guard"]),
        ("series", [s for v in doc["plots"].values() for s in v]),
        ("verdict", list(doc["verdicts"].values())),
        ("downtime", doc["downtimes"]),
        ("column", doc["columns"]),
        ("slow", [s for by in doc["slowest"].values() for v in by.values() for s in v]),
        ("prompt_tokens", doc["prompt_tokens"]),
        ("breakdown", doc["breakdowns"]),
        ("split_row", [r for b in doc["breakdowns"] for r in b["by_context"]]),
    ):
        assert items, name  # the fixture has one of each
        for item in items:
            _keys(item, name, found)
    for v in doc["verdicts"].values():
        for c in v["criteria"]:
            _keys(c, "criterion", found)
    _keys(doc["tested"], "tested", found)
    for t in doc["tested"]["targets"]:
        _keys(t, "tested_target", found)
    for p in doc["tested"]["phases"]:
        _keys(p, "tested_phase", found)
    _keys(doc["comparison"], "comparison", found)
    for d in doc["comparison"]["deltas"]:
        _keys(d, "delta", found)
    assert found == SHAPES
    alpha = [g["breaker_openings"] for g in doc["guard"] if g["target"] == "alpha"]
    assert alpha == [{"vram": 2}, {"vram": 3}]  # warm, hot
    assert doc["downtimes"][0]["seconds"] == 12.0


def test_a_summary_row_keeps_its_keys() -> None:
    """``summary.json``'s per-target rows and ``/status``'s ``targets``: the TypedDicts
    name the keys the code writes, in the order it writes them."""
    stats = RunStats(["a"])
    assert list(stats.recent()["a"]) == SUMMARY_KEYS == list(SummaryRow.__annotations__)
    session = stats.overall(1.0, {"a": {"late": 2}})["a"]
    # goodput: added at the end; conversations: then, when the run has them
    assert [*session, "goodput", "goodput_rps", "conversations"] == SESSION_KEYS
    assert list(SessionRow.__annotations__) == SESSION_KEYS
    assert session["missed"] == 2
