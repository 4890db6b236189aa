"""Prompt calibration against real local servers: the simulator's /tokenize, the hostile
server's ways of not having one, a target down at start, and a resumed run that sizes its
prompts as its first session did. (vLLM and llama.cpp: test_calibration_vllm.py and
test_soak_llamacpp.py.)"""

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
from soakd.profiles import get_profile
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak
from soakd.sim.server import start_sim
from soakd.targets.tokenize import open_tokenizer
from soakd.workload.calibration import TokenizeError
from soakd.workload.prompts import SyntheticPrompts
from soakd.workload.sizing import measure_at_start, stored
from tests.fault_proxy import FaultProxy
from tests.hostile_server import serve_hostile
from tests.tiny_tokenizer import train
from tests.waiting import until

pytestmark = [pytest.mark.integration]

FIXED = TokenLength(dist="fixed", mean=120)


def target(name: str, base_url: str, **more: Any) -> TargetConfig:
    return TargetConfig(name=name, base_url=base_url, model="m", **more)


def events(run_dir: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(run_dir / "journal.db")
    try:
        rows = conn.execute(
            "SELECT data FROM events WHERE kind = ? ORDER BY id", (EventKind.PROMPT_CALIBRATION,)
        ).fetchall()
    finally:
        conn.close()
    return [json.loads(r[0]) for r in rows]


def served_rows(run_dir: Path, name: str, session: int | None = None) -> list[tuple[int, int]]:
    """(seq, prompt tokens by the server) of the target's successful requests."""
    conn = sqlite3.connect(run_dir / "journal.db")
    where = "target = ? AND error IS NULL AND prompt_tokens IS NOT NULL"
    args: tuple[Any, ...] = (name,)
    if session is not None:
        where += " AND session = ?"
        args += (session,)
    try:
        return conn.execute(
            f"SELECT seq, prompt_tokens FROM requests WHERE {where}", args
        ).fetchall()
    finally:
        conn.close()


async def test_the_simulator_counts_as_its_answers_do_and_changes_nothing() -> None:
    """The simulator's /tokenize is vLLM's shape and its count is its usage (a word a
    token): calibrated against it, the prompts are the words they always were."""
    sim = await start_sim("127.0.0.1", 0, get_profile("fast"), "m")
    try:
        chat = await open_tokenizer(target("chat", sim.url), sim.url, 5.0)
        plain = await open_tokenizer(
            target("plain", sim.url, api="completions"), sim.url + "/v1", 5.0
        )
        try:
            prompts = SyntheticPrompts(FIXED, seed=4)
            before = [prompts.spec_fields(s) for s in range(20)]
            m = await measure_at_start(prompts, {"chat": chat, "plain": plain})
            assert chat.dialect == plain.dialect == "vllm"
            assert m.calibration is not None
            assert (m.calibration.source, m.calibration.reference) == ("tokenize", "chat")
            assert m.calibration.overhead == 0
            assert m.served == {"chat": 120.0, "plain": 120.0}
            assert [prompts.spec_fields(s) for s in range(20)] == before
            assert m.requests == chat.requests + plain.requests
        finally:
            await chat.aclose()
            await plain.aclose()
    finally:
        await sim.aclose()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("nosuch", "HTTP 404"),  # no such path
        ("ok", "not JSON"),  # answers, with a chat stream
        ("garbage", "/tokenize: "),  # not HTTP
        ("no_headers", "timed out"),  # reads the request, never answers
    ],
)
async def test_a_server_without_tokenize_is_named_and_left_out(mode: str, why: str) -> None:
    with serve_hostile(tokenize=True) as server:
        url = f"http://127.0.0.1:{server.port}/{mode}"
        counter = await open_tokenizer(target("h", url), url, 0.5)
        try:
            with pytest.raises(TokenizeError, match=why):
                await counter.tokenize("the", as_sent=False)
            prompts = SyntheticPrompts(FIXED)
            m = await measure_at_start(prompts, {"h": counter})
        finally:
            await counter.aclose()
    assert m.calibration is None
    assert m.served == {}
    assert why in m.failed["h"]
    assert len(m.failed["h"]) < 200  # one log line's worth
    assert prompts.calibration.source == "none"


