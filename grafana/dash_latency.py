"""The Latency detail dashboard (soakd-latency): soakd's histograms and the server's."""

from __future__ import annotations

from grafana.panels import BOX, Dashboard, T, heatmap, per_box, q, timeseries


def latency() -> Dashboard:
    d = Dashboard(
        "soakd-latency",
        "soakd / Latency detail",
        "soakd's latency histograms as heatmaps, percentiles, and the server's own "
        "view next to soakd's.",
    )
    d.row("Distributions (requests per bucket)")
    d.add(heatmap("End-to-end latency", "soakd_request_duration_seconds"), 12)
    d.add(heatmap("Time to first token", "soakd_time_to_first_token_seconds"), 12)
    d.add(
        heatmap(
            "Inter-token latency",
            "soakd_inter_token_latency_seconds",
            desc="Each gap between consecutive content chunks.",
        ),
        8,
    )
    d.add(
        heatmap(
            "Time per output token",
            "soakd_time_per_output_token_seconds",
            desc="(E2E - TTFT) / (output tokens - 1), per request.",
        ),
        8,
    )
    d.add(
        heatmap(
            "Dispatch lag", "soakd_dispatch_lag_seconds", desc="Actual minus scheduled send time."
        ),
        8,
    )
    d.row("Percentiles")
    d.add(
        timeseries(
            "Inter-token latency, P50 and P99 (5m)",
            [
                q(
                    f"target:soakd_inter_token_latency_seconds:p50_5m{{{T}}}",
                    "{{node}} {{target}} P50",
                ),
                q(
                    f"target:soakd_inter_token_latency_seconds:p99_5m{{{T}}}",
                    "{{node}} {{target}} P99",
                ),
            ],
            "s",
        ),
        8,
    )
    d.add(
        timeseries(
            "Time per output token, P50 and P99 (5m)",
            [
                q(
                    f"target:soakd_time_per_output_token_seconds:p50_5m{{{T}}}",
                    "{{node}} {{target}} P50",
                ),
                q(
                    f"target:soakd_time_per_output_token_seconds:p99_5m{{{T}}}",
                    "{{node}} {{target}} P99",
                ),
            ],
            "s",
        ),
        8,
    )
    d.add(
        timeseries(
            "Dispatch lag P99 (1m)",
            [
                q(f"target:soakd_dispatch_lag_seconds:p99_1m{{{T}}}", "{{node}} {{target}}"),
                q(per_box("soakd_dispatch_lag_limit_seconds"), "{{node}} limit"),
            ],
            "s",
            limit_series="limit",
        ),
        8,
    )
    d.add(
        timeseries(
            "P99 jitter (stddev / mean of the hour's twelve 5m P99s)",
            [
                q(
                    f"target:soakd_request_duration_seconds:p99_5m_jitter1h{{{T}}}",
                    "{{node}} {{target}} E2E",
                ),
                q(
                    f"target:soakd_time_to_first_token_seconds:p99_5m_jitter1h{{{T}}}",
                    "{{node}} {{target}} TTFT",
                ),
                q(per_box("soakd_jitter_ratio_limit"), "{{node}} limit"),
            ],
            "percentunit",
            limit_series="limit",
            desc="Jitter as docs/metrics.md defines it (the report uses the same): the "
            "coefficient of variation of the twelve 5-minute P99s of the last hour (those of "
            "20 requests or more). Drawn from 15 minutes of run on (3 P99s); the jitter "
            "alerts wait for one hour.",
        ),
        24,
    )
    d.row("TTFT by context length and by turn")
    for title, metric, label, legend, desc in (
        (
            "TTFT by context length, P50 and P99 (5m)",
            "soakd_ttft_by_context_seconds",
            "context",
            "<= {{context}} tok",
            "TTFT by the served prompt tokens' bucket (its upper bound, powers of two): the "
            "curve of KV-cache pressure, a long context waiting longer for its first token. "
            "Starts again at 0 after a resume (docs/metrics.md).",
        ),
        (
            "TTFT by turn, P50 and P99 (5m)",
            "soakd_turn_ttft_seconds",
            "turn",
            "turn {{turn}}",
            "TTFT of conversation turns by turn index (16+: every later turn); each turn "
            "sends the history so far, so the context grows turn by turn. Empty without "
            "conversations.",
        ),
    ):
        d.add(
            timeseries(
                title,
                [
                    q(
                        f"histogram_quantile({quantile}, sum by ({BOX}, target, {label}, le) "
                        f"(rate({metric}_bucket{{{T}}}[5m])))",
                        f"{{{{node}}}} {{{{target}}}} {legend} {name}",
                    )
                    for quantile, name in ((0.5, "P50"), (0.99, "P99"))
                ],
                "s",
                desc=desc,
            ),
            12,
        )
    d.row("soakd (client) next to the server (vLLM /metrics)")
    d.add(
        timeseries(
            "P99 time to first token: client vs server (5m)",
            [
                q(
                    f"target:soakd_time_to_first_token_seconds:p99_5m{{{T}}}",
                    "{{node}} {{target}} soakd",
                ),
                q(
                    f"histogram_quantile(0.99, sum by ({BOX}, target, le) (rate("
                    f"vllm:time_to_first_token_seconds_bucket{{{T}}}[5m])))",
                    "{{node}} {{target}} server",
                ),
            ],
            "s",
            desc="The server counts from when it received the request, soakd from when "
            "it sent it: the gap is network and HTTP front end.",
        ),
        8,
    )
    d.add(
        timeseries(
            "P99 end-to-end latency: client vs server (5m)",
            [
                q(
                    f"target:soakd_request_duration_seconds:p99_5m{{{T}}}",
                    "{{node}} {{target}} soakd",
                ),
                q(
                    f"histogram_quantile(0.99, sum by ({BOX}, target, le) (rate("
                    f"vllm:e2e_request_latency_seconds_bucket{{{T}}}[5m])))",
                    "{{node}} {{target}} server",
                ),
            ],
            "s",
        ),
        8,
    )
    d.add(
        timeseries(
            "P99 server queue time (5m)",
            [
                q(
                    f"histogram_quantile(0.99, sum by ({BOX}, target, le) (rate("
                    f"vllm:request_queue_time_seconds_bucket{{{T}}}[5m])))",
                    "{{node}} {{target}}",
                ),
            ],
            "s",
            desc="Time requests waited in the server's queue before being scheduled.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Generated tokens per second: client vs server",
            [
                q(f"target:soakd_output_tokens:rate1m{{{T}}}", "{{node}} {{target}} soakd"),
                q(
                    f"sum by ({BOX}, target) (rate("
                    f"vllm:generation_tokens_total{{{T}}}[$__rate_interval]))",
                    "{{node}} {{target}} server",
                ),
            ],
            "short",
        ),
        24,
    )
    return d
