"""Prompts sized in a real vLLM's tokens (CPU, the tiny model, whose tokenizer splits most of
soakd's words): a planned 300 is 300 of vLLM's prompt tokens, by vLLM's own counter; the
simulator beside it gets the same text; without calibration the plan is off and soakd
says so; a vLLM that is down at start is sized by its first answers."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from soakd.config import TargetConfig, TokenLength, config_from_dict
from soakd.journal.records import EventKind, PromptCalibration, read_as
from soakd.report import build_report, write_built
from soakd.run.app import RunOptions, Soak
from soakd.targets.tokenize import open_tokenizer
from soakd.workload.prompts import SyntheticPrompts
from soakd.workload.sizing import stored
from tests.fault_proxy import FaultProxy
from tests.vllm_server import VllmServer
from tests.waiting import until

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]


def config(vllm_url: str, model: str, mean: int, **workload: Any) -> Any:
    return config_from_dict(
        {
            "run": {"name": "calib", "drain_timeout": "30s"},
            "targets": [
                {"name": "vllm", "base_url": vllm_url, "model": model},
                {"name": "sim", "simulator": "fast", "model": "soakd-sim"},
            ],
            "workload": {
                "max_tokens": 4,
                "seed": 11,
                "prompts": {"input_tokens": {"dist": "fixed", "mean": mean}},
                **workload,
            },
            "gpu": {"source": "none"},
            "phases": [
                {"name": "p", "duration": "60s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )


def rows(run_dir: Path, target: str) -> list[tuple[int, int]]:
    conn = sqlite3.connect(run_dir / "journal.db")
    try:
        return conn.execute(
            "SELECT seq, prompt_tokens FROM requests "
            "WHERE target = ? AND error IS NULL AND prompt_tokens IS NOT NULL ORDER BY seq",
            (target,),
        ).fetchall()
    finally:
        conn.close()


def calibration_events(run_dir: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(run_dir / "journal.db")
    try:
        found = conn.execute(
            "SELECT data FROM events WHERE kind = ? ORDER BY id", (EventKind.PROMPT_CALIBRATION,)
        ).fetchall()
    finally:
        conn.close()
    return [json.loads(r[0]) for r in found]


async def soak_until(soak: Soak, done: Any, what: str) -> None:
    """Run until ``done()``, then stop as a SIGTERM would."""
    task = asyncio.ensure_future(soak.run())
    try:
        await until(lambda: soak.prompt_lengths is not None and done(), within=240, what=what)
    finally:
        soak._on_signal(signal.SIGTERM)
        await task


def answers(soak: Soak, target: str) -> int:
    assert soak.prompt_lengths is not None
    return soak.prompt_lengths.total[target].requests


async def test_a_planned_300_is_300_of_vllms_tokens(vllm: VllmServer, tmp_path: Path) -> None:
    before = vllm.metric("vllm:prompt_tokens_total", model_name=vllm.model)
    run_dir = tmp_path / "run"
    soak = Soak(
        config(vllm.base_url, vllm.model, 300),
        RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False),
    )
    await soak_until(soak, lambda: answers(soak, "vllm") >= 40, "40 vLLM answers")
    after = vllm.metric("vllm:prompt_tokens_total", model_name=vllm.model)

    start = calibration_events(run_dir)[0]
    assert (start["source"], start["reference"]) == ("tokenize", "vllm")
    assert start["costs"] is not None  # word by word: vLLM gave the token strings
    assert start["overhead"] > 0  # the chat template's tokens
    print(f"calibration at start: {start['requests']} requests, {start['seconds']} s")

    served = rows(run_dir, "vllm")
    assert len(served) >= 40
    for seq, tokens in served:
        assert abs(tokens - 300) <= 6, (seq, tokens)  # within 2 %, each request
    # vLLM's own counter saw exactly what soakd recorded from its usage
    assert sum(t for _, t in served) == after - before

    # the same text went to both: the simulator's count (a word a token) of each prompt
    # is the words of the prompt the stored calibration builds for that seq, and vLLM's
    # /tokenize of that prompt is what vLLM's usage said
    prompts = SyntheticPrompts(
        TokenLength(mean=300),
        11,
        stored([read_as(PromptCalibration, d) for d in calibration_events(run_dir)]).calibrations,
    )
    for seq, words in rows(run_dir, "sim"):
        assert words == len(prompts.spec_fields(seq)[0].split()), seq
    counter = await open_tokenizer(
        TargetConfig(name="vllm", base_url=vllm.base_url, model=vllm.model), vllm.base_url, 10.0
    )
    try:
        for seq, tokens in served[:5]:
            text = prompts.spec_fields(seq)[0]
            assert (await counter.tokenize(text, as_sent=True)).count == tokens
    finally:
        await counter.aclose()

    report = build_report(run_dir)
    by_target = {r.target: r for r in report.prompt_tokens}
    assert by_target["vllm"].planned == 300
    assert abs(by_target["vllm"].off or 1.0) < 0.02
    assert (by_target["sim"].off or 0.0) < -0.3  # the simulator counts words: named
    text = write_built(report, "md", None)
    assert "Prompt tokens: planned against served" in text
    assert any(n.startswith("sim: ") for n in report.notes)
    # no prompt-token note for vLLM (other notes may come: vLLM merges a slow reader's
    # tokens into one chunk under load, named as usage_mismatch:above, soakd/measure/notes.py)
    assert not any(n.startswith("vllm: ") and "prompt tokens" in n for n in report.notes)


async def test_without_calibration_the_plan_is_off_and_said_so(
    vllm: VllmServer, tmp_path: Path
) -> None:
    """``calibrate: off``: the words as planned, which vLLM counts at about twice: a
    warning line, the live status and a note in the report say so."""
    run_dir = tmp_path / "run"
    soak = Soak(
        config(vllm.base_url, vllm.model, 200, calibrate="off"),
        RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False),
    )
    await soak_until(soak, lambda: answers(soak, "vllm") >= 20, "20 vLLM answers")
    served = [t for _, t in rows(run_dir, "vllm")]
    mean = sum(served) / len(served)
    print(f"calibrate off: planned 200, vLLM counted {mean:.1f} a request")
    assert mean > 1.5 * 200
    assert calibration_events(run_dir) == []  # nothing measured, nothing asked
    log = [json.loads(line) for line in (run_dir / "soakd.log").read_text().splitlines()]
    warned = [e for e in log if e["event"] == "prompt_tokens_off_plan"]
    assert [e["target"] for e in warned] == ["vllm"]
    assert soak.prompt_lengths is not None
    assert soak.prompt_lengths.rows()["vllm"].planned == 200
    report = build_report(run_dir)
    assert any(n.startswith("vllm: ") and "workload.calibrate off" in n for n in report.notes)


async def test_a_vllm_down_at_start_is_sized_by_its_first_answers(
    vllm: VllmServer, tmp_path: Path
) -> None:
    """vLLM unreachable at start (it comes up later: --no-preflight): one fallback line;
    its first answers' usage sizes the prompts, from the next seq, checked again until
    within 1 %."""
    proxy = await FaultProxy(vllm.port).start()
    try:
        await proxy.refuse()
        run_dir = tmp_path / "run"
        cfg = config(proxy.url, vllm.model, 200)
        cfg = cfg.model_copy(update={"targets": cfg.targets[:1]})  # vLLM alone
        soak = Soak(
            cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False)
        )

        async def open_later() -> None:
            await until(lambda: soak.runner is not None and soak.runner.origin_ns, within=60)
            await proxy.accept()

        def checked() -> bool:
            assert soak.prompt_lengths is not None
            return not soak.prompt_lengths.checking and answers(soak, "vllm") >= 80

        opener = asyncio.ensure_future(open_later())
        await soak_until(soak, checked, "the checks and 80 answers")
        await opener
    finally:
        await proxy.aclose()
    docs = calibration_events(run_dir)
    assert docs[0]["source"] == "none"
    assert "cannot connect" in json.dumps(docs[0]["failed"])
    corrections = [d for d in docs if d["stage"] == "check" and d["changed"]]
    assert corrections
    last = corrections[-1]
    print("usage checks:", [(d["from_seq"], d["off_pct"], d["changed"]) for d in docs[1:]])
    late = [t for seq, t in rows(run_dir, "vllm") if seq >= last["from_seq"]]
    assert len(late) >= 16
    mean = sum(late) / len(late)
    print(f"sized by usage: planned 200, vLLM counted {mean:.1f} a request over {len(late)}")
    assert abs(mean / 200 - 1) < 0.05
