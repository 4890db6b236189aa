"""Probes room, server metrics: scrape a target's own /metrics into soakd's server gauges.

vLLM (``vllm:*``) and llama.cpp's ``llama-server --metrics`` (``llamacpp:*``) name the
same few things differently; the few that matter on a soak are re-exported under one
soakd name with the ``target`` label, so one dashboard shows the client's and the
server's view on one time axis. Several series of one name (vLLM data-parallel engines,
several models) are summed, except the KV-cache ratio, where the fullest one is kept:
it is the one that preempts.

The server's own latency histograms (vLLM's TTFT, E2E, queue time and inter-token
latency; llama.cpp's generation time per token) are re-exported as the mean over each
scrape interval: the change of the sum over the change of the count. Their buckets
differ from soakd's and between engines; a mean over the same 5 s that soakd's own
histograms can be rated over is what lines up on one dashboard.

Only the lines of the wanted names reach prometheus_client's parser, so a 60 kB page
costs well under a millisecond on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

from soakd.metrics import names as mn
from soakd.metrics.run import ProbeMetrics
from soakd.model import Sample
from soakd.probes._http import Endpoint, fetch
from soakd.probes._ticks import sleep_until_next
from soakd.probes.health import TargetState
from soakd.probes.leak import LeakSlope

log = structlog.get_logger()

SCRAPE_TIMEOUT_S = 5.0

# soakd field -> server names, most preferred first; ``_total`` is dropped before matching
# (prometheus_client's parser adds it to counters that lack it).
FIELDS: dict[str, tuple[str, ...]] = {
    "running": (mn.VLLM_REQUESTS_RUNNING, mn.LLAMACPP_REQUESTS_PROCESSING),
    "waiting": (mn.VLLM_REQUESTS_WAITING, mn.LLAMACPP_REQUESTS_DEFERRED),
    "kv_cache": (
        mn.VLLM_KV_CACHE_USAGE,
        mn.VLLM_GPU_CACHE_USAGE,
        mn.LLAMACPP_KV_CACHE_USAGE,
    ),
    "preemptions": (mn.VLLM_PREEMPTIONS,),
    "prefix_queries": (mn.VLLM_PREFIX_CACHE_QUERIES,),
    "prefix_hits": (mn.VLLM_PREFIX_CACHE_HITS,),
    "rss": (mn.PROCESS_RESIDENT_MEMORY_BYTES,),
    "start_time": (mn.PROCESS_START_TIME_SECONDS,),
    # cumulative sums and counts behind the server-side latency means
    "ttft_sum": (mn.VLLM_TTFT_SECONDS + "_sum",),
    "ttft_count": (mn.VLLM_TTFT_SECONDS + "_count",),
    "e2e_sum": (mn.VLLM_E2E_SECONDS + "_sum",),
    "e2e_count": (mn.VLLM_E2E_SECONDS + "_count",),
    "queue_sum": (mn.VLLM_QUEUE_SECONDS + "_sum",),
    "queue_count": (mn.VLLM_QUEUE_SECONDS + "_count",),
    "itl_sum": (mn.VLLM_ITL_SECONDS + "_sum", mn.LLAMACPP_TOKENS_PREDICTED_SECONDS),
    "itl_count": (mn.VLLM_ITL_SECONDS + "_count", mn.LLAMACPP_TOKENS_PREDICTED),
}
_MAX_FIELDS = frozenset({"kv_cache"})
_WANTED = frozenset(n for names in FIELDS.values() for n in names)

MEANS: dict[str, str] = {
    "ttft": mn.SERVER_TIME_TO_FIRST_TOKEN_MEAN_SECONDS,
    "e2e": mn.SERVER_REQUEST_DURATION_MEAN_SECONDS,
    "queue": mn.SERVER_QUEUE_TIME_MEAN_SECONDS,
    "itl": mn.SERVER_INTER_TOKEN_LATENCY_MEAN_SECONDS,
}
"""Server-side latency -> the soakd gauge of its mean over each scrape interval."""


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One scrape of a server, in soakd's units; None where the server did not say."""

    running: float | None = None
    waiting: float | None = None
    kv_cache: float | None = None  # 0-1
    preemptions: float | None = None  # cumulative, since the server started
    prefix_queries: float | None = None  # prompt tokens, cumulative likewise
    prefix_hits: float | None = None
    rss: float | None = None  # bytes
    start_time: float | None = None  # Unix seconds
    # cumulative since the server started: seconds and observations
    ttft_sum: float | None = None
    ttft_count: float | None = None
    e2e_sum: float | None = None
    e2e_count: float | None = None
    queue_sum: float | None = None
    queue_count: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None

    def histogram(self, kind: str) -> tuple[float, float] | None:
        """(sum, count) of a server-side latency in MEANS, None if the server lacks it."""
        total = getattr(self, f"{kind}_sum")
        count = getattr(self, f"{kind}_count")
        if total is None or count is None:
            return None
        return float(total), float(count)


