"""Multi-turn conversations against a real vLLM (CPU, the tests' tiny model): the context
vLLM serves grows turn by turn as planned, and soakd's counts are vLLM's own."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from tests.turns import by_turn
from tests.vllm_server import VllmServer, sum_samples

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

TURNS = 4
ANSWER = 16


async def served(vllm: VllmServer) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(vllm.metrics_url) as resp:
        text = await resp.text()
    return {
        name: sum_samples(text, f"vllm:{name}_total", model_name=vllm.model)
        for name in ("prompt_tokens", "generation_tokens", "request_success")
    }


async def test_vllm_serves_each_turn_the_context_planned(vllm: VllmServer, tmp_path: Path) -> None:
    """Four turns of 70-110 user tokens and 16-token answers (asked whole with ignore_eos),
    one conversation at a time through two sender workers: each turn's prompt, by vLLM's
    own usage, is the user turns so far plus the answers it gave, within 2 % per turn
    index (what is left is the chat template's tags of each earlier turn: docs/workloads.md)."""
    doc = {
        "run": {"name": "talk", "drain_timeout": "30s", "workers": 2},
        "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
        "workload": {
            "seed": 5,
            "prompts": {"output_tokens": {"mean": ANSWER}},
            "conversations": {
                "turns": TURNS,
                "user_tokens": {"dist": "uniform", "min": 70, "max": 110},
            },
        },
        # one conversation at a time: its turns are seqs 4k .. 4k + 3
        "phases": [
            {"name": "talk", "duration": "12s", "load": {"mode": "closed", "concurrency": 1}}
        ],
    }
    cfg = config_from_dict(doc)
    before = await served(vllm)
    run = tmp_path / "run"
    result = await Soak(
        cfg, RunOptions(run_dir=run, metrics_addr="127.0.0.1:0", console_logs=False)
    ).run()
    after = await served(vllm)
    assert result.completed
    rows, planned, got = by_turn(run, cfg.workload, TURNS)
    assert [r[0] for r in rows] == list(range(len(rows)))
    assert all(r[3] is None for r in rows)
    assert len(rows) >= 2 * TURNS
    assert all(r[2] == ANSWER for r in rows)
    for turn in range(TURNS):
        off = got[turn] / planned[turn] - 1
        print(f"turn {turn}: planned {planned[turn]}, served {got[turn]} ({off:+.2%})")
        assert abs(off) < 0.02, f"turn {turn}"
    # the context grows: each turn's prompt is longer than the last's
    assert got == sorted(got)
    # vLLM's own counters moved by soakd's rows, request for request and token for token
    moved = {k: after[k] - before[k] for k in after}
    print(f"vLLM counted {moved}, soakd {len(rows)} requests")
    assert moved["request_success"] == len(rows)
    assert moved["generation_tokens"] == ANSWER * len(rows)
    assert moved["prompt_tokens"] == sum(r[1] for r in rows)
