"""Multi-turn conversations end to end: `soakd run` (a real process, two sender workers that
build every request's text themselves) against two simulators the test runs, so their own
counters can be read once soakd is gone."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from soakd.config import config_from_dict
from soakd.journal import JournalReader
from soakd.profiles import get_profile
from soakd.sim.server import start_sim
from soakd.sim.spawn import free_port
from soakd.targets.preflight import PROMPT
from soakd.workload.conversations import make_conversations
from tests.scraping import samples, scrape, total

pytestmark = pytest.mark.integration

TURNS = 4
ANSWER = 8  # tokens, planned and served whole (the simulator honours ignore_eos)


def conversations_config(urls: dict[str, str]) -> dict[str, Any]:
    return {
        "run": {"name": "talk", "drain_timeout": "5s", "workers": 2},
        "targets": [{"name": n, "base_url": u, "model": "m"} for n, u in urls.items()],
        "workload": {
            "seed": 11,
            "prompts": {"output_tokens": {"mean": ANSWER}},
            "conversations": {
                "turns": TURNS,
                "user_tokens": {"dist": "uniform", "min": 10, "max": 60},
                "think_time": "20ms",
            },
        },
        # one conversation at a time per target: its turns are seqs 4k .. 4k + 3
        "phases": [
            {"name": "talk", "duration": "3s", "load": {"mode": "closed", "concurrency": 1}}
        ],
    }


async def test_served_prompt_tokens_grow_turn_by_turn_as_planned(tmp_path: Path) -> None:
    fast = get_profile("fast")
    sims = {name: await start_sim("127.0.0.1", 0, fast, "m") for name in ("a", "b")}
    try:
        doc = conversations_config({n: s.url for n, s in sims.items()})
        path = tmp_path / "talk.yaml"
        path.write_text(yaml.safe_dump(doc))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "soakd", "run", str(path), "--no-live",
            "--metrics-addr", f"127.0.0.1:{free_port()}", "--run-dir", str(tmp_path / "run"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == 0, err.decode()[-2000:]
        async with aiohttp.ClientSession() as session:
            served = {
                n: samples(await scrape(session, s.url + "/metrics")) for n, s in sims.items()
            }
    finally:
        for sim in sims.values():
            await sim.aclose()
    plan = make_conversations(config_from_dict(doc).workload)
    assert plan is not None
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    with JournalReader(tmp_path / "run") as journal:
        rows = [
            (r["target"], r["seq"], r["error"], r["prompt_tokens"], r["output_tokens"])
            for r in journal.request_rows(itl=False)
        ]
    for name in sims:
        mine = sorted((r for r in rows if r[0] == name), key=lambda r: r[1])
        assert [r[1] for r in mine] == list(range(len(mine)))
        assert len(mine) >= 2 * TURNS
        assert all(r[2] is None for r in mine)
        # turn t's prompt: every user turn so far and every answer before it, as served
        context = 0
        for seq, row in enumerate(mine):
            conv, turn = divmod(seq, TURNS)
            if turn == 0:
                context = 0
            context += plan.user_tokens(conv, turn)
            assert row[3] == context, f"{name} seq {seq}: conversation {conv}, turn {turn}"
            assert row[4] == ANSWER
            context += row[4]
        # soakd's counts are the server's, less the preflight's one request
        sim = served[name]
        finished = total(sim, "vllm:request_success_total", finished_reason="length") + total(
            sim, "vllm:request_success_total", finished_reason="stop"
        )
        assert finished - 1 == len(mine) == summary["targets"][name]["requests"]
        prompt = total(sim, "vllm:prompt_tokens_total") - len(PROMPT.split())
        assert prompt == sum(r[3] for r in mine)
        counted = summary["targets"][name]["conversations"]
        assert counted["started"] == -(-len(mine) // TURNS)  # the last one cut by the end
        assert counted["finished"] == len(mine) // TURNS
