"""Checks end to end (docs/checks.md): a real `soakd run` against two in-process simulators,
one of which drifts (its answers to checks go wrong, and its answers' model changes, a
known number of seconds after it started); a real Prometheus with the shipped rules and a
real Alertmanager with the shipped routes, alerts arriving at a webhook in the test.

Proven: the drifting target's `soakd_checks_total{result="fail"}` moves and the steady
one's does not; AnswersWrong (page) and TargetIdentityChanged (warn) reach the webhook for
the drifting target only; the journal's first failing check and identity change come after
the onset, within two check intervals; the report says when. The delays measured are
printed (docs/checks.md quotes them). Needs the Debian prometheus and
prometheus-alertmanager packages (scripts/setup-prometheus.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from soakd.journal import JournalReader, records
from soakd.profiles import get_profile
from soakd.report.build import build_report
from soakd.report.markdown import render_markdown
from soakd.sim.server import start_sim
from soakd.sim.spawn import free_port

try:
    from tests import observability as obs
    from tests.integration.test_alerting_e2e import Webhook, _alert, _serve, _stop_process
except ModuleNotFoundError:  # tests/integration is not a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import observability as obs
    from tests.integration.test_alerting_e2e import Webhook, _alert, _serve, _stop_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ONSET_S = 25.0  # the drifting simulator answers wrong, as another model, from here
EVERY_S = 0.5  # a check every this long, per target
RATE = 20  # requests a second, per target


def _config(drift_url: str, steady_url: str) -> dict[str, Any]:
    return {
        "run": {"name": "checks-e2e", "drain_timeout": "2s"},
        "targets": [
            {"name": "drift", "base_url": drift_url, "model": "m"},
            {"name": "steady", "base_url": steady_url, "model": "m", "stream": False},
        ],
        "workload": {"max_tokens": 16, "prompts": {"input_tokens": {"mean": 20}}},
        "phases": [{"name": "steady", "duration": "5m", "load": {"mode": "poisson", "rate": RATE}}],
        "checks": {"every": f"{EVERY_S}s", "reference": {"prompts": ["Say something long."]}},
    }


def _counter(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_drift_is_detected_alerted_and_reported(tmp_path: Path) -> None:
    obs.prometheus_bin()
    obs.alertmanager_bin()
    drifting = get_profile("fast", wrong_answers_after_s=ONSET_S, model_switch_after_s=ONSET_S)
    soakd_port = free_port()
    soakd_addr = f"{obs.HOST}:{soakd_port}"
    webhook = Webhook()
    hook_app = web.Application()
    hook_app.router.add_post("/alerts", webhook.handle)
    async with contextlib.AsyncExitStack() as cleanup:
        started = time.monotonic()
        drift = await start_sim(obs.HOST, 0, drifting, "m")
        onset_mono, onset_wall = started + ONSET_S, time.time() + ONSET_S
        cleanup.push_async_callback(drift.aclose)
        steady = await start_sim(obs.HOST, 0, get_profile("fast"), "m")
        cleanup.push_async_callback(steady.aclose)
        hook_runner, hook_port = await _serve(hook_app)
        cleanup.push_async_callback(hook_runner.cleanup)
        am = obs.alertmanager_daemon(f"http://{obs.HOST}:{hook_port}/alerts", tmp_path)
        await asyncio.to_thread(am.start)
        cleanup.callback(am.stop)
        prom = obs.prometheus_daemon(
            obs.local_prometheus_config({"soakd:9464": soakd_addr}, am.url.removeprefix("http://")),
            tmp_path,
        )
        await asyncio.to_thread(prom.start)
        cleanup.callback(prom.stop)
        config = tmp_path / "soak.yaml"
        config.write_text(yaml.safe_dump(_config(drift.url, steady.url)))
        soakd_log = cleanup.enter_context((tmp_path / "soakd.out").open("wb"))
        soakd = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "soakd", "run", str(config), "--no-live",
            "--metrics-addr", soakd_addr, "--run-dir", str(tmp_path / "run"),
            stdin=asyncio.subprocess.DEVNULL, stdout=soakd_log, stderr=soakd_log,
        )  # fmt: skip
        cleanup.push_async_callback(_stop_process, soakd)
        http = await cleanup.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        )

        async def scrape() -> str:
            async with http.get(f"http://{soakd_addr}/metrics") as resp:
                return await resp.text()

        # before the onset: checks pass on both, nothing fires
        text = ""
        while time.monotonic() < onset_mono - 1:
            await asyncio.sleep(1)
            with contextlib.suppress(aiohttp.ClientError):
                text = await scrape()
        assert _counter(text, "soakd_checks_total", target="drift", result="pass") > 10, text[-800:]
        assert _counter(text, "soakd_checks_total", result="fail") == 0
        assert not webhook.alerts()

        fired_at, _, alert = await webhook.wait_for(
            _alert("AnswersWrong", "firing", target="drift"), within=60
        )
        assert alert["labels"]["severity"] == "page"
        changed_at, _, _ = await webhook.wait_for(
            _alert("TargetIdentityChanged", "firing", target="drift"), within=60
        )
        text = await scrape()
        assert _counter(text, "soakd_checks_total", target="drift", result="fail") > 0
        assert _counter(text, "soakd_checks_total", target="steady", result="fail") == 0
        now = 'fingerprint="fp_sim0925",model="soakd-sim-0925",target="drift"'
        assert f"soakd_target_identity_info{{{now}}} 1.0" in text
        assert "AnswersWrong" not in str(
            [a["labels"] for _, _, a in webhook.alerts() if a["labels"].get("target") == "steady"]
        )
        await _stop_process(soakd)

    # the journal: the first failing check and the identity change, after the onset
    reader = JournalReader(tmp_path / "run")
    events = reader.events()
    fails = [
        (row.wall, e) for row, e in records.each(events, records.CheckJudged) if e.result != "pass"
    ]
    assert fails
    assert {e.target for _, e in fails} == {"drift"}
    first_fail = fails[0][0]
    changes = [
        row.wall
        for row, e in records.each(events, records.Identity)
        if e.target == "drift" and e.previous_model == "m" and e.model == "soakd-sim-0925"
    ]
    assert len(changes) == 1
    detect_fail, detect_model = first_fail - onset_wall, changes[0] - onset_wall
    assert -0.2 < detect_fail < 2 * EVERY_S + 1, detect_fail
    assert -0.2 < detect_model < 2 * EVERY_S + 1, detect_model
    md = render_markdown(build_report(tmp_path / "run"))
    assert "identity changed: drift: m → soakd-sim-0925 (fp_sim0925) at" in md
    assert "## Checks: the first failing answers" in md
    assert "| steady | steady |" in md
    assert "100.00 %" in md
    print(
        f"\ndetection after the onset: first failing check {detect_fail:.2f} s, model change "
        f"{detect_model:.2f} s; AnswersWrong at the webhook {fired_at - onset_mono:.1f} s, "
        f"TargetIdentityChanged {changed_at - onset_mono:.1f} s"
    )
