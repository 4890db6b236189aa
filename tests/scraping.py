"""Reading Prometheus exposition text in tests: a page as {(name, labels): value}, a sum
over matching labels, a GET of a live /metrics page, and a Metrics registry scraped in
process.

Used by tests/integration/test_soak_sim.py and test_workers.py (live pages), and by the
journal tests (tests/journal_fixtures.py, tests/unit/test_journal*.py: a registry).
"""

from __future__ import annotations

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.metrics.run import Metrics

Key = tuple[str, tuple[tuple[str, str], ...]]
NOT_CONTINUED = ("soakd_ttft_by_context_seconds", "soakd_turn_ttft_seconds")
"""soakd_ families a resume does not continue: they start at 0 (docs/metrics.md)."""


def continued(scrape: dict[Key, float]) -> dict[Key, float]:
    """``scrape`` without the families a resume starts at 0 (``NOT_CONTINUED``)."""
    return {k: v for k, v in scrape.items() if not k[0].startswith(NOT_CONTINUED)}


"""A sample's name and its labels, sorted."""


def samples(text: str) -> dict[Key, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(metrics: dict[Key, float], name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lbl), v in metrics.items()
        if n == name and all(dict(lbl).get(k) == x for k, x in labels.items())
    )


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        return await resp.text()


def scraped(metrics: Metrics, prefix: str) -> dict[Key, float]:
    """The samples of ``metrics``' registry whose names start with ``prefix`` (the
    ``_created`` timestamps left out)."""
    return {
        key: value
        for key, value in samples(generate_latest(metrics.registry).decode()).items()
        if key[0].startswith(prefix) and not key[0].endswith("_created")
    }
