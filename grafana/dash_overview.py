"""The Soak overview dashboard (soakd-overview): phase, load, errors, latency, alerts."""

from __future__ import annotations

from grafana.panels import (
    BOX,
    EXEMPLARS,
    Dashboard,
    F,
    T,
    boxes_seen,
    p99_with_exemplars,
    per_box,
    q,
    stat,
    state_timeline,
    table,
    timeseries,
)


def overview() -> Dashboard:
    d = Dashboard(
        "soakd-overview",
        "soakd / Soak overview",
        "Where the soak stands: phase, load, errors, latency, alerts.",
    )
    d.row("Run")
    d.add(
        stat(
            "Phase",
            [q(f"soakd_phase_active{{{F}}} == 1", "{{node}} {{phase}}")],
            text_mode="name",
            desc="The phase running now (soakd_phase_active).",
        ),
        4,
        4,
    )
    d.add(
        stat(
            "Phase index",
            [q(f"soakd_phase_index{{{F}}}", "{{node}}")],
            desc="-1 before the first phase, the number of phases after the last.",
        ),
        3,
        4,
    )
    d.add(
        stat("Elapsed", [q(f"soakd_run_elapsed_seconds{{{F}}}", "{{node}}")], "dtdurations"), 4, 4
    )
    d.add(
        stat("Remaining", [q(f"soakd_run_remaining_seconds{{{F}}}", "{{node}}")], "dtdurations"),
        4,
        4,
    )
    d.add(
        stat(
            "Alerts firing",
            [
                q(
                    f'count by ({BOX}) (ALERTS{{alertstate="firing", {F}}}) or {boxes_seen()}',
                    "{{node}}",
                )
            ],
            thresholds=[(None, "green"), (1, "red")],
            desc="Alerts firing now in this Prometheus (all of soakd's rules).",
        ),
        3,
        4,
    )
    d.add(
        table(
            "soakd",
            [q(f"soakd_build_info{{{F}}}", instant=True, fmt="table")],
            rename={"version": "version", "run_id": "run", "node": "node", "site": "site"},
        ),
        6,
        4,
    )
    d.row("Load and errors")
    d.add(
        timeseries(
            "Requests per second",
            [
                q(f"target:soakd_requests:rate1m{{{T}}}", "{{node}} {{target}} done"),
                q(f"soakd_offered_rate_rps{{{T}}}", "{{node}} {{target}} offered"),
            ],
            "reqps",
            desc="Finished requests (any outcome) per second over 1m; the offered "
            "open-loop rate for comparison (0 for a closed-loop target: see In flight).",
        ),
        8,
    )
    d.add(
        timeseries(
            "Error ratio",
            [
                q(
                    f"target:soakd_requests_errors:ratio_rate1m{{{T}}}",
                    "{{node}} {{target}} failed (1m)",
                ),
                q(f"soakd_run_error_ratio{{{T}}}", "{{node}} {{target}} failed (whole run)"),
                q(f"target:soakd_requests_5xx:ratio_rate5m{{{T}}}", "{{node}} {{target}} 5xx (5m)"),
                q(f"soakd_run_5xx_ratio{{{T}}}", "{{node}} {{target}} 5xx (whole run)"),
                q(per_box("soakd_error_ratio_limit"), "{{node}} error limit"),
                q(per_box("soakd_server_error_ratio_limit"), "{{node}} 5xx limit"),
            ],
            "percentunit",
            limit_series=["error limit", "5xx limit"],
            desc="Share of the judged requests (less the guard's sheds and the requests "
            "soakd cut at the stop) that failed, any cause, and that got a 5xx, as the "
            "report counts them (docs/slo.md). ErrorRatioHigh and ServerErrorRatioHigh "
            "compare 5m (100 requests or more), ErrorBudgetExceeded and "
            "ServerErrorBudgetExceeded the whole run, with slo.error_ratio and "
            "slo.server_error_ratio.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Outcomes per second",
            [
                q(
                    f"sum by ({BOX}, target, outcome) "
                    f"(rate(soakd_requests_total{{{T}}}[$__rate_interval]))",
                    "{{node}} {{target}} {{outcome}}",
                ),
            ],
            "reqps",
            stack=True,
        ),
        8,
    )
    d.add(
        timeseries(
            "In flight",
            [
                q(f"soakd_in_flight_requests{{{T}}}", "{{node}} {{target}} in flight"),
                q(f"soakd_offered_concurrency{{{T}}}", "{{node}} {{target}} offered concurrency"),
            ],
            desc="Requests sent and not yet finished; the closed-loop concurrency asked for "
            "(0 for an open-loop target).",
        ),
        8,
    )
    d.add(
        timeseries(
            "Output tokens per second",
            [
                q(f"target:soakd_output_tokens:rate1m{{{T}}}", "{{node}} {{target}}"),
            ],
            "short",
        ),
        8,
    )
    d.add(
        timeseries(
            "Dispatch lag P99",
            [
                q(f"target:soakd_dispatch_lag_seconds:p99_1m{{{T}}}", "{{node}} {{target}}"),
                q(per_box("soakd_dispatch_lag_limit_seconds"), "{{node}} limit"),
            ],
            "s",
            limit_series="limit",
            desc="How late soakd sends requests against its schedule; above the limit the "
            "numbers are suspect.",
        ),
        8,
    )
    d.add(
        timeseries(
            "Sender workers (run.workers > 1)",
            [
                q(
                    f"sum by ({BOX}, instance) (soakd_workers_up{{{F}}})",
                    "{{node}} {{instance}} up",
                ),
                q(
                    f"sum by ({BOX}, instance) (soakd_workers{{{F}}})",
                    "{{node}} {{instance}} configured",
                ),
                q(
                    f"sum by ({BOX}, instance) (increase(soakd_worker_restarts_total{{{F}}}[5m]))",
                    "{{node}} {{instance}} restarts (5m)",
                ),
            ],
            "short",
            desc="soakd's sender processes: up against configured, and restarts. A worker "
            "that dies loses what it held (outcome worker_lost) and is started again with "
            "back-off; SoakdWorkersDown fires after 1m down. Empty when soakd sends from "
            "its own process (run.workers: 1).",
        ),
        8,
    )
    d.row("Latency")
    d.add(
        timeseries(
            "Time to first token, P50 and P99 (5m)",
            [
                q(
                    f"target:soakd_time_to_first_token_seconds:p50_5m{{{T}}}",
                    "{{node}} {{target}} P50",
                ),
                p99_with_exemplars("soakd_time_to_first_token_seconds"),
                q(per_box("soakd_slo_ttft_p99_seconds"), "{{node}} P99 SLO"),
            ],
            "s",
            limit_series="P99 SLO",
            desc=EXEMPLARS,
        ),
        12,
    )
    d.add(
        timeseries(
            "End-to-end latency, P50 and P99 (5m)",
            [
                q(
                    f"target:soakd_request_duration_seconds:p50_5m{{{T}}}",
                    "{{node}} {{target}} P50",
                ),
                p99_with_exemplars("soakd_request_duration_seconds"),
                q(per_box("soakd_slo_e2e_p99_seconds"), "{{node}} P99 SLO"),
            ],
            "s",
            limit_series="P99 SLO",
            desc=EXEMPLARS,
        ),
        12,
    )
    d.row("Guard gateway (targets with gateway:, re-exported by soakd)")
    gw = "soakd runs a guard gateway in front of targets with a gateway: section and "
    gw += "re-exports its /metrics with the target's name (docs/gateway.md). "
    d.add(
        state_timeline(
            "Breaker state",
            [q(f"soakd_gateway_breaker_state{{{T}}}", "{{node}} {{target}} {{breaker}}")],
            desc=gw + "closed: requests pass; open: the gateway answers 429 (vram) or 503 "
            "(error_rate) itself; half-open: one probe request passes. GatewayBreakerOpen "
            "warns after 1m open.",
            mapping={
                "0": ("closed", "green"),
                "1": ("half-open", "orange"),
                "2": ("open", "red"),
            },
        ),
        12,
    )
    d.add(
        timeseries(
            "Gateway rejections by reason",
            [
                q(
                    f"sum by ({BOX}, target, reason) "
                    f"(rate(soakd_gateway_rejections_total{{{T}}}[$__rate_interval]))",
                    "{{node}} {{target}} {{reason}}",
                ),
            ],
            "reqps",
            stack=True,
            desc=gw + "Requests the gateway answered itself (not the server): open breakers, "
            "a full queue, a queue timeout, oversized requests.",
        ),
        12,
    )
    d.add(
        timeseries(
            "Gateway concurrency limit",
            [
                q(f"soakd_gateway_concurrency_limit{{{T}}}", "{{node}} {{target}} limit"),
                q(f"soakd_gateway_in_flight_requests{{{T}}}", "{{node}} {{target}} in flight"),
            ],
            desc=gw + "Requests allowed in flight to the server now (the adaptive limit "
            "steps down when the upstream's P95 time to first byte passes its target).",
        ),
        12,
    )
    d.add(
        timeseries(
            "Gateway queue",
            [
                q(f"soakd_gateway_queue_depth{{{T}}}", "{{node}} {{target}} waiting"),
                q(f"soakd_gateway_up{{{T}}}", "{{node}} {{target}} gateway read by soakd"),
            ],
            desc=gw + "Requests waiting for a concurrency slot; 'read by soakd' is 0 when "
            "soakd could not read the gateway's /metrics.",
        ),
        12,
    )
    d.row("Alerts")
    d.add(
        table(
            "Alerts firing",
            [q(f'ALERTS{{alertstate="firing", {F}}}', instant=True, fmt="table")],
            desc="From Prometheus' ALERTS series; Alertmanager decides who is told.",
        ),
        24,
        6,
    )
    return d
