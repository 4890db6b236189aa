"""Checks through a real LiteLLM proxy (docs/checks.md): the same model name pointed at
another backend (the proxy restarted on the same port with a changed route) is seen by the
next check: an identity change journaled, exported and reported, and the new backend's
wrong answers failing the checks. The delay from the new route's first answer to its
detection is printed (docs/checks.md quotes it)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from soakd.config import config_from_dict
from soakd.journal import JournalReader, records
from soakd.profiles import get_profile
from soakd.run.app import RunOptions, Soak
from soakd.sim.server import start_sim
from tests.litellm_proxy import SETUP_HINT, LiteLLM, litellm_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

if not litellm_ready() and not os.environ.get("CI"):  # in CI it fails instead
    pytest.skip(f"no LiteLLM venv: {SETUP_HINT}", allow_module_level=True)

MASTER_KEY = "sk-soakd-master-3b1e9d0c7a5f4e28"
KEY_ENV = "SOAKD_TEST_LITELLM_KEY"
EVERY_S = 1.0


async def test_a_model_rerouted_behind_litellm_is_detected_by_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, MASTER_KEY)
    # the same name "cloud" on both backends; the second answers as another model, wrong
    first = await start_sim("127.0.0.1", 0, get_profile("fast"), "cloud")
    second = await start_sim(
        "127.0.0.1",
        0,
        get_profile(
            "fast", wrong_answers_after_s=0, model_switch_after_s=0, drift_model="cloud-0925"
        ),
        "cloud",
    )
    proxy = LiteLLM({"cloud": first.url + "/v1"}, MASTER_KEY, "checks-a")
    rerouted = LiteLLM({"cloud": second.url + "/v1"}, MASTER_KEY, "checks-b")
    rerouted.port = proxy.port  # the restarted proxy: the same address, another route
    try:
        await asyncio.to_thread(proxy.start)
        cfg = config_from_dict(
            {
                "run": {"name": "litellm-checks", "drain_timeout": "5s"},
                "targets": [
                    {
                        "name": "cloud",
                        "base_url": proxy.base_url,
                        "model": "cloud",
                        "api_key_env": KEY_ENV,
                    },
                ],
                "workload": {"max_tokens": 8, "prompts": {"input_tokens": {"mean": 16}}},
                "phases": [
                    {"name": "steady", "duration": "75s", "load": {"mode": "poisson", "rate": 4}}
                ],
                "checks": {"every": f"{EVERY_S}s", "kinds": ["echo", "arithmetic"]},
            }
        )
        soak = Soak(
            cfg,
            RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False),
        )
        running = asyncio.create_task(soak.run())
        await asyncio.sleep(15)  # checks pass through the first route
        await asyncio.to_thread(proxy.stop)
        await asyncio.to_thread(rerouted.start)
        routed_wall = time.time()
        result = await running
        assert result.completed
    finally:
        await asyncio.to_thread(proxy.stop)
        await asyncio.to_thread(rerouted.stop)
        await first.aclose()
        await second.aclose()
    events = JournalReader(tmp_path / "run").events()
    identities = [(row.wall, e) for row, e in records.each(events, records.Identity)]
    assert len(identities) == 2, identities
    changed_wall, changed = identities[-1]
    start = identities[0][1]
    assert (changed.previous_model, changed.previous_fingerprint) == (
        start.model,
        start.fingerprint,
    )
    assert (changed.model, changed.fingerprint) != (start.model, start.fingerprint)
    judged = [(row.wall, e) for row, e in records.each(events, records.CheckJudged)]
    before = [e.result for w, e in judged if w < routed_wall]
    after = [(w, e.result) for w, e in judged if w >= routed_wall]
    assert before
    assert set(before) == {"pass"}
    assert after
    assert {r for _, r in after} == {"fail"}
    first_fail = after[0][0]
    print(
        f"\nthrough LiteLLM: the rerouted proxy ready -> identity change journaled "
        f"{changed_wall - routed_wall:.2f} s, first failing check {first_fail - routed_wall:.2f} s "
        f"(a check every {EVERY_S:g} s); {start} -> {changed}"
    )
    assert changed_wall - routed_wall < 2 * EVERY_S + 2