def interval_delta(
    last: tuple[float, float] | None, now: tuple[float, float]
) -> tuple[float, float]:
    """(sum, count) observed between two readings of one cumulative histogram. A smaller
    count or sum than last time is a new server process: all of its readings are new."""
    if last is None:
        return 0.0, 0.0
    total, count = now
    if count < last[1] or total < last[0]:
        return total, count
    return total - last[0], count - last[1]


def _base(name: str) -> str:
    return name.removesuffix("_total")


def wanted_lines(text: str, wanted: frozenset[str]) -> str:
    """The sample lines of ``wanted`` names (``_total`` ignored); comments dropped."""
    keep = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < end:
                end = i
        if _base(line[:end]) in wanted:
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


def parse_samples(text: str, wanted: frozenset[str]) -> list[tuple[str, dict[str, str], float]]:
    """``(name without _total, labels, value)`` of every sample of a wanted name.

    Raises ValueError on a malformed line."""
    return [
        (_base(s.name), dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(wanted_lines(text, wanted))
        for s in family.samples
    ]


def parse_server_metrics(text: str) -> ServerReading:
    """A vLLM or llama.cpp /metrics page -> ServerReading. Raises ValueError if malformed."""
    values: dict[str, list[float]] = {}
    for name, _labels, value in parse_samples(text, _WANTED):
        values.setdefault(name, []).append(value)
    fields: dict[str, float] = {}
    for field, names in FIELDS.items():
        for name in names:
            found = values.get(name)
            if found:
                fields[field] = max(found) if field in _MAX_FIELDS else sum(found)
                break
    return ServerReading(**fields)


class ServerScraper:
    """Applies scrapes of one target to the soakd gauges, its restart state and RSS slope."""

    def __init__(
        self,
        target: str,
        ep: Endpoint,
        metrics: ProbeMetrics,
        state: TargetState,
        emit: Callable[[Sample], None],
        *,
        leak_window_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.ep = ep
        self.state = state
        self.rss_slope = LeakSlope(leak_window_s)
        self._emit = emit
        self._clock = clock
        self._wall = wall
        self._preempt_last: float | None = None
        self._counted_last: dict[str, float] = {}  # a counter re-exported -> its last reading
        self._counted: dict[str, float] = {}  # -> what soakd counted of it since it started
        self._hist_last: dict[str, tuple[float, float]] = {}  # kind -> (sum, count)
        self._means = metrics.server_means  # a series once there is a mean: none for
        # what the server does not measure (llama.cpp has no TTFT)
        self._failing = False
        t = (target,)
        self._running = metrics.running.labels(*t)
        self._waiting = metrics.waiting.labels(*t)
        self._kv = metrics.kv_cache.labels(*t)
        self._preempt = metrics.preemptions.labels(*t)
        # ServerReading field -> soakd's counter family of it (a series once the server
        # serves it: llama.cpp serves none), and its name
        self._counters = {
            "prefix_queries": (metrics.prefix_queries, mn.SERVER_PREFIX_CACHE_QUERIES_TOTAL),
            "prefix_hits": (metrics.prefix_hits, mn.SERVER_PREFIX_CACHE_HITS_TOTAL),
        }
        self._rss = metrics.server_rss.labels(*t)
        self._start = metrics.server_start.labels(*t)
        self._rss_leak_family = metrics.server_rss_leak_slope  # a series once there is a slope
        self._errors = metrics.scrape_errors.labels(*t)
        state.listeners.append(self._on_restart)

    def apply(self, r: ServerReading) -> None:
        wall = self._wall()
        labels = (("target", self.target),)
        samples: list[Sample] = []
        for value, gauge, name in (
            (r.running, self._running, mn.SERVER_REQUESTS_RUNNING),
            (r.waiting, self._waiting, mn.SERVER_REQUESTS_WAITING),
            (r.kv_cache, self._kv, mn.SERVER_KV_CACHE_USAGE_RATIO),
            (r.rss, self._rss, mn.SERVER_RESIDENT_MEMORY_BYTES),
        ):
            if value is not None:
                gauge.set(value)
                samples.append(Sample(wall, name, value, labels))
        if r.preemptions is not None:
            last = self._preempt_last
            if last is not None:
                # a smaller count is a new server process: all of its count is new
                delta = r.preemptions - last if r.preemptions >= last else r.preemptions
                if delta > 0:
                    self._preempt.inc(delta)
            self._preempt_last = r.preemptions
        for field, (family, name) in self._counters.items():
            now = getattr(r, field)
            if now is None:
                continue
            last = self._counted_last.get(field)
            self._counted_last[field] = now
            if last is None:
                continue  # the baseline: what the server counted before soakd looked
            delta = now - last if now >= last else now  # smaller: a new server process
            family.labels(self.target).inc(delta)
            total = self._counted[field] = self._counted.get(field, 0.0) + delta
            # soakd's count since it started: the report takes its increase per phase
            samples.append(Sample(wall, name, total, labels))
        if r.start_time is not None:
            self._start.set(r.start_time)
        self.state.saw_start_time(r.start_time)  # may count a restart (resets the RSS slope)
        for kind, name in MEANS.items():  # after a restart: its baselines are gone
            now = r.histogram(kind)
            if now is None:
                continue
            total, count = interval_delta(self._hist_last.get(kind), now)
            self._hist_last[kind] = now
            if count > 0:
                mean = total / count
                self._means[kind].labels(self.target).set(mean)
                samples.append(Sample(wall, name, mean, labels))
        if r.rss is not None:
            self.rss_slope.add(self._clock(), r.rss)
            slope = self.rss_slope.slope_per_hour()
            if slope is not None:
                self._rss_leak_family.labels(self.target).set(slope)
                samples.append(
                    Sample(
                        wall,
                        mn.SERVER_RESIDENT_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR,
                        slope,
                        labels,
                    )
                )
        for sample in samples:
            self._emit(sample)

    def failed(self, why: str) -> None:
        self._errors.inc()
        if not self._failing:
            self._failing = True
            log.warning("scrape_failed", target=self.target, url=self.ep.shown, error=why)

    def _on_restart(self, target: str, reason: str, down_since: float | None) -> None:
        self._hist_last.clear()  # the new process counts from zero
        if self.rss_slope.slope_per_hour() is not None:
            self._rss_leak_family.labels(self.target).set(0)
        self.rss_slope.reset()

    async def scrape(self, session: aiohttp.ClientSession, timeout_s: float) -> bool:
        res = await fetch(session, self.ep, timeout_s)
        if not res.ok:
            self.failed(res.error or f"HTTP {res.status}")
            return False
        try:
            reading = parse_server_metrics(res.text)
        except ValueError as exc:
            self.failed(f"unparsable page: {str(exc)[:120]}")
            return False
        if self._failing:
            self._failing = False
            log.info("scrape_recovered", target=self.target, url=self.ep.shown)
        self.apply(reading)
        return True

    async def run(self, session: aiohttp.ClientSession, interval: float) -> None:
        """Scrape every ``interval`` seconds until cancelled; never raises otherwise."""
        timeout = min(interval, SCRAPE_TIMEOUT_S)
        next_t = time.monotonic()
        while True:
            await self.scrape(session, timeout)
            next_t = await sleep_until_next(next_t, interval)
