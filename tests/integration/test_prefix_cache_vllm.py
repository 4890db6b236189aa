"""Shared prefixes against a real vLLM (CPU; V1 caches prefixes by default), issue 36: a plan
whose requests share prefixes moves vLLM's own ``prefix_cache_hits_total`` by about the
tokens planned to be shared, and a plan without them does not; the report puts the hit
ratio soakd's probe read beside the plan."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiohttp
import pytest

from soakd.config import config_from_dict
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak
from soakd.workload.prompts import SyntheticPrompts, make_prompt_source
from tests.vllm_server import VllmServer, sum_samples

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

PREFIX = {"share": 0.5, "count": 2, "tokens": 300}
"""vLLM's CPU backend caches blocks of 128 tokens: a prefix of 300 (after the chat
template's few) fills two, 256 of its tokens found in the cache on each reuse."""


async def prefix_counters(server: VllmServer) -> tuple[float, float]:
    async with aiohttp.ClientSession() as session, session.get(server.metrics_url) as resp:
        text = await resp.text()
    return (
        sum_samples(text, "vllm:prefix_cache_queries_total", model_name=server.model),
        sum_samples(text, "vllm:prefix_cache_hits_total", model_name=server.model),
    )


async def run(vllm: VllmServer, tmp_path: Path, seed: int, prefix: dict | None) -> dict:  # type: ignore[type-arg]
    prompts: dict = {"input_tokens": {"mean": 400}}  # type: ignore[type-arg]
    if prefix is not None:
        prompts["prefix"] = prefix
    cfg = config_from_dict(
        {
            "run": {"name": f"prefix-{seed}", "drain_timeout": "30s"},
            "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
            "probes": {"scrape_interval": 0.5},
            "workload": {"max_tokens": 4, "seed": seed, "prompts": prompts},
            "phases": [
                {"name": "p", "duration": "8s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )
    q0, h0 = await prefix_counters(vllm)
    run_dir = tmp_path / f"run-{seed}"
    soak = Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False))
    assert (await soak.run()).completed
    q1, h1 = await prefix_counters(vllm)
    plan = make_prompt_source(cfg.workload)
    assert isinstance(plan, SyntheticPrompts)
    with sqlite3.connect(run_dir / "journal.db") as db:
        rows = db.execute(
            "SELECT seq, prompt_tokens FROM requests WHERE error IS NULL ORDER BY seq"
        ).fetchall()
    # planned shared tokens: each prefixed request's prefix, but for each prefix's first use
    seen: set[int] = set()
    shared = 0
    for seq, _ in rows:
        k = plan.prefix_of(seq)
        if k is not None:
            shared += PREFIX["tokens"] if k in seen else 0
            seen.add(k)
    return {
        "requests": len(rows),
        "prompt_tokens": sum(n for _, n in rows),
        "planned_shared": shared,
        "queries": q1 - q0,
        "hits": h1 - h0,
        "report": build_report(run_dir).prefix_cache,
    }


async def test_shared_prefixes_move_vllms_prefix_cache_hits(
    vllm: VllmServer, tmp_path: Path
) -> None:
    plain = await run(vllm, tmp_path, seed=21, prefix=None)
    shared = await run(vllm, tmp_path, seed=22, prefix=PREFIX)
    for name, r in (("no prefixes", plain), ("shared prefixes", shared)):
        print(
            f"{name}: {r['requests']} requests, {r['prompt_tokens']} prompt tokens; planned "
            f"shared {r['planned_shared']}; vLLM looked up {r['queries']:g}, hit {r['hits']:g} "
            f"({r['hits'] / max(1, r['queries']):.1%})"
        )
    assert plain["requests"] >= 10
    assert shared["requests"] >= 10
    assert plain["hits"] <= 0.02 * plain["queries"]  # unique openings: nothing to share
    # the whole cache blocks a prefix fills hit: 256 of each 300 tokens planned shared
    assert 0.75 * shared["planned_shared"] <= shared["hits"] <= 1.0 * shared["planned_shared"]
    # the report: the server's ratio beside the plan
    (row,) = [r for r in shared["report"] if r.phase == "run"]
    assert row.planned == "50% of requests, 2 × 300 tokens"
    assert row.hit_ratio is not None
    assert row.hit_ratio == pytest.approx(shared["hits"] / shared["queries"], abs=0.1)
    (before,) = [r for r in plain["report"] if r.phase == "run"]
    assert before.planned == "none"
    assert (before.hit_ratio or 0.0) <= 0.02
