"""Probes room, gateways: the guard gateways soakd runs, re-exported on soakd's /metrics.

A gateway soakd starts (a target with ``gateway:``) listens on a random loopback port, so
Prometheus cannot scrape it. soakd reads each one's ``/metrics`` every
``probes.scrape_interval`` and serves what it read from a custom collector, every sample
with a ``target`` label added (client_python's pattern: families built from the last
snapshot on each scrape; no IO in ``collect()``, which runs on the exporter's thread and
reads only the frozen snapshot the run loop publishes after each read, swapped whole). A
gateway that stops answering drops out, and ``soakd_gateway_up`` says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from soakd.metrics import names as mn
from soakd.model import Sample
from soakd.probes._http import Endpoint, fetch
from soakd.probes._ticks import sleep_until_next

log = structlog.get_logger()

GATEWAY_PREFIX = "soakd_gateway_"
JOURNALED = frozenset(
    {
        mn.GATEWAY_BREAKER_TRANSITIONS_TOTAL.removesuffix("_total"),
        mn.GATEWAY_CONCURRENCY_LIMIT,
        mn.GATEWAY_REJECTIONS_TOTAL.removesuffix("_total"),
        mn.GATEWAY_BREAKER_STATE,
    }
)
"""Families (as the parser names them, without ``_total``) journaled for the report."""
UP = mn.GATEWAY_UP


class GatewayExport:
    """The last ``/metrics`` of each gateway, re-exported with ``target``; a Collector."""

    def __init__(
        self,
        urls: Mapping[str, str],
        interval: float,
        emit: Callable[[Sample], None] | None = None,
    ) -> None:
        self.urls = dict(urls)  # target -> the gateway's /metrics URL
        self.interval = interval
        self._emit = emit  # the journal: what the guard did, for the report's stages
        self._journaled: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._families: dict[str, list[Metric]] = {}  # target -> families last read
        self._up: dict[str, bool] = dict.fromkeys(self.urls, False)
        # what collect() serves: copies of both, made by the loop after each read
        self._shown: tuple[dict[str, bool], dict[str, list[Metric]]] = (dict(self._up), {})

    def ingest(self, target: str, text: str | None) -> None:
        """One read of a gateway: its exposition text, or None when it did not answer."""
        try:
            self._ingest(target, text)
        finally:  # published whole: a scrape sees this read entirely, or not yet
            self._shown = (dict(self._up), dict(self._families))

    def _ingest(self, target: str, text: str | None) -> None:
        if text is None:
            self._families.pop(target, None)
            self._up[target] = False
            return
        try:
            families = [
                f for f in text_string_to_metric_families(text) if f.name.startswith(GATEWAY_PREFIX)
            ]
        except ValueError:
            self._families.pop(target, None)
            self._up[target] = False
            return
        self._families[target] = families
        self._up[target] = True
        if self._emit is not None:
            self._journal(target, families)

    def _journal(self, target: str, families: list[Metric]) -> None:
        """The series the report reads per phase, as samples, each when it changed."""
        wall = time.time()
        assert self._emit is not None
        for family in families:
            if family.name not in JOURNALED:
                continue
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                labels = tuple(sorted({**s.labels, "target": target}.items()))
                key = (s.name, labels)
                if self._journaled.get(key) != s.value:
                    self._journaled[key] = s.value
                    self._emit(Sample(wall, s.name, s.value, labels))

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            UP, "1 when soakd's last read of the gateway's /metrics answered.", labels=["target"]
        )
        states, snapshot = self._shown  # the loop's last published copies, never changed
        for target in sorted(states):
            up.add_metric([target], 1.0 if states[target] else 0.0)
        yield up
        merged: dict[str, Metric] = {}
        for target in sorted(snapshot):
            for family in snapshot[target]:
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue
                    out.add_sample(s.name, {**s.labels, "target": target}, s.value)
        yield from merged.values()

    async def run(self) -> None:
        """Read every gateway on a fixed grid until cancelled."""
        if not self.urls:
            return
        async with aiohttp.ClientSession(trust_env=False) as session:
            next_t = time.monotonic()
            while True:
                await asyncio.gather(*(self._read(session, t) for t in self.urls))
                next_t = await sleep_until_next(next_t, self.interval)

    async def read_all(self) -> None:
        """One more read of every gateway: at the end of a run, so the journal holds their
        final counts (the report's breaker openings and rejections of the last phase)."""
        if not self.urls:
            return
        async with aiohttp.ClientSession(trust_env=False) as session:
            await asyncio.gather(*(self._read(session, t) for t in self.urls))

    async def _read(self, session: aiohttp.ClientSession, target: str) -> None:
        got = await fetch(session, Endpoint(self.urls[target]), max(0.5, self.interval), attempts=1)
        was_up = self._up.get(target, False)
        self.ingest(target, got.text if got.ok else None)
        if was_up and not got.ok:
            log.warning("gateway_metrics_unreadable", target=target, reason=got.error)


def export_gateways(
    urls: Mapping[str, str],
    interval: float,
    registry: CollectorRegistry,
    emit: Callable[[Sample], None] | None = None,
) -> GatewayExport:
    """A ``GatewayExport`` for ``urls`` (target -> gateway root URL), registered; ``emit``
    (the journal) gets what the report shows of the guard, phase by phase."""
    export = GatewayExport({t: u.rstrip("/") + "/metrics" for t, u in urls.items()}, interval, emit)
    registry.register(export)
    return export
