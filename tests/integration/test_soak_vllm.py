"""soakd soaks a real vLLM (CPU) and the simulator side by side, and survives a dying target."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.config import Config, TokenLength, config_from_dict
from soakd.model import ErrorKind
from soakd.run.app import RunOptions, RunResult, Soak
from soakd.sim.spawn import free_port
from soakd.workload.answers import AnswerLengths
from tests.vllm_server import VllmServer, sum_samples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MAX_TOKENS = 16


def count(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def vllm_tokens(server: VllmServer) -> float:
    async with aiohttp.ClientSession() as session, session.get(server.metrics_url) as resp:
        text = await resp.text()
    return sum_samples(text, "vllm:generation_tokens_total", model_name=server.model)


async def soaked(
    vllm: VllmServer, cfg: Config, run_dir: Path
) -> tuple[Soak, RunResult, str, float]:
    """Run ``cfg`` to its end: the Soak, its result, its /metrics text, and the output
    tokens vLLM counted meanwhile (its own ``vllm:generation_tokens_total``)."""
    before = await vllm_tokens(vllm)
    soak = Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False))
    result = await soak.run()
    assert result.completed
    served = await vllm_tokens(vllm) - before
    return soak, result, generate_latest(soak.metrics.registry).decode(), served


@pytest.mark.vllm
async def test_vllm_and_simulator_side_by_side(vllm: VllmServer, tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "run": {"name": "ab", "drain_timeout": "30s"},
            "targets": [
                {"name": "vllm", "base_url": vllm.base_url, "model": vllm.model},
                {"name": "sim", "simulator": "fast", "model": "soakd-sim"},
            ],
            "workload": {"max_tokens": MAX_TOKENS, "prompts": {"input_tokens": {"mean": 32}}},
            "phases": [
                {"name": "closed", "duration": "6s", "load": {"mode": "closed", "concurrency": 4}},
                {"name": "open", "duration": "6s", "load": {"mode": "poisson", "rate": 3}},
            ],
        }
    )
    soak, result, text, served = await soaked(vllm, cfg, tmp_path / "run")
    for name in ("vllm", "sim"):
        summary = result.summary[name]
        assert summary["errors"] == 0, summary["errors_by_kind"]
        assert summary["requests"] >= 10
        ok = count(text, "soakd_requests_total", target=name, outcome="ok")
        assert ok == summary["requests"]
        assert count(text, "soakd_request_duration_seconds_count", target=name) == ok
        assert count(text, "soakd_time_to_first_token_seconds_count", target=name) == ok
        # a true usage: every one taken, never below the stream (above it: tokens merged
        # in a chunk, as vLLM does under load: notes usage_mismatch:above)
        assert count(text, "soakd_usage_rejected_total", target=name) == 0
        assert count(text, "soakd_usage_mismatch_total", target=name, direction="below") == 0
        stats = soak.stats.total[name]
        assert stats.ttft.max <= stats.e2e.max
        assert stats.ttft.quantile(0.5) <= stats.e2e.quantile(0.5)
        # keep-alive servers (vLLM's uvicorn, the simulator): probed, kept, reused
        pool = soak.targets[name].pool  # type: ignore[attr-defined]
        assert (pool.keeps_after, pool.closes_after) == ([200], [])
    assert soak.status().no_reuse == {}
    # soakd's token count is vLLM's own, exactly
    soakd_tokens = count(text, "soakd_output_tokens_total", target="vllm")
    assert soakd_tokens == served
    assert soakd_tokens > 0


@pytest.mark.vllm
async def test_vllm_serves_planned_output_lengths(vllm: VllmServer, tmp_path: Path) -> None:
    """Answer lengths drawn from a distribution (issue 36), asked of the real vLLM with
    ``ignore_eos`` (a local target's default) and with ``min_tokens``: vLLM's own
    ``vllm:generation_tokens_total`` rose by soakd's count, which is the sum planned."""
    output = {"dist": "uniform", "min": 4, "max": 40}
    cfg = config_from_dict(
        {
            "run": {"name": "planned", "drain_timeout": "30s"},
            "targets": [
                {"name": "eos", "base_url": vllm.base_url, "model": vllm.model},
                {
                    "name": "min",
                    "base_url": vllm.base_url,
                    "model": vllm.model,
                    "planned_output": "min_tokens",
                },
            ],
            "workload": {
                "max_tokens": MAX_TOKENS,
                "seed": 5,
                "prompts": {"input_tokens": {"mean": 32}, "output_tokens": output},
            },
            "phases": [
                {"name": "p", "duration": "8s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )
    _, _, text, served = await soaked(vllm, cfg, tmp_path / "run")
    planned = AnswerLengths(TokenLength(**output), seed=5)
    with sqlite3.connect(tmp_path / "run" / "journal.db") as db:
        rows = db.execute("SELECT target, seq, output_tokens, error FROM requests").fetchall()
    assert all(error is None for *_, error in rows)
    counts = 0.0
    for name in ("eos", "min"):
        mine = [(seq, n) for t, seq, n, _ in rows if t == name]
        plan = sum(planned(seq) or 0 for seq, _ in mine)
        counted = count(text, "soakd_output_tokens_total", target=name)
        print(f"{name}: planned {plan}, served {counted:g} in {len(mine)} answers")
        assert len(mine) >= 5
        assert counted == sum(n for _, n in mine) == plan
        counts += counted
    assert served == counts  # vLLM's own count: what soakd counted, as planned


async def test_target_dies_mid_run_and_soakd_keeps_going(tmp_path: Path) -> None:
    """The simulator behind one target is SIGKILLed mid-run: its requests fail as
    truncated / refused, the other target is untouched, the run completes."""
    cfg = config_from_dict(
        {
            "run": {"name": "die", "drain_timeout": "5s"},
            "targets": [
                {
                    "name": "doomed",
                    "simulator": "edge-4gb",
                    "model": "soakd-sim",
                    "timeouts": {"connect": "1s"},
                },
                {"name": "steady", "simulator": "fast", "model": "soakd-sim"},
            ],
            "workload": {"max_tokens": 64, "prompts": {"input_tokens": {"mean": 16}}},
            "phases": [
                {"name": "p", "duration": "6s", "load": {"mode": "closed", "concurrency": 3}}
            ],
        }
    )
    soak = Soak(
        cfg,
        RunOptions(
            run_dir=tmp_path / "run", metrics_addr=f"127.0.0.1:{free_port()}", console_logs=False
        ),
    )

    async def kill_doomed() -> None:
        while not soak._sims or soak.stats.total["doomed"].requests < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        # Kill mid-stream (0.5 s into the three 64-token streams, ~1.6 s long), the case
        # this test names: the streams it cuts end stream_truncated, and every request after
        # it meets nothing listening (connect_refused).
        await asyncio.sleep(0.5)
        os.kill(soak._sims[0].proc.pid, signal.SIGKILL)

    killer = asyncio.create_task(kill_doomed())
    result = await soak.run()
    await killer

    assert result.completed
    doomed = soak.stats.total["doomed"]
    assert doomed.ok >= 1
    kinds = set(doomed.errors)
    assert ErrorKind.STREAM_TRUNCATED.value in kinds  # streams cut by the kill
    assert ErrorKind.CONNECT_REFUSED.value in kinds  # and nothing listening afterwards
    assert kinds <= {ErrorKind.STREAM_TRUNCATED.value, ErrorKind.CONNECT_REFUSED.value}
    steady = soak.stats.total["steady"]
    assert steady.errors == {}
    assert steady.requests > 20


async def vllm_served(server: VllmServer) -> tuple[float, float]:
    """(finished, aborted) as vLLM counted them."""
    async with aiohttp.ClientSession() as session, session.get(server.metrics_url) as resp:
        text = await resp.text()
    finished = sum(
        count(text, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length")
    )
    return finished, count(text, "vllm:request_success_total", finished_reason="abort")


@pytest.mark.vllm
async def test_vllm_through_workers_counts_match_across_a_worker_kill(
    vllm: VllmServer, tmp_path: Path
) -> None:
    """Two sender processes against the real vLLM; one is SIGKILLed mid-run and comes
    back, then SIGTERM stops the run. vLLM's own counters and soakd's agree: every answer
    soakd counted ok, vLLM finished; what vLLM saw beyond that was in the killed worker's
    hands (worker_lost)."""
    cfg = config_from_dict(
        {
            "run": {"name": "workers", "drain_timeout": "30s", "workers": 2},
            "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
            "workload": {"max_tokens": MAX_TOKENS, "prompts": {"input_tokens": {"mean": 32}}},
            "phases": [
                {"name": "closed", "duration": "10m", "load": {"mode": "closed", "concurrency": 4}}
            ],
        }
    )
    before = await vllm_served(vllm)
    soak = Soak(
        cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )
    run = asyncio.create_task(soak.run())

    def handed_back(worker: int) -> float:
        text = generate_latest(soak.metrics.registry).decode()
        return count(text, "soakd_worker_requests_total", worker=str(worker))

    while handed_back(0) < 3 or handed_back(1) < 3:
        assert not run.done(), "the run ended before both workers sent"
        await asyncio.sleep(0.05)
    pool = soak.senders.pool
    assert pool is not None
    victim = pool.workers[0].proc
    assert victim is not None
    os.kill(victim.pid, signal.SIGKILL)
    # back up (a new process: seconds on a machine vLLM keeps busy) and sending again
    sent_before = handed_back(0)
    deadline = time.monotonic() + 120
    while pool.restarts < 1 or handed_back(0) < sent_before + 3:
        assert not run.done(), "the run ended before the killed worker came back"
        assert time.monotonic() < deadline, "the killed worker did not come back in 120 s"
        await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # soakd's handler: stop and drain, as a user would
    result = await run
    after = await vllm_served(vllm)
    finished, aborted = after[0] - before[0], after[1] - before[1]

    text = generate_latest(soak.metrics.registry).decode()
    ok = count(text, "soakd_requests_total", target="vllm", outcome="ok")
    lost = count(text, "soakd_requests_total", target="vllm", outcome="worker_lost")
    print(f"\nvLLM finished {finished:g} aborted {aborted:g}; soakd ok {ok:g} lost {lost:g}")
    assert not result.completed  # stopped by the signal, drained
    assert count(text, "soakd_requests_total", target="vllm") == ok + lost  # nothing else
    assert pool.restarts == 1
    assert ok >= 10
    assert ok <= finished <= ok + lost
    assert finished + aborted <= ok + lost
    assert result.summary["vllm"]["requests"] == ok + lost


@pytest.mark.vllm
async def test_reference_checks_pass_on_vllm_at_temperature_0(
    vllm: VllmServer, tmp_path: Path
) -> None:
    """Reference checks (docs/checks.md) against vLLM's own first answers, at temperature 0
    with a seed, while 4 streams keep its batch busy: the same prompt is answered the same
    way whatever it was batched with (the figure is printed: docs/checks.md)."""
    from soakd.journal import JournalReader, records

    prompts = [
        "Describe a soak test in two sentences.",
        "List three things that make a server slower over days.",
        "What is a key-value cache?",
    ]
    cfg = config_from_dict(
        {
            "run": {"name": "checks", "drain_timeout": "30s"},
            "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
            "workload": {"max_tokens": MAX_TOKENS, "prompts": {"input_tokens": {"mean": 32}}},
            "phases": [
                {"name": "steady", "duration": "20s", "load": {"mode": "closed", "concurrency": 4}}
            ],
            "checks": {
                "share": "30%",
                "kinds": [],
                "reference": {"prompts": prompts, "max_tokens": 24, "threshold": 0.99},
            },
        }
    )
    _, result, text, _ = await soaked(vllm, cfg, tmp_path / "run")
    assert result.summary["vllm"]["errors"] == 0
    judged = [
        e for _, e in records.each(JournalReader(tmp_path / "run").events(), records.CheckJudged)
    ]
    passed = sum(e.result == "pass" for e in judged)
    assert len(judged) >= 10
    assert count(text, "soakd_checks_total", target="vllm", check="reference") == len(judged)
    print(
        f"\nvLLM CPU, reference checks at temperature 0 under a closed loop of 4: "
        f"{passed}/{len(judged)} passed, scores {sorted({e.score for e in judged})}"
    )
    assert passed / len(judged) >= 0.9
