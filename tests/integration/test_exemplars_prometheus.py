"""Exemplars from soakd's /metrics into a real Prometheus, run with the shipped config and
the feature flags of docker-compose.yml: the trace id of the slow request comes back from
Prometheus' exemplar API for the overview dashboard's exemplar queries, as Grafana asks.

Needs Debian's prometheus package (scripts/setup-prometheus.sh); skipped without it.
"""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from soakd.http import Board, start_http
from soakd.measure.fold import fold
from soakd.metrics.run import Metrics
from soakd.model import Outcome
from soakd.tracing import trace_id
from tests import observability as obs
from tests.deploy import COMPOSE_FILE, load_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUN_ID = "exemplars-1"
WAIT_S = 60.0


class Idle:
    """The exporter's view of a run that publishes nothing: ready, an empty /status."""

    ready = True

    def status_doc(self) -> dict[str, Any]:
        return {}

    def stalled(self) -> str | None:
        return None


def ok(seq: int, e2e_s: float) -> Outcome:
    o = Outcome("vllm", "steady", seq, 0)
    o.sent_ns = 1
    o.first_token_ns = 1 + int(e2e_s * 1e9 / 10)
    o.last_token_ns = o.end_ns = 1 + int(e2e_s * 1e9)
    o.status, o.output_tokens, o.content_chunks = 200, 2, 2
    o.itl_ns = array("q", [int(e2e_s * 1e9 / 2)])
    return o


def exemplar_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every dashboard query that asks Grafana for exemplars."""
    return [
        (panel["title"], target["expr"])
        for path in sorted(obs.DASHBOARD_DIR.glob("*.json"))
        for panel in json.loads(path.read_text())["panels"]
        for target in panel.get("targets", [])
        if target.get("exemplar")
    ]


def compose_prometheus_features() -> list[str]:
    command = load_yaml(COMPOSE_FILE)["services"]["prometheus"]["command"]
    return [arg for arg in command if arg.startswith("--enable-feature=")]


async def test_prometheus_keeps_the_trace_ids_the_dashboard_shows(tmp_path: Path) -> None:
    assert "--enable-feature=exemplar-storage" in compose_prometheus_features()
    queries = exemplar_queries()
    assert {title for title, _ in queries} == {
        "Time to first token, P50 and P99 (5m)",
        "End-to-end latency, P50 and P99 (5m)",
    }

    m = Metrics(CollectorRegistry())
    m.add_target("vllm", ["steady"])
    m.trace_exemplars(RUN_ID, ["vllm"])
    for seq in range(20):
        m.apply(fold([ok(seq, 0.4 + seq / 100)]))
    m.apply(fold([ok(99, 42.0)]))  # the spike: alone in its bucket
    slow = trace_id(RUN_ID, "vllm", 99)

    http = await start_http(obs.HOST, 0, m.registry, Board(Idle()))
    prom = obs.prometheus_daemon(
        obs.local_prometheus_config(
            {"soakd:9464": http.url.removeprefix("http://")}, f"{obs.HOST}:1"
        ),
        tmp_path,
    )
    prom.argv += compose_prometheus_features()
    started = time.time()
    try:
        await asyncio.to_thread(prom.start)
        async with aiohttp.ClientSession() as session:
            for title, expr in queries:
                found = await _exemplar_ids(
                    session, prom.url, obs.expand_grafana(expr), started, slow
                )
                assert slow in found, (title, found, prom.log_tail())
                assert found <= {trace_id(RUN_ID, "vllm", s) for s in [*range(20), 99]}
    finally:
        prom.stop()
        await http.aclose()


async def _exemplar_ids(
    session: aiohttp.ClientSession, url: str, expr: str, start: float, wanted: str
) -> set[str]:
    """The trace ids Prometheus returns for ``expr``'s series, once ``wanted`` is among
    them (or what it has after WAIT_S): it scrapes every second."""
    deadline = time.monotonic() + WAIT_S
    found: set[str] = set()
    while time.monotonic() < deadline:
        params = {"query": expr, "start": f"{start - 60:.3f}", "end": f"{time.time() + 60:.3f}"}
        async with session.get(url + "/api/v1/query_exemplars", params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", body
        found = {e["labels"]["trace_id"] for series in body["data"] for e in series["exemplars"]}
        if wanted in found:
            return found
        await asyncio.sleep(0.5)  # the next scrape (1 s interval)
    return found