def sim_config(run_dir: Path, tokenizer: Path | None, base_url: str | None = None) -> Any:
    sim: dict[str, Any] = {"name": "sim", "model": "soakd-sim"}
    sim |= {"base_url": base_url} if base_url else {"simulator": "fast"}
    workload: dict[str, Any] = {
        "max_tokens": 4,
        "seed": 5,
        "prompts": {"input_tokens": {"mean": 120}},
    }
    if tokenizer is not None:
        workload["tokenizer"] = str(tokenizer)
    return config_from_dict(
        {
            "run": {"name": "cal", "drain_timeout": "5s"},
            "targets": [sim],
            "workload": workload,
            "gpu": {"source": "none"},
            "phases": [
                {"name": "p", "duration": "60s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )


async def run_until(soak: Soak, answers: int) -> Any:
    """Run until the target answered ``answers`` times with usage, then stop as a SIGTERM
    would (the run stays unfinished: resumable)."""
    task = asyncio.ensure_future(soak.run())
    await until(
        lambda: (
            soak.prompt_lengths is not None and soak.prompt_lengths.total["sim"].requests >= answers
        ),
        within=60,
        what=f"{answers} answers",
    )
    soak._on_signal(signal.SIGTERM)
    return await task


async def test_a_resumed_run_sizes_its_prompts_as_the_first_session_did(tmp_path: Path) -> None:
    """A local tokenizer sizes the prompts; the resumed session measures nothing and sends
    exactly the prompts the stored calibration makes (the simulator's count of each, a
    word a token, says which text it got)."""
    tok = train(tmp_path, "bytelevel")
    run_dir = tmp_path / "run"
    cfg = sim_config(run_dir, tok)
    first = await run_until(
        Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False)), 30
    )
    assert not first.completed
    second = await run_until(
        Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False)), 30
    )
    assert second.session == 2
    docs = events(run_dir)
    assert [d["stage"] for d in docs].count("start") == 1  # measured once, in session 1
    cals = stored([read_as(PromptCalibration, d) for d in docs]).calibrations
    assert cals[0].source == "tokenizer"
    assert cals[0].costs is not None
    prompts = SyntheticPrompts(TokenLength(mean=120), 5, cals)
    rows = served_rows(run_dir, "sim", session=2)
    assert len(rows) >= 30
    for seq, words in rows:
        assert words == len(prompts.spec_fields(seq)[0].split()), seq
    assert all(words < 100 for _, words in rows)  # sized by the tokenizer, not 120 words

    # the report pairs planned and served over both sessions' rows
    report = build_report(run_dir)
    row = next(r for r in report.prompt_tokens if r.target == "sim")
    every = served_rows(run_dir, "sim")
    assert row.requests == len(every)
    assert row.planned == 120
    assert row.served == pytest.approx(sum(w for _, w in every) / len(every))
    assert report.prompt_sizing is not None
    assert report.prompt_sizing.startswith(f"sized by tokenizer {tok}")
    note = next(n for n in report.notes if n.startswith("sim: "))
    assert "where the plan said 120.0" in note


async def test_a_target_down_at_start_falls_back_with_one_line(tmp_path: Path) -> None:
    """A target that is not up yet (as with --no-preflight): one log line, the run goes on,
    and the first answers' usage checks the prompts once it is up."""
    sim = await start_sim("127.0.0.1", 0, get_profile("fast"), "soakd-sim")
    proxy = await FaultProxy(sim.port).start()
    try:
        await proxy.refuse()
        run_dir = tmp_path / "run"
        soak = Soak(
            sim_config(run_dir, None, proxy.url),
            RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False),
        )
        task = asyncio.ensure_future(soak.run())
        await until(lambda: soak.runner is not None, within=30, what="the runner")
        await proxy.accept()
        await until(
            lambda: soak.prompt_lengths is not None and not soak.prompt_lengths.checking,
            within=60,
            what="the check against the answers",
        )
        soak._on_signal(signal.SIGTERM)
        await task
    finally:
        await proxy.aclose()
        await sim.aclose()
    log = [json.loads(line) for line in (run_dir / "soakd.log").read_text().splitlines()]
    fallback = [e for e in log if e["event"] == "prompt_calibration_fallback"]
    assert len(fallback) == 1
    assert "cannot connect" in json.dumps(fallback[0]["reason"])
    docs = events(run_dir)
    assert docs[0]["source"] == "none"
    assert docs[1]["stage"] == "check"
    assert docs[1]["changed"] is False  # the simulator counts a word a token: the plan holds
    assert any(e["event"] == "prompt_calibration_checked" for e in log)
