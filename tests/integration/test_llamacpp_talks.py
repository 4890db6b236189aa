"""Multi-turn conversations and reference checks against a real llama.cpp ``llama-server``
(CPU, the tests' tiny GGUF, ``-np 4``): the context it serves grows turn by turn as planned
and its own counters equal soakd's; its answers at temperature 0 match its own first ones.

Skipped without the binary (scripts/setup-llama-server.sh builds it; ``make test`` runs
it), except in CI, where a missing binary fails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from tests.llama_server import LlamaServer, LlamaServerNotSetUp
from tests.turns import by_turn
from tests.vllm_server import sum_samples

pytest.importorskip("gguf", reason="gguf is not installed (pip install -e '.[test]')")

from tests import make_tiny_gguf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TURNS = 4
ANSWER = 16


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = make_tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    try:
        server = LlamaServer(model, parallel=4, threads=1)
    except LlamaServerNotSetUp as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI: {exc}")
        pytest.skip(str(exc))
    with server:
        yield server


def counters(server: LlamaServer) -> dict[str, float]:
    text = server.metrics_text()
    return {
        name: sum_samples(text, f"llamacpp:{name}")
        for name in ("tokens_predicted_total", "requests_processing")
    }


async def soak(doc: dict[str, Any], run: Path) -> Any:
    cfg = config_from_dict(doc)
    result = await Soak(
        cfg, RunOptions(run_dir=run, metrics_addr="127.0.0.1:0", console_logs=False)
    ).run()
    assert result.completed
    return cfg


async def test_llama_server_serves_each_turn_the_context_planned(
    llama: LlamaServer, tmp_path: Path
) -> None:
    """Four turns of 70-110 user tokens and 16-token answers (asked whole with ignore_eos),
    one conversation at a time: each turn's prompt, by llama-server's own usage, is the
    user turns so far plus the answers it gave, within 2 % per turn index; the tokens it
    predicted are soakd's."""
    before = counters(llama)
    run = tmp_path / "run"
    cfg = await soak(
        {
            "run": {"name": "talk", "drain_timeout": "30s"},
            "targets": [{"name": "llama", "base_url": llama.base_url, "model": llama.model}],
            "workload": {
                "seed": 5,
                "prompts": {"output_tokens": {"mean": ANSWER}},
                "conversations": {
                    "turns": TURNS,
                    "user_tokens": {"dist": "uniform", "min": 70, "max": 110},
                },
            },
            "phases": [
                {"name": "talk", "duration": "12s", "load": {"mode": "closed", "concurrency": 1}}
            ],
        },
        run,
    )
    after = counters(llama)
    rows, planned, got = by_turn(run, cfg.workload, TURNS)
    assert all(r[3] is None for r in rows)
    assert len(rows) >= 2 * TURNS
    assert all(r[2] == ANSWER for r in rows)
    for turn in range(TURNS):
        off = got[turn] / planned[turn] - 1
        print(f"llama-server turn {turn}: planned {planned[turn]}, served {got[turn]} ({off:+.2%})")
        assert abs(off) < 0.02, f"turn {turn}"
    assert got == sorted(got)  # the context grows
    predicted = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert predicted == sum(r[2] for r in rows) == ANSWER * len(rows)


async def test_reference_checks_pass_on_llama_server_at_temperature_0(
    llama: LlamaServer, tmp_path: Path
) -> None:
    """Reference checks (docs/checks.md) against llama-server's own first answers at
    temperature 0 with a seed, while 4 streams keep its 4 slots busy (the figure is
    printed: docs/checks.md)."""
    from soakd.journal import JournalReader, records

    prompts = [
        "Describe a soak test in two sentences.",
        "List three things that make a server slower over days.",
        "What is a key-value cache?",
    ]
    run = tmp_path / "run"
    await soak(
        {
            "run": {"name": "checks", "drain_timeout": "30s"},
            "targets": [{"name": "llama", "base_url": llama.base_url, "model": llama.model}],
            "workload": {"max_tokens": ANSWER, "prompts": {"input_tokens": {"mean": 32}}},
            "phases": [
                {"name": "steady", "duration": "20s", "load": {"mode": "closed", "concurrency": 4}}
            ],
            "checks": {
                "share": "30%",
                "kinds": [],
                "reference": {"prompts": prompts, "max_tokens": 24, "threshold": 0.99},
            },
        },
        run,
    )
    judged = [e for _, e in records.each(JournalReader(run).events(), records.CheckJudged)]
    passed = sum(e.result == "pass" for e in judged)
    print(
        f"\nllama-server, reference checks at temperature 0 under a closed loop of 4: "
        f"{passed}/{len(judged)} passed, scores {sorted({e.score for e in judged})}"
    )
    assert len(judged) >= 10
    assert passed / len(judged) >= 0.9
