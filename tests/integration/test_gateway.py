"""``soakd gateway`` with real processes on 127.0.0.1: the VRAM breaker under load from soakd,
adaptive concurrency under a latency rise, and the openai SDK streaming through it."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.config import GatewaySettings, config_from_dict
from soakd.gateway.spawn import GatewayProcess, spawn_gateway
from soakd.journal import JournalReader
from soakd.report.export import records
from soakd.run.app import RunOptions, Soak
from soakd.sim.spawn import SimProcess, spawn_sim
from tests.litellm_proxy import litellm_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOLD_S = 2.0
INTERVAL_S = 0.25


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def events(log_path: Path) -> list[dict[str, Any]]:
    out = []
    for line in log_path.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            event["t"] = datetime.fromisoformat(event["timestamp"]).timestamp()
            out.append(event)
    return out


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return await resp.text()


async def status(gw: GatewayProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/gateway/status") as resp:
        result: dict[str, Any] = await resp.json()
        return result


def soak(tmp_path: Path, targets: list[dict[str, Any]], phases: list[dict[str, Any]],
         dcgm_url: str | None = None, max_tokens: int = 32) -> Soak:  # fmt: skip
    cfg = config_from_dict({
        "run": {"name": "gw", "drain_timeout": "10s"},
        "targets": targets,
        "workload": {"max_tokens": max_tokens, "prompts": {"input_tokens": {"mean": 16}}},
        "phases": phases,
        "gpu": {"source": "dcgm", "dcgm_url": dcgm_url} if dcgm_url else {"source": "none"},
        "probes": {"scrape_interval": "1s", "health_interval": "1s"},
    })  # fmt: skip
    return Soak(
        cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )


async def test_vram_breaker_opens_under_load_and_closes_after(tmp_path: Path) -> None:
    sim = await spawn_sim("edge-4gb-surge", "soakd-sim", tmp_path / "sim.log")
    gw: GatewayProcess | None = None
    try:
        settings = GatewaySettings.model_validate({
            "vram_breaker": {"hold": f"{HOLD_S}s", "close_hold": "1s", "retry_after": "1s"},
            "gpu": {"source": "dcgm", "interval": f"{INTERVAL_S}s"},
        })  # fmt: skip
        gw = await spawn_gateway("edge", settings, sim.base_url, tmp_path)
        closed = {"mode": "closed"}
        run = soak(tmp_path, [{"name": "edge", "base_url": gw.url, "model": "soakd-sim",
                               "metrics_url": sim.base_url + "/metrics"}],
                   [{"name": "load", "duration": "8s", "load": closed | {"concurrency": 8}},
                    {"name": "calm", "duration": "5s", "load": closed | {"concurrency": 1}}],
                   dcgm_url=sim.base_url + "/metrics")  # fmt: skip
        result = await run.run()
        assert result.completed
        gw_metrics = await scrape(gw.url + "/metrics")
        final = await status(gw)
    finally:
        if gw is not None:
            await gw.aclose()
        await sim.aclose()

    # soakd counted the gateway's 429s as the guard's own (shed_vram_breaker, by the error
    # code the gateway writes), never as the server's failures: every one, and only those
    summary = result.summary["edge"]
    n429 = summary["errors_by_kind"].get("shed_vram_breaker", 0)
    assert n429 > 0, summary
    assert set(summary["errors_by_kind"]) == {"shed_vram_breaker"}
    assert summary["shed"] == n429
    assert metric(gw_metrics, "soakd_gateway_rejections_total", reason="vram_breaker_open") == n429
    text = generate_latest(run.metrics.registry).decode()
    assert (
        metric(text, "soakd_requests_total", outcome="shed_vram_breaker", status_class="4xx")
        == n429
    )
    assert summary["requests"] - n429 >= 10  # requests still went through between openings

    # open only after VRAM stayed above the limit for the hold, within one sample interval
    log = events(tmp_path / "gateway-edge.log")
    opened = next(e for e in log if e["event"] == "gateway_breaker_opened")
    # the streak above the limit that opened it (a dip below restarts the hold)
    above = [e for e in log if e["event"] == "gateway_vram_above_limit" and e["t"] <= opened["t"]][
        -1
    ]
    assert opened["breaker"] == "vram"
    assert opened["used_bytes"] > 3.9e9
    open_delay = opened["t"] - above["t"]
    assert HOLD_S - 0.01 <= open_delay <= HOLD_S + INTERVAL_S + 0.3, open_delay  # + slack
    # soakd's first 429 came right after the opening (the next request that arrived)
    with JournalReader(tmp_path / "run") as reader:
        rows = list(records(reader))
    first_429 = min(r["wall"] + r["e2e_s"] for r in rows if r["error"] == "shed_vram_breaker")
    assert -0.05 <= first_429 - opened["t"] <= 1.0, first_429 - opened["t"]
    print(
        f"\nvram breaker: open {open_delay:.3f} s after VRAM passed the limit "
        f"(hold {HOLD_S} s, interval {INTERVAL_S} s); first 429 at soakd "
        f"{first_429 - opened['t']:+.3f} s after the opening"
    )

    # and it closed again once VRAM fell below the lower mark (half-open, one probe)
    states = [e["event"] for e in log if e["event"].startswith("gateway_breaker_")]
    assert "gateway_breaker_half_open" in states
    assert "gateway_breaker_closed" in states
    assert states.index("gateway_breaker_closed") > states.index("gateway_breaker_opened")
    closed = [e for e in log if e["event"] == "gateway_breaker_closed"]
    half = [e for e in log if e["event"] == "gateway_breaker_half_open"]
    print(
        "vram breaker: reopened-to-closed cycles",
        len(closed),
        "; below-mark hold before half-open",
        [round(e["below_for_s"], 3) for e in half],
    )
    assert final["vram"]["state"] == "closed"
    assert metric(gw_metrics, "soakd_gateway_breaker_state", breaker="vram") == 0
    assert metric(
        gw_metrics, "soakd_gateway_breaker_transitions_total", breaker="vram", to="open"
    ) == len([e for e in log if e["event"] == "gateway_breaker_opened"])


async def test_adaptive_limit_steps_down_under_a_latency_rise_and_back_up(tmp_path: Path) -> None:
    """Another client floods the same server (``direct``): the gateway's upstream latency
    rises whatever its own limit, so the limit steps down; it climbs back once the flood
    stops."""
    sim = await spawn_sim("edge-4gb", "soakd-sim", tmp_path / "sim.log")
    gw: GatewayProcess | None = None
    try:
        settings = GatewaySettings.model_validate({
            "vram_breaker": {"enabled": False},
            "concurrency": {"adaptive": True, "limit": 8, "min_limit": 1, "max_limit": 16,
                            "target_p95": "500ms", "interval": "1s", "min_samples": 2},
            "gpu": {"source": "none"},
        })  # fmt: skip
        gw = await spawn_gateway("guarded", settings, sim.base_url, tmp_path)
        guarded = {"mode": "closed", "concurrency": 8}
        run = soak(tmp_path, [
            {"name": "guarded", "base_url": gw.url, "model": "soakd-sim",
             "metrics_url": sim.base_url + "/metrics"},
            {"name": "direct", "base_url": sim.base_url, "model": "soakd-sim"},
        ], [
            {"name": "calm", "duration": "3s", "targets": {"guarded": guarded,
                                                           "direct": {"mode": "idle"}}},
            {"name": "flood", "duration": "5s", "targets": {
                "guarded": guarded, "direct": {"mode": "closed", "concurrency": 40}}},
            {"name": "recover", "duration": "7s", "targets": {"guarded": guarded,
                                                              "direct": {"mode": "idle"}}},
        ], max_tokens=16)  # fmt: skip
        result = await run.run()
        assert result.completed
        gw_metrics = await scrape(gw.url + "/metrics")
    finally:
        if gw is not None:
            await gw.aclose()
        await sim.aclose()

    assert result.summary["guarded"]["errors"] == 0, result.summary["guarded"]
    changes = [
        (e["old"], e["new"], e["p95_ttfb_s"], e["t"])
        for e in events(tmp_path / "gateway-guarded.log")
        if e["event"] == "gateway_concurrency_limit_changed"
    ]
    path = [changes[0][0]] + [c[1] for c in changes] if changes else []
    print(f"\nadaptive limit: {' -> '.join(map(str, path))}")
    print("p95 ttfb at each change (s):", [c[2] for c in changes])
    low = min(path)
    assert low <= 2, path  # halved at least twice from 8 while the flood lasted
    lowest = path.index(low)
    downs = [c for c in changes[:lowest] if c[1] < c[0]]
    assert len(downs) >= 2
    assert all(c[2] > 0.5 for c in downs)
    ups = [c for c in changes[lowest:] if c[1] > c[0]]
    assert len(ups) >= 2, path  # and climbed back once the server recovered
    assert path[-1] > low
    assert (
        metric(gw_metrics, "soakd_gateway_concurrency_limit_changes_total", direction="down") >= 2
    )
    assert metric(gw_metrics, "soakd_gateway_concurrency_limit") == path[-1]


OPENAI_SDK_SCRIPT = """
import json, sys, time
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="not-checked", max_retries=0)
t0 = time.monotonic()
stream = client.chat.completions.create(
    model="soakd-sim", messages=[{"role": "user", "content": "say something"}],
    max_tokens=12, stream=True, stream_options={"include_usage": True})
