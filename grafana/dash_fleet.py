"""The Fleet dashboard (soakd-fleet): every box at a glance, one row each, worst first."""

from __future__ import annotations

from grafana.panels import BOX, Dashboard, F, T, boxes_seen, fleet_table, per_box, q, timeseries


def fleet() -> Dashboard:
    d = Dashboard(
        "soakd-fleet",
        "soakd / Fleet",
        "Every box at a glance, one row each, worst first: up, pages, goodput, latency "
        "against the SLO, VRAM against the limit, OOMs, restarts, leak slope.",
    )
    d.row("Boxes (one row per node; click a column to sort)")
    columns: list[tuple[str, str, str, list[tuple[float | None, str]]]] = [
        # (column, expression, unit, thresholds)
        (
            "soakd up",
            f'max by ({BOX}) (last_over_time(up{{job="soakd", {F}}}[1m])) or {boxes_seen()}',
            "short",
            [(None, "red"), (1, "green")],
        ),
        (
            "pages firing",
            f'count by ({BOX}) (ALERTS{{alertstate="firing", severity="page", {F}}})'
            f" or {boxes_seen()}",
            "short",
            [(None, "green"), (1, "red")],
        ),
        (
            "goodput (worst target, 1m)",
            f"min by ({BOX}) (soakd_goodput_ratio{{{T}}} >= 0)",
            "percentunit",
            [(None, "red"), (0.9, "orange"), (0.99, "green")],
        ),
        (
            "TTFT P99 / SLO",
            f"max by ({BOX}) (target:soakd_time_to_first_token_seconds:p99_5m{{{T}}}"
            f" / on ({BOX}, job, instance) group_left soakd_slo_ttft_p99_seconds{{{F}}})",
            "percentunit",
            [(None, "green"), (0.8, "orange"), (1, "red")],
        ),
        (
            "E2E P99 / SLO",
            f"max by ({BOX}) (target:soakd_request_duration_seconds:p99_5m{{{T}}}"
            f" / on ({BOX}, job, instance) group_left soakd_slo_e2e_p99_seconds{{{F}}})",
            "percentunit",
            [(None, "green"), (0.8, "orange"), (1, "red")],
        ),
        (
            "VRAM peak / limit",
            f"max by ({BOX}) (soakd_gpu_memory_used_peak_bytes{{{F}}}"
            f" / on ({BOX}, job, instance) group_left soakd_vram_limit_bytes{{{F}}})",
            "percentunit",
            [(None, "green"), (0.95, "orange"), (1, "red")],
        ),
        (
            "OOM events (run)",
            f"sum by ({BOX}) (max by ({BOX}, target) (soakd_target_oom_events_total{{{T}}}))",
            "short",
            [(None, "green"), (1, "red")],
        ),
        (
            "restarts (run)",
            f"sum by ({BOX}) (soakd_target_restarts_total{{{T}}})",
            "short",
            [(None, "green"), (1, "orange")],
        ),
        (
            "VRAM leak slope",
            f"max by ({BOX}) (soakd_gpu_memory_leak_slope_bytes_per_hour{{{F}}})",
            "decbytes",
            [(None, "green"), (50e6, "orange")],
        ),
    ]
    d.add(
        fleet_table(
            "Boxes, worst first",
            [(name, expr, unit, steps) for name, expr, unit, steps in columns],
            sort_by="pages firing",
            desc="One row per box (node) and its site. soakd up: 1 when the box's "
            "Prometheus scraped soakd within the last minute, 0 when not (or when its data "
            "stopped arriving centrally: a silent box keeps its row for the time range). "
            "Pages firing: the box's own page alerts and the central's about it. Goodput: "
            "the worst target's share of requests within every SLO over the last minute. "
            "P99 / SLO and VRAM peak / limit: above 100 % is a breach (worst target or GPU). "
            "OOMs and restarts: this run so far. Sorted by pages firing; click any column.",
        ),
        24,
        9,
    )
    d.row("Over time, one line per box")
    d.add(
        timeseries(
            "Pages firing",
            [
                q(
                    f'count by ({BOX}) (ALERTS{{alertstate="firing", severity="page", {F}}})'
                    f" or {boxes_seen()}",
                    "{{node}} ({{site}})",
                )
            ],
        ),
        12,
    )
    d.add(
        timeseries(
            "Goodput (worst target, 1m)",
            [q(f"min by ({BOX}) (soakd_goodput_ratio{{{T}}} >= 0)", "{{node}} ({{site}})")],
            "percentunit",
            max_=1,
        ),
        12,
    )
    d.add(
        timeseries(
            "TTFT P99 (5m, worst target) and SLO",
            [
                q(
                    f"max by ({BOX}) (target:soakd_time_to_first_token_seconds:p99_5m{{{T}}})",
                    "{{node}} ({{site}})",
                ),
                q(per_box("soakd_slo_ttft_p99_seconds"), "{{node}} SLO"),
            ],
            "s",
            limit_series="SLO",
        ),
        12,
    )
    d.add(
        timeseries(
            "E2E P99 (5m, worst target) and SLO",
            [
                q(
                    f"max by ({BOX}) (target:soakd_request_duration_seconds:p99_5m{{{T}}})",
                    "{{node}} ({{site}})",
                ),
                q(per_box("soakd_slo_e2e_p99_seconds"), "{{node}} SLO"),
            ],
            "s",
            limit_series="SLO",
        ),
        12,
    )
    d.add(
        timeseries(
            "VRAM used (highest GPU) and limit",
            [
                q(
                    f"max by ({BOX}) (soakd_gpu_memory_used_bytes{{{F}}})",
                    "{{node}} ({{site}})",
                ),
                q(per_box("soakd_vram_limit_bytes"), "{{node}} limit"),
            ],
            "decbytes",
            limit_series="limit",
        ),
        12,
    )
    d.add(
        timeseries(
            "Requests per second",
            [q(f"sum by ({BOX}) (target:soakd_requests:rate1m{{{T}}})", "{{node}} ({{site}})")],
            "reqps",
        ),
        12,
    )
    return d
