"""The report's prefix-cache table: the server's hit ratio per phase and over the run, from
the counters the probe journaled (soakd's count since it started: a drop is a resumed
soakd), beside the shared prefixes planned; a target whose server counts none says so."""

from __future__ import annotations

from soakd.journal.stored import StoredWorkload
from soakd.report.markdown import render_markdown
from soakd.report.model import Report
from soakd.report.prefix_cache import prefix_rows, prefix_table
from soakd.report.samples import Samples, Session, Timeline

QUERIES = "soakd_server_prefix_cache_queries_total"
HITS = "soakd_server_prefix_cache_hits_total"


def probe() -> Samples:
    # one session from wall 1000 s, plan time 0; phases warm 0-10 s, steady 10-30 s
    timeline = Timeline([Session(1000.0, 0.0, 1030.0, 30.0)], [("warm", 0, 10), ("steady", 10, 30)])
    series = {1: (QUERIES, {"target": "vllm"}), 2: (HITS, {"target": "vllm"})}
    samples = {
        1: [(1005.0, 1000.0), (1015.0, 3000.0), (1025.0, 500.0)],  # a resumed soakd at 25 s
        2: [(1005.0, 0.0), (1015.0, 1000.0), (1025.0, 250.0)],
    }
    return Samples(series, samples, timeline)


def workload(prefix: dict | None) -> StoredWorkload:  # type: ignore[type-arg]
    prompts: dict = {"source": "synthetic"}  # type: ignore[type-arg]
    if prefix is not None:
        prompts["prefix"] = prefix
    return StoredWorkload.model_validate({"prompts": prompts})


def test_hit_ratio_per_phase_beside_the_plan() -> None:
    plan = workload({"share": 0.25, "count": 4, "tokens": 512})
    rows = prefix_rows(probe(), plan, ["vllm", "llama"], ["warm", "steady"])
    shown = [(r.target, r.phase, r.planned, r.queried, r.hits, r.hit_ratio) for r in rows]
    planned = "25% of requests, 4 × 512 tokens"
    assert shown == [
        ("vllm", "warm", planned, 1000.0, 0.0, 0.0),
        ("vllm", "steady", planned, 2500.0, 1250.0, 0.5),
        ("vllm", "run", planned, 3500.0, 1250.0, 1250.0 / 3500.0),
        ("llama", "run", planned, None, None, None),
    ]
    table = prefix_table(_report(rows))
    assert table is not None
    assert [c.text for c in table.rows[1]] == [
        "vllm",
        "steady",
        planned,
        "2,500",
        "1,250",
        "50.0 %",
    ]
    assert [c.text for c in table.rows[3]][3:] == [
        "-",
        "-",
        "not served (no prefix-cache counter: llama.cpp, the simulator)",
    ]


def test_no_plan_no_counter_no_table() -> None:
    assert prefix_rows(probe(), workload(None), ["llama"], ["warm"]) == []
    rows = prefix_rows(probe(), workload(None), ["vllm"], ["warm", "steady"])
    assert {r.planned for r in rows} == {"none"}
    assert "Prefix cache" in render_markdown(_report(rows))


def _report(rows: list) -> Report:  # type: ignore[type-arg]
    return Report(
        run_id="r",
        created="",
        versions=[],
        sessions=1,
        completed=True,
        active_s=30.0,
        plan_s=30.0,
        downtime_s=0.0,
        downtimes=[],
        targets=[],
        phases=[],
        overall={},
        by_phase={},
        gpus=[],
        guard=[],
        best={},
        plots={},
        notes=[],
        currency="$",
        slice_s=1.0,
        prefix_cache=rows,
    )
