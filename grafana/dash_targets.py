"""The Targets side by side dashboard (soakd-targets): every target on the same axes."""

from __future__ import annotations

from grafana.panels import Dashboard, T, q, table, timeseries


def targets() -> Dashboard:
    d = Dashboard(
        "soakd-targets",
        "soakd / Targets side by side",
        "Every target on the same axes: throughput, errors, latency.",
    )
    d.row("Now")
    columns = [
        ("req/s", "target:soakd_requests:rate1m", "reqps"),
        ("failed", "target:soakd_requests_errors:ratio_rate1m", "percentunit"),
        ("5xx (5m)", "target:soakd_requests_5xx:ratio_rate5m", "percentunit"),
        ("TTFT P50", "target:soakd_time_to_first_token_seconds:p50_5m", "s"),
        ("TTFT P99", "target:soakd_time_to_first_token_seconds:p99_5m", "s"),
        ("E2E P50", "target:soakd_request_duration_seconds:p50_5m", "s"),
        ("E2E P99", "target:soakd_request_duration_seconds:p99_5m", "s"),
        ("TPOT P99", "target:soakd_time_per_output_token_seconds:p99_5m", "s"),
        ("tokens/s", "target:soakd_output_tokens:rate1m", "short"),
        ("in flight", "soakd_in_flight_requests", "short"),
        ("up", "soakd_target_up", "short"),
    ]
    d.add(
        table(
            "Targets",
            [q(f"{metric}{{{T}}}", instant=True, fmt="table") for _, metric, _ in columns],
            rename={f"Value #{chr(ord('A') + i)}": name for i, (name, _, _) in enumerate(columns)},
            units={name: unit for name, _, unit in columns},
        ),
        24,
        6,
    )
    d.row("Over time")
    for title, metric, unit in [
        ("Requests per second", "target:soakd_requests:rate1m", "reqps"),
        ("Output tokens per second", "target:soakd_output_tokens:rate1m", "short"),
        ("Error ratio (1m)", "target:soakd_requests_errors:ratio_rate1m", "percentunit"),
        ("P99 time to first token (5m)", "target:soakd_time_to_first_token_seconds:p99_5m", "s"),
        ("P99 end-to-end latency (5m)", "target:soakd_request_duration_seconds:p99_5m", "s"),
        (
            "P99 time per output token (5m)",
            "target:soakd_time_per_output_token_seconds:p99_5m",
            "s",
        ),
    ]:
        d.add(timeseries(title, [q(f"{metric}{{{T}}}", "{{node}} {{target}}")], unit), 12)
    by = "sum by (node, site, target)"
    d.add(
        timeseries(
            "Checks passed (5m)",
            [
                q(
                    f'{by} (increase(soakd_checks_total{{{T}, result="pass"}}[5m]))'
                    f" / {by} (increase(soakd_checks_total{{{T}}}[5m]))",
                    "{{node}} ({{site}}) {{target}}",
                )
            ],
            "percentunit",
            max_=1,
            desc="Share of the checks judged in the last 5 minutes that passed, per target, "
            "node and site (docs/checks.md; only with checks: in the config). AnswersWrong "
            "pages below 90 %.",
        ),
        12,
    )
    return d
