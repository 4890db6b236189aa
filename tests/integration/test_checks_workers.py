"""Checks through sender workers: a check's text is the one text the parent ships (the
SEND frame carries it; every other request's text the worker builds), so the built-in
checks a right simulator answers all pass through two workers, as they do in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakd.config import config_from_dict
from soakd.journal import JournalReader, records
from soakd.run.app import RunOptions, Soak

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("workers", [1, 2])
async def test_built_in_checks_pass_whichever_process_sends_them(
    tmp_path: Path, workers: int
) -> None:
    cfg = config_from_dict(
        {
            "run": {"name": "checks", "drain_timeout": "5s", "workers": workers},
            "targets": [{"name": "sim", "simulator": "fast", "model": "m"}],
            "workload": {"max_tokens": 32, "prompts": {"input_tokens": {"mean": 40}}},
            "phases": [{"name": "p", "duration": "4s", "load": {"mode": "poisson", "rate": 40}}],
            "checks": {"share": "25%", "kinds": ["number_words", "arithmetic", "echo"]},
        }
    )
    run = tmp_path / "run"
    result = await Soak(
        cfg, RunOptions(run_dir=run, metrics_addr="127.0.0.1:0", console_logs=False)
    ).run()
    assert result.completed
    judged = [e for _, e in records.each(JournalReader(run).events(), records.CheckJudged)]
    assert len(judged) >= 10
    assert {e.check for e in judged} == {"number_words", "arithmetic", "echo"}
    failed = [(e.check, e.result, e.answer) for e in judged if e.result != "pass"]
    assert failed == []
