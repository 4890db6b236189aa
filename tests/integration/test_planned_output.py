"""Planned answer lengths end to end (issue 36): three simulators whose answers end at their
own EOS (``fast-eos``), soaked with answer lengths drawn from a distribution. Asked with
``ignore_eos`` (a local target's default) or ``min_tokens``, each serves the plan: the sum
of the output tokens served is the sum planned, by soakd's count and by the server's own
``vllm:generation_tokens_total``. Asked with max_tokens alone, answers end early, and the
report says so. In this process and through sender processes (the flag crosses the wire)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from soakd.config import TokenLength, config_from_dict
from soakd.profiles import get_profile
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak
from soakd.sim.server import start_sim
from soakd.workload.answers import AnswerLengths
from tests.scraping import samples, scrape, total

pytestmark = pytest.mark.integration

OUTPUT = {"dist": "uniform", "min": 8, "max": 160}
SEED = 11
ASKED = {"whole": "ignore_eos", "least": "min_tokens", "short": "none"}


@pytest.mark.parametrize("workers", [1, 2])
async def test_planned_output_lengths_are_served(tmp_path: Path, workers: int) -> None:
    eos = get_profile("fast-eos")
    sims = {name: await start_sim("127.0.0.1", 0, eos, "m") for name in ASKED}
    try:
        targets = [
            {"name": "whole", "base_url": sims["whole"].url, "model": "m"},  # local: ignore_eos
            {"name": "least", "base_url": sims["least"].url, "model": "m"},
            {"name": "short", "base_url": sims["short"].url, "model": "m"},
        ]
        targets[1]["planned_output"] = "min_tokens"
        targets[2]["planned_output"] = "none"
        cfg = config_from_dict(
            {
                "run": {"name": "answers", "drain_timeout": "5s", "workers": workers},
                "targets": targets,
                "workload": {
                    "max_tokens": 16,  # the default of an unplanned request: no cap on a plan
                    "seed": SEED,
                    "prompts": {"input_tokens": {"mean": 16}, "output_tokens": OUTPUT},
                },
                "phases": [
                    {"name": "p", "duration": "2.5s", "load": {"mode": "closed", "concurrency": 4}}
                ],
            }
        )
        run_dir = tmp_path / "run"
        soak = Soak(
            cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False)
        )
        result = await soak.run()
        assert result.completed
        counted = samples(generate_latest(soak.metrics.registry).decode())
        async with aiohttp.ClientSession() as session:
            served_by = {
                name: samples(await scrape(session, sim.url + "/metrics"))
                for name, sim in sims.items()
            }
    finally:
        for sim in sims.values():
            await sim.aclose()

    planned = AnswerLengths(TokenLength(**OUTPUT), seed=SEED)
    with sqlite3.connect(run_dir / "journal.db") as db:
        rows = db.execute("SELECT target, seq, output_tokens, error FROM requests").fetchall()
    report = {r.target: r for r in build_report(run_dir).output_tokens}
    for name, asked in ASKED.items():
        mine = [(seq, n) for t, seq, n, error in rows if t == name and error is None]
        assert len(mine) == len([r for r in rows if r[0] == name]) >= 20  # no errors
        plan = sum(planned(seq) or 0 for seq, _ in mine)
        served = sum(n for _, n in mine)
        soakd_count = total(counted, "soakd_output_tokens_total", target=name)
        server_count = total(served_by[name], "vllm:generation_tokens_total")  # no preflight
        print(f"{name} ({asked}): planned {plan}, served {served} in {len(mine)} answers")
        assert soakd_count == served == server_count  # one count, three sources
        assert report[name].asked_with == asked
        assert report[name].requests == len(mine)
        if asked == "none":
            assert served < 0.7 * plan  # ~50 tokens at 2 % a token, against ~84 planned
            assert report[name].off is not None
            assert report[name].off < -0.1
        else:
            assert served == pytest.approx(plan, rel=0.02)
            assert report[name].off == pytest.approx(0.0, abs=0.02)
    notes = [n for n in build_report(run_dir).notes if "output tokens an answer" in n]
    assert [n.split(":")[0] for n in notes] == ["short"]