chunks, text, usage, first = 0, "", None, None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        first = first or time.monotonic() - t0
        chunks += 1
        text += chunk.choices[0].delta.content
    if chunk.usage:
        usage = chunk.usage.completion_tokens
whole = client.chat.completions.create(
    model="soakd-sim", messages=[{"role": "user", "content": "again"}], max_tokens=5)
print(json.dumps({"chunks": chunks, "text": text, "usage": usage, "first_s": first,
                  "total_s": time.monotonic() - t0,
                  "whole": whole.choices[0].message.content,
                  "whole_tokens": whole.usage.completion_tokens}))
"""


async def test_openai_sdk_streams_through_the_gateway(tmp_path: Path) -> None:
    python = litellm_python()  # its venv has the openai SDK; soakd's does not need it
    sim: SimProcess = await spawn_sim("edge-4gb", "soakd-sim", tmp_path / "sim.log")
    gw: GatewayProcess | None = None
    try:
        gw = await spawn_gateway("sdk", GatewaySettings.model_validate(
            {"gpu": {"source": "dcgm"}, "concurrency": {"adaptive": True, "limit": 4}}),
            sim.base_url, tmp_path)  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            str(python), "-c", OPENAI_SDK_SCRIPT, gw.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if gw is not None:
            await gw.aclose()
        await sim.aclose()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    got = json.loads(stdout.decode().strip().splitlines()[-1])
    assert got["chunks"] == 12
    assert got["usage"] == 12
    assert len(got["text"].split()) == 12
    assert got["whole_tokens"] == 5
    assert len(got["whole"].split()) == 5
    # streamed, not buffered: the first token long before the end (edge-4gb: ~25 ms a token)
    assert got["first_s"] < got["total_s"] - 0.15, got


async def test_gateway_added_latency_is_small(tmp_path: Path) -> None:
    """The same server soaked directly and through the gateway (all features on, nothing
    tripping): what the gateway adds shows in the numbers, and it is milliseconds."""
    sim = await spawn_sim("fast", "soakd-sim", tmp_path / "sim.log")
    gw: GatewayProcess | None = None
    try:
        settings = GatewaySettings.model_validate({
            "gpu": {"source": "dcgm"},  # the fast profile plays an H200: 136 GB used
            "vram_breaker": {"limit_bytes": "141GB"},
            "concurrency": {"adaptive": True, "limit": 8, "target_p95": "1s", "interval": "1s"},
        })  # fmt: skip
        gw = await spawn_gateway("guarded", settings, sim.base_url, tmp_path)
        run = soak(
            tmp_path,
            [
                {"name": "direct", "base_url": sim.base_url, "model": "soakd-sim"},
                {
                    "name": "guarded",
                    "base_url": gw.url,
                    "model": "soakd-sim",
                    "metrics_url": sim.base_url + "/metrics",
                },
            ],
            [{"name": "p", "duration": "5s", "load": {"mode": "closed", "concurrency": 4}}],
        )
        result = await run.run()
    finally:
        if gw is not None:
            await gw.aclose()
        await sim.aclose()
    assert result.completed
    stats = run.stats.total
    ms = {n: {q: round((stats[n].ttft.quantile(q) or 0) / 1e6, 2) for q in (0.5, 0.99)}
          for n in ("direct", "guarded")}  # fmt: skip
    e2e = {n: round((stats[n].e2e.quantile(0.5) or 0) / 1e6, 2) for n in ("direct", "guarded")}
    print(f"\nTTFT ms direct {ms['direct']} via gateway {ms['guarded']}; E2E p50 ms {e2e}")
    for name in ("direct", "guarded"):
        assert result.summary[name]["errors"] == 0, (name, result.summary[name])
    added = ms["guarded"][0.5] - ms["direct"][0.5]
    # it shows, and it is small: milliseconds (more on a loaded box, never the server's own)
    assert 0 < added < max(25.0, ms["direct"][0.5]), ms
