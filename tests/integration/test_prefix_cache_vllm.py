"""Shared prefixes and dataset sources against a real vLLM (CPU; V1 caches prefixes by
default), issue 36. A plan whose requests share prefixes moves vLLM's own
``prefix_cache_hits_total`` by about the tokens planned to be shared, and a plan without
them does not; the report puts the hit ratio soakd's probe read beside the plan. Each
dataset source replays its records' planned lengths.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from soakd.config import config_from_dict
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak
from soakd.workload.prompts import Records, SyntheticPrompts, make_prompt_source
from tests import dataset_files
from tests.vllm_server import MODEL_DIR, VllmServer, sum_samples

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


def short_mooncake(path: Path) -> Path:
    """A trace that fits the tiny model's 512-token context: one block each, block 0 shared
    by every other request."""
    lines = [
        json.dumps(
            {
                "timestamp": 100 * i,
                "input_length": 200 + 10 * i,
                "output_length": 4 + i,
                "hash_ids": [0 if i % 2 else 100 + i],
            }
        )
        for i in range(12)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("source", ["sharegpt", "mooncake", "burstgpt"])
async def test_a_dataset_replays_on_vllm(vllm: VllmServer, tmp_path: Path, source: str) -> None:
    """Each source's records on vLLM (asked with ignore_eos): every answer the record's
    planned length; the prompts, sized by vLLM's /tokenize (Mooncake, BurstGPT) or counted
    by the model's tokenizer.json (ShareGPT, whose text is sent as it is), as planned but
    for the chat template's tokens around a ShareGPT turn."""
    files = {
        "sharegpt": lambda: dataset_files.sharegpt(tmp_path / "s.json"),
        "mooncake": lambda: short_mooncake(tmp_path / "m.jsonl"),
        "burstgpt": lambda: dataset_files.burstgpt(tmp_path / "b.csv"),
    }
    path = files[source]()
    cfg = config_from_dict(
        {
            "run": {"name": source, "drain_timeout": "30s"},
            "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
            "workload": {
                "seed": 3,
                "tokenizer": str(MODEL_DIR / "tokenizer.json"),
                "prompts": {"source": source, "file": str(path)},
            },
            "phases": [
                {"name": "p", "duration": "6s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )
    run_dir = tmp_path / "run"
    soak = Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False))
    assert (await soak.run()).completed
    plan = make_prompt_source(cfg.workload)
    assert isinstance(plan, Records)
    with sqlite3.connect(run_dir / "journal.db") as db:
        rows = db.execute(
            "SELECT seq, prompt_tokens, output_tokens, error FROM requests"
        ).fetchall()
    assert all(error is None for *_, error in rows)
    planned_in = sum(plan.length(seq) for seq, *_ in rows)
    served_in = sum(n for _, n, _, _ in rows)
    planned_out = sum(plan.output_tokens(seq) or 0 for seq, *_ in rows)
    served_out = sum(n for _, _, n, _ in rows)
    report = build_report(run_dir)
    print(
        f"vLLM {source}: {len(rows)} answers; prompt tokens planned {planned_in}, served "
        f"{served_in} ({served_in / planned_in - 1:+.1%}); output tokens planned "
        f"{planned_out}, served {served_out}"
    )
    assert len(rows) >= 12
    assert served_out == planned_out
    (prompts,) = report.prompt_tokens
    assert prompts.off is not None
    if source == "sharegpt":  # sent as it is: the template's tokens on top of each turn
        assert 0 < served_in - planned_in <= 40 * len(rows)
    else:
        assert prompts.off == pytest.approx(0.0, abs=0.03)
