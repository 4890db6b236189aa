"""The Server internals dashboard (soakd-server): what the inference servers report."""

from __future__ import annotations

from grafana.panels import BOX, Dashboard, T, q, stat, state_timeline, timeseries


def server() -> Dashboard:
    d = Dashboard(
        "soakd-server",
        "soakd / Server internals",
        "What the inference servers report, re-exported by soakd with a target "
        "label: queue, KV cache, preemptions, restarts, OOMs.",
    )
    d.row("Scheduler")
    d.add(
        timeseries(
            "Requests running and waiting in the server",
            [
                q(f"soakd_server_requests_running{{{T}}}", "{{node}} {{target}} running"),
                q(f"soakd_server_requests_waiting{{{T}}}", "{{node}} {{target}} waiting"),
                q(f"soakd_in_flight_requests{{{T}}}", "{{node}} {{target}} in flight (soakd)"),
            ],
            desc="Waiting > 0 means the server queues: TTFT grows with it.",
        ),
        12,
    )
    d.add(
        timeseries(
            "KV cache usage",
            [
                q(f"soakd_server_kv_cache_usage_ratio{{{T}}}", "{{node}} {{target}}"),
            ],
            "percentunit",
            max_=1,
        ),
        12,
    )
    d.add(
        timeseries(
            "Preemptions per second",
            [
                q(
                    f"rate(soakd_server_preemptions_total{{{T}}}[$__rate_interval])",
                    "{{node}} {{target}}",
                ),
            ],
            "short",
            desc="Requests evicted from the KV cache and recomputed later.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Server resident memory",
            [
                q(f"soakd_server_resident_memory_bytes{{{T}}}", "{{node}} {{target}}"),
            ],
            "bytes",
            desc="The server process's RSS (host memory), from its own /metrics.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Server resident memory slope (bytes per hour)",
            [
                q(
                    f"soakd_server_resident_memory_leak_slope_bytes_per_hour{{{T}}}",
                    "{{node}} {{target}}",
                ),
            ],
            "bytes",
            min_=None,
            desc="Robust slope of the RSS over soakd's leak window: a host-memory leak.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Prefix cache hit ratio",
            [
                q(
                    f"rate(soakd_server_prefix_cache_hits_total{{{T}}}[$__rate_interval]) / "
                    f"rate(soakd_server_prefix_cache_queries_total{{{T}}}[$__rate_interval])",
                    "{{node}} {{target}}",
                ),
            ],
            "percentunit",
            max_=1,
            desc="Prompt tokens found in the server's prefix cache over those looked up "
            "(vLLM's prefix_cache_hits/queries); the planned shared prefixes are in the "
            "report. llama-server serves no such counter.",
        ),
        24,
    )
    d.row("Health")
    d.add(
        state_timeline(
            "Target up",
            [q(f"soakd_target_up{{{T}}}", "{{node}} {{target}}")],
            mapping={"0": ("down", "red"), "1": ("up", "green")},
        ),
        12,
    )
    d.add(
        timeseries(
            "Server uptime",
            [
                q(f"time() - soakd_server_start_time_seconds{{{T}}}", "{{node}} {{target}}"),
            ],
            "dtdurations",
            desc="Drops to zero when the server restarts.",
        ),
        12,
    )
    d.add(
        stat(
            "Restarts this run",
            [
                q(
                    f"sum by ({BOX}, target) (soakd_target_restarts_total{{{T}}})",
                    "{{node}} {{target}}",
                ),
            ],
            thresholds=[(None, "green"), (1, "orange")],
        ),
        6,
        5,
    )
    d.add(
        stat(
            "OOM events this run (most seen by one source)",
            [
                q(
                    f"max by ({BOX}, target) (soakd_target_oom_events_total{{{T}}})",
                    "{{node}} {{target}}",
                ),
            ],
            thresholds=[(None, "green"), (1, "red")],
        ),
        6,
        5,
    )
    d.add(
        timeseries(
            "OOM events by source",
            [
                q(
                    f"sum by ({BOX}, target, source) (soakd_target_oom_events_total{{{T}}})",
                    "{{node}} {{target}} {{source}}",
                ),
                q(f"soakd_oom_errors_total{{{T}}}", "{{node}} {{target}} error bodies"),
            ],
            desc="Cumulative; TargetOOM fires on any increase.",
        ),
        12,
        5,
    )
    d.add(
        timeseries(
            "Failed scrapes of the server's /metrics",
            [
                q(
                    f"rate(soakd_target_scrape_errors_total{{{T}}}[$__rate_interval])",
                    "{{node}} {{target}}",
                ),
            ],
            "short",
        ),
        24,
        6,
    )
    return d
