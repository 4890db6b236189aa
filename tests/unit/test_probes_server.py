"""Server /metrics parsing: real vLLM 0.32 and llama-server pages into soakd's server gauges."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from soakd.metrics.run import ProbeMetrics
from soakd.model import Sample
from soakd.probes._http import Endpoint
from soakd.probes.health import TargetState
from soakd.probes.server import ServerReading, ServerScraper, parse_server_metrics, wanted_lines

DATA = Path(__file__).parent.parent / "data"
VLLM = (DATA / "vllm-0.32-cpu-metrics.txt").read_text()
LLAMA = (DATA / "llama-server-metrics.txt").read_text()


def with_value(text: str, name: str, value: str) -> str:
    """The page with every sample of ``name`` set to ``value``."""
    return re.sub(
        rf"^({re.escape(name)}(?:{{[^}}]*}})?) \S+$", rf"\g<1> {value}", text, flags=re.MULTILINE
    )


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scraper(clock: Clock | None = None) -> tuple[ServerScraper, CollectorRegistry, list[Sample]]:
    reg = CollectorRegistry()
    metrics = ProbeMetrics(reg)
    samples: list[Sample] = []
    clock = clock or Clock()
    state = TargetState("local", metrics, samples.append, clock=clock)
    s = ServerScraper(
        "local",
        Endpoint("http://127.0.0.1:1/metrics"),
        metrics,
        state,
        samples.append,
        leak_window_s=600,
        clock=clock,
    )
    return s, reg, samples


def get(reg: CollectorRegistry, metric: str) -> float | None:
    return reg.get_sample_value(metric, {"target": "local"})


def test_vllm_page_as_captured() -> None:
    r = parse_server_metrics(VLLM)
    assert r == ServerReading(
        running=0.0,
        waiting=0.0,
        kv_cache=0.0,
        preemptions=0.0,
        prefix_queries=2487.0,
        prefix_hits=0.0,
        rss=7.54118656e8,
        start_time=1.79596457106e9,
        ttft_sum=8.008665800094604,
        ttft_count=149.0,
        e2e_sum=198.80682754516602,
        e2e_count=149.0,
        queue_sum=0.008799197002076653,
        queue_count=149.0,
        itl_sum=189.00370669900292,
        itl_count=21675.0,
    )


def test_prefix_cache_counters_are_re_exported_from_the_first_reading_on() -> None:
    """vLLM's prefix-cache counters (prompt tokens looked up, found): soakd counts what they
    rose by since its first scrape (the server's earlier count is its baseline), a smaller
    count is a new server process, and each scrape journals soakd's count so far."""
    s, reg, samples = scraper()
    for queries, hits in ((1000.0, 100.0), (1600.0, 400.0), (200.0, 50.0)):
        s.apply(ServerReading(prefix_queries=queries, prefix_hits=hits))
    assert get(reg, "soakd_server_prefix_cache_queries_total") == 600 + 200
    assert get(reg, "soakd_server_prefix_cache_hits_total") == 300 + 50
    journaled = [(x.name, x.value) for x in samples if "prefix" in x.name]
    assert journaled[-2:] == [
        ("soakd_server_prefix_cache_queries_total", 800.0),
        ("soakd_server_prefix_cache_hits_total", 350.0),
    ]
    # llama.cpp serves no such counter: no series at all, not a zero
    s2, reg2, _ = scraper()
    s2.apply(parse_server_metrics(LLAMA))
    assert get(reg2, "soakd_server_prefix_cache_hits_total") is None


def test_vllm_page_under_load() -> None:
    text = with_value(VLLM, "vllm:num_requests_running", "7.0")
    text = with_value(text, "vllm:num_requests_waiting", "3.0")
    text = with_value(text, "vllm:kv_cache_usage_perc", "0.4375")
    text = with_value(text, "vllm:num_preemptions_total", "12.0")
    r = parse_server_metrics(text)
    assert (r.running, r.waiting, r.kv_cache, r.preemptions) == (7, 3, 0.4375, 12)


def test_llama_server_page() -> None:
    r = parse_server_metrics(LLAMA)
    assert r == ServerReading(running=0.0, waiting=0.0, itl_sum=0.001218, itl_count=16.0)
    busy = with_value(
        with_value(LLAMA, "llamacpp:requests_processing", "4"), "llamacpp:requests_deferred", "2"
    )
    busy += "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
    r = parse_server_metrics(busy)
    assert (r.running, r.waiting, r.kv_cache) == (4, 2, 0.25)


def test_older_vllm_and_several_engines() -> None:
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.9
vllm:num_preemptions_total{engine="0",model_name="m"} 2
vllm:num_preemptions_total{engine="1",model_name="m"} 1
"""
    r = parse_server_metrics(text)
    assert (r.running, r.kv_cache, r.preemptions) == (8, 0.9, 3)
    assert r.start_time is None


def test_only_wanted_lines_reach_the_parser() -> None:
    kept = wanted_lines(VLLM, frozenset({"vllm:num_requests_running", "vllm:num_preemptions"}))
    assert kept.splitlines() == [
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
        'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 0.0',
    ]


def test_malformed_page_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_server_metrics('vllm:num_requests_running{engine="0" 1\n')


def test_gauges_preemptions_and_samples() -> None:
    s, reg, samples = scraper()
    s.apply(parse_server_metrics(with_value(VLLM, "vllm:num_preemptions_total", "5.0")))
    assert get(reg, "soakd_server_requests_running") == 0
    assert get(reg, "soakd_server_kv_cache_usage_ratio") == 0
    assert get(reg, "soakd_server_resident_memory_bytes") == 7.54118656e8
    assert get(reg, "soakd_server_start_time_seconds") == 1.79596457106e9
    assert get(reg, "soakd_server_preemptions_total") == 0  # the first page is the baseline
    s.apply(parse_server_metrics(with_value(VLLM, "vllm:num_preemptions_total", "9.0")))
    assert get(reg, "soakd_server_preemptions_total") == 4
    names = {x.name for x in samples}
    assert {
        "soakd_server_requests_running",
        "soakd_server_requests_waiting",
        "soakd_server_kv_cache_usage_ratio",
        "soakd_server_resident_memory_bytes",
    } <= names
    assert get(reg, "soakd_target_restarts_total") == 0


def test_new_start_time_is_one_restart_and_resets_counts() -> None:
    s, reg, _ = scraper()
    s.apply(parse_server_metrics(with_value(VLLM, "vllm:num_preemptions_total", "9.0")))
    s.apply(parse_server_metrics(VLLM))  # same start time, same process
    restarted = with_value(VLLM, "process_start_time_seconds", "1.7959650e+09")
    restarted = with_value(restarted, "vllm:num_preemptions_total", "2.0")
    s.apply(parse_server_metrics(restarted))
    s.apply(parse_server_metrics(restarted))
    assert get(reg, "soakd_target_restarts_total") == 1
    # 9 before the restart was the baseline; 2 from the new process are new
    assert get(reg, "soakd_server_preemptions_total") == 2
    assert get(reg, "soakd_server_start_time_seconds") == 1.795965e9


def test_rss_leak_slope() -> None:
    clock = Clock()
    s, reg, _ = scraper(clock)
    for i in range(120):  # 5 s scrapes, 10 minutes, RSS growing 36 MB/h
        clock.t = i * 5.0
        s.apply(ServerReading(rss=1e9 + 36e6 * clock.t / 3600, start_time=1.7e9))
    slope = get(reg, "soakd_server_resident_memory_leak_slope_bytes_per_hour")
    assert slope == pytest.approx(36e6, rel=0.01)


def _bump(text: str, name: str, by: float) -> str:
    """The page with every ``name`` sample (a _sum or _count) increased by ``by``."""

    def up(m: re.Match[str]) -> str:
        return f"{m.group(1)} {float(m.group(2)) + by!r}"

    return re.sub(rf"^({re.escape(name)}(?:{{[^}}]*}})?) (\S+)$", up, text, flags=re.MULTILINE)


def test_server_latency_means_over_the_scrape_interval() -> None:
    """vLLM's own TTFT/E2E/queue/ITL histograms -> soakd gauges of the interval's mean."""
    s, reg, samples = scraper()
    s.apply(parse_server_metrics(VLLM))  # the capture: 149 requests since vLLM started
    for kind in ("time_to_first_token", "request_duration", "queue_time", "inter_token_latency"):
        assert get(reg, f"soakd_server_{kind}_mean_seconds") is None  # a baseline, no mean
    # 10 more requests: TTFT 0.05 s each, E2E 1.2 s each; 300 more tokens at 4 ms
    text = _bump(VLLM, "vllm:time_to_first_token_seconds_count", 10)
    text = _bump(text, "vllm:time_to_first_token_seconds_sum", 0.5)
    text = _bump(text, "vllm:e2e_request_latency_seconds_count", 10)
    text = _bump(text, "vllm:e2e_request_latency_seconds_sum", 12.0)
    text = _bump(text, "vllm:request_queue_time_seconds_count", 10)
    text = _bump(text, "vllm:request_queue_time_seconds_sum", 0.25)
    text = _bump(text, "vllm:inter_token_latency_seconds_count", 300)
    text = _bump(text, "vllm:inter_token_latency_seconds_sum", 1.2)
    s.apply(parse_server_metrics(text))
    assert get(reg, "soakd_server_time_to_first_token_mean_seconds") == pytest.approx(0.05)
    assert get(reg, "soakd_server_request_duration_mean_seconds") == pytest.approx(1.2)
    assert get(reg, "soakd_server_queue_time_mean_seconds") == pytest.approx(0.025)
    assert get(reg, "soakd_server_inter_token_latency_mean_seconds") == pytest.approx(0.004)
    assert "soakd_server_request_duration_mean_seconds" in {x.name for x in samples}
    # an idle interval: no request finished, the last mean stays
    s.apply(parse_server_metrics(text))
    assert get(reg, "soakd_server_request_duration_mean_seconds") == pytest.approx(1.2)


def test_server_latency_means_across_a_restart() -> None:
    s, reg, _ = scraper()
    s.apply(parse_server_metrics(VLLM))
    # a new process (new start time) that has served 4 requests of 2 s each
    fresh = with_value(VLLM, "process_start_time_seconds", "1.7959650e+09")
    fresh = with_value(fresh, "vllm:e2e_request_latency_seconds_count", "4.0")
    fresh = with_value(fresh, "vllm:e2e_request_latency_seconds_sum", "8.0")
    s.apply(parse_server_metrics(fresh))
    assert get(reg, "soakd_target_restarts_total") == 1
    # the restart dropped the old baselines: this page is the new one, no mean yet
    assert get(reg, "soakd_server_request_duration_mean_seconds") is None
    more = with_value(fresh, "vllm:e2e_request_latency_seconds_count", "6.0")
    more = with_value(more, "vllm:e2e_request_latency_seconds_sum", "11.0")
    s.apply(parse_server_metrics(more))
    assert get(reg, "soakd_server_request_duration_mean_seconds") == pytest.approx(1.5)


def test_a_smaller_count_without_a_start_time_is_a_new_process() -> None:
    s, reg, _ = scraper()
    s.apply(ServerReading(e2e_sum=100.0, e2e_count=50.0))
    s.apply(ServerReading(e2e_sum=3.0, e2e_count=2.0))  # llama.cpp exports no start time
    assert get(reg, "soakd_server_request_duration_mean_seconds") == pytest.approx(1.5)


def test_llama_server_time_per_token() -> None:
    """llama.cpp has no latency histograms; its generation seconds per generated token
    is the server-side inter-token latency."""
    s, reg, _ = scraper()
    s.apply(parse_server_metrics(LLAMA))  # 16 tokens in 1.218 ms
    busy = with_value(LLAMA, "llamacpp:tokens_predicted_total", "116")
    busy = with_value(busy, "llamacpp:tokens_predicted_seconds_total", "0.201218")
    s.apply(parse_server_metrics(busy))
    assert get(reg, "soakd_server_inter_token_latency_mean_seconds") == pytest.approx(0.002)
    assert get(reg, "soakd_server_time_to_first_token_mean_seconds") is None
