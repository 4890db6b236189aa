"""Metrics room, the probes' families: GPU (NVML, DCGM), the target's health, restarts,
OOMs and server scrape. Beside ``soakd/metrics/run.py`` (the run's own), which re-exports them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from soakd.metrics import names as mn

THROTTLE_REASONS = (
    "gpu_idle",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clock",
    "other",
)
OOM_SOURCES = ("error_body", "restart_after_errors", "process_vanished", "xid", "log")


class ProbeMetrics:
    """GPU, server-side and health metrics, filled by the probes (soakd/probes/)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        gpu = ["gpu"]
        self.probe_up = Gauge(
            mn.GPU_PROBE_UP,
            "1 when the GPU source answers, 0 when absent or failing.",
            ["source"],
            registry=r,
        )
        self.gpu_info = Gauge(
            mn.GPU_INFO, "Always 1; names each GPU.", ["gpu", "uuid", "name"], registry=r
        )
        self.mem_total = Gauge(mn.GPU_MEMORY_TOTAL_BYTES, "GPU memory in all.", gpu, registry=r)
        self.mem_used = Gauge(mn.GPU_MEMORY_USED_BYTES, "GPU memory used.", gpu, registry=r)
        self.mem_free = Gauge(mn.GPU_MEMORY_FREE_BYTES, "GPU memory free.", gpu, registry=r)
        self.mem_reserved = Gauge(
            mn.GPU_MEMORY_RESERVED_BYTES, "GPU memory reserved by the driver.", gpu, registry=r
        )
        self.mem_peak = Gauge(
            mn.GPU_MEMORY_USED_PEAK_BYTES, "Highest GPU memory used seen this run.", gpu, registry=r
        )
        self.proc_mem = Gauge(
            mn.GPU_PROCESS_MEMORY_BYTES,
            "GPU memory of the target's process ('other' for processes of no target).",
            ["gpu", "target"],
            registry=r,
        )
        self.leak_slope = Gauge(
            mn.GPU_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR,
            "Robust (Theil-Sen) slope of GPU memory used over the leak window.",
            gpu,
            registry=r,
        )
        self.leak_window_fill = Gauge(
            mn.GPU_MEMORY_LEAK_WINDOW_FILL_RATIO,
            "How much of the leak window the slope's readings span (0-1): the VramLeak alert "
            "waits for 0.8.",
            gpu,
            registry=r,
        )
        self.proc_leak_slope = Gauge(
            mn.GPU_PROCESS_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR,
            "Robust slope of the target's GPU process memory over the leak window.",
            ["gpu", "target"],
            registry=r,
        )
        self.temperature = Gauge(mn.GPU_TEMPERATURE_CELSIUS, "GPU temperature.", gpu, registry=r)
        self.power = Gauge(mn.GPU_POWER_WATTS, "GPU power draw.", gpu, registry=r)
        self.energy = Counter(
            mn.GPU_ENERGY_JOULES_TOTAL, "GPU energy used since soakd started.", gpu, registry=r
        )
        self.sm_clock = Gauge(mn.GPU_SM_CLOCK_HERTZ, "SM clock.", gpu, registry=r)
        self.mem_clock = Gauge(mn.GPU_MEMORY_CLOCK_HERTZ, "Memory clock.", gpu, registry=r)
        self.utilization = Gauge(
            mn.GPU_UTILIZATION_RATIO, "GPU busy fraction (0-1).", gpu, registry=r
        )
        self.throttle = Gauge(
            mn.GPU_THROTTLE_ACTIVE,
            "1 while the clock is held back for this reason.",
            ["gpu", "reason"],
            registry=r,
        )
        self.xid = Counter(
            mn.GPU_XID_ERRORS_TOTAL, "XID critical errors by code.", ["gpu", "xid"], registry=r
        )

        target = ["target"]
        self.target_up = Gauge(
            mn.TARGET_UP, "1 when the target's health check answers.", target, registry=r
        )
        self.restarts = Counter(
            mn.TARGET_RESTARTS_TOTAL, "Times the target's server restarted.", target, registry=r
        )
        self.oom_events = Counter(
            mn.TARGET_OOM_EVENTS_TOTAL,
            "Out-of-memory events, by where soakd saw them.",
            ["target", "source"],
            registry=r,
        )
        self.scrape_errors = Counter(
            mn.TARGET_SCRAPE_ERRORS_TOTAL,
            "Failed scrapes of the target's /metrics.",
            target,
            registry=r,
        )
        self.running = Gauge(
            mn.SERVER_REQUESTS_RUNNING,
            "Requests the server is running (vllm:num_requests_running).",
            target,
            registry=r,
        )
        self.waiting = Gauge(
            mn.SERVER_REQUESTS_WAITING,
            "Requests queued in the server (vllm:num_requests_waiting).",
            target,
            registry=r,
        )
        self.kv_cache = Gauge(
            mn.SERVER_KV_CACHE_USAGE_RATIO,
            "KV cache in use, 0-1 (vllm:kv_cache_usage_perc).",
            target,
            registry=r,
        )
        self.preemptions = Counter(
            mn.SERVER_PREEMPTIONS_TOTAL, "Preemptions reported by the server.", target, registry=r
        )
        # the server's prefix cache, in prompt tokens (vllm:prefix_cache_queries_total and
        # vllm:prefix_cache_hits_total): their ratio is its hit ratio
        self.prefix_queries = Counter(
            mn.SERVER_PREFIX_CACHE_QUERIES_TOTAL,
            "Prompt tokens the server looked up in its prefix cache "
            "(vllm:prefix_cache_queries_total).",
            target,
            registry=r,
        )
        self.prefix_hits = Counter(
            mn.SERVER_PREFIX_CACHE_HITS_TOTAL,
            "Prompt tokens the server found in its prefix cache (vllm:prefix_cache_hits_total).",
            target,
            registry=r,
        )
        self.server_rss = Gauge(
            mn.SERVER_RESIDENT_MEMORY_BYTES,
            "The server process's resident memory.",
            target,
            registry=r,
        )
        self.server_start = Gauge(
            mn.SERVER_START_TIME_SECONDS,
            "The server process's start time (Unix).",
            target,
            registry=r,
        )
        self.server_rss_leak_slope = Gauge(
            mn.SERVER_RESIDENT_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR,
            "Robust slope of the server process's resident memory over the leak window.",
            target,
            registry=r,
        )
        self.server_means = {
            "ttft": Gauge(
                mn.SERVER_TIME_TO_FIRST_TOKEN_MEAN_SECONDS,
                "Server-side mean TTFT over the last scrape interval "
                "(vllm:time_to_first_token_seconds).",
                target,
                registry=r,
            ),
            "e2e": Gauge(
                mn.SERVER_REQUEST_DURATION_MEAN_SECONDS,
                "Server-side mean end-to-end latency over the last scrape interval "
                "(vllm:e2e_request_latency_seconds).",
                target,
                registry=r,
            ),
            "queue": Gauge(
                mn.SERVER_QUEUE_TIME_MEAN_SECONDS,
                "Server-side mean queue time over the last scrape interval "
                "(vllm:request_queue_time_seconds).",
                target,
                registry=r,
            ),
            "itl": Gauge(
                mn.SERVER_INTER_TOKEN_LATENCY_MEAN_SECONDS,
                "Server-side mean time per generated token over the last scrape "
                "interval (vllm:inter_token_latency_seconds, llama.cpp's "
                "tokens_predicted_seconds / tokens_predicted).",
                target,
                registry=r,
            ),
        }
        self.e2e_p99_interval = Gauge(
            mn.E2E_P99_INTERVAL_SECONDS,
            "Client-side P99 end-to-end latency of the last closed drift interval.",
            target,
            registry=r,
        )
        self.e2e_p99_drift = Gauge(
            mn.E2E_P99_DRIFT_SECONDS_PER_HOUR,
            "Robust (Theil-Sen) slope of the per-interval P99 end-to-end latency over the "
            "drift window.",
            target,
            registry=r,
        )
