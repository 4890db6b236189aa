"""Build soakd's Grafana dashboards: ``python grafana/build.py`` writes grafana/dashboards/.

The JSON files are committed; ``python grafana/build.py --check`` fails when they differ
from what this file builds (tests/unit/test_observability_static.py runs it). Edit here,
not in the JSON.

Every query uses the metric names of docs/metrics.md (soakd_*), the recording rules of
prometheus/rules/soakd-recording.yml (target:*, gpu:*, instance:*), or the few target-side
vLLM names listed in prometheus/external-metrics.txt. Panels filter on the ``$target`` and
``$gpu`` template variables. Only the Python standard library is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
T = 'target=~"$target"'
G = 'gpu=~"$gpu"'

Json = dict[str, Any]

# Panels whose series only the NVML source produces say so first in their description
# (docs/metrics.md marks the same series "NVML only").
NVML = "NVML only (gpu.source: nvml): a dcgm-exporter, and the simulator, do not report this. "


# --- queries and panels -------------------------------------------------------------------


def q(
    expr: str,
    legend: str = "",
    *,
    instant: bool = False,
    fmt: str = "time_series",
    exemplar: bool = False,
) -> Json:
    """One Prometheus query of a panel; ``exemplar``: Grafana also draws the exemplars of
    the series it reads (Prometheus with --enable-feature=exemplar-storage)."""
    query = {
        "expr": expr,
        "legendFormat": legend,
        "instant": instant,
        "range": not instant,
        "format": fmt,
        "datasource": DS,
    }
    if exemplar:
        query["exemplar"] = True
    return query


def p99_with_exemplars(histogram: str) -> Json:
    """The 5m P99 of a soakd latency histogram, read from its buckets (not the recording
    rule, which keeps no exemplars), with the buckets' exemplars: the trace ids."""
    return q(
        f"histogram_quantile(0.99, sum by (target, le) (rate({histogram}_bucket{{{T}}}[5m])))",
        "{{target}} P99",
        exemplar=True,
    )


EXEMPLARS = (
    "The dots are exemplars: one recent request of each latency bucket, with the trace id "
    "its traceparent carried (trace_id); look it up in the server's traces, or in soakd "
    "report's slowest requests (docs/tracing.md)."
)


def _defaults(
    unit: str,
    *,
    min_: float | None = None,
    max_: float | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
) -> Json:
    steps = [{"value": v, "color": c} for v, c in (thresholds or [(None, "green")])]
    defaults: Json = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return defaults


def timeseries(
    title: str,
    targets: list[Json],
    unit: str = "short",
    *,
    desc: str = "",
    min_: float | None = 0,
    max_: float | None = None,
    stack: bool = False,
    limit_series: str | list[str] | None = None,
) -> Json:
    """A time series panel; ``limit_series`` names the legends drawn as red dashed lines."""
    overrides = []
    for limit in [limit_series] if isinstance(limit_series, str) else limit_series or []:
        overrides.append(
            {
                "matcher": {"id": "byName", "options": limit},
                "properties": [
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "custom.fillOpacity", "value": 0},
                ],
            }
        )
    defaults = _defaults(unit, min_=min_, max_=max_)
    defaults["custom"] = {
        "fillOpacity": 10,
        "showPoints": "never",
        "lineWidth": 1,
        "stacking": {"mode": "normal" if stack else "none"},
    }
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    targets: list[Json],
    unit: str = "short",
    *,
    desc: str = "",
    text_mode: str = "auto",
    thresholds: list[tuple[float | None, str]] | None = None,
) -> Json:
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": _defaults(unit, thresholds=thresholds), "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": text_mode,
            "colorMode": "value",
            "graphMode": "none",
        },
    }


def state_timeline(
    title: str, targets: list[Json], *, desc: str = "", mapping: dict[str, tuple[str, str]]
) -> Json:
    """Discrete states over time; ``mapping`` is value -> (text, color)."""
    options = {v: {"text": text, "color": color} for v, (text, color) in mapping.items()}
    defaults = _defaults("short")
    defaults["mappings"] = [{"type": "value", "options": options}]
    defaults["color"] = {"mode": "thresholds"}
    return {
        "type": "state-timeline",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "showValue": "never",
            "mergeValues": True,
            "legend": {"displayMode": "list", "placement": "bottom"},
        },
    }


def heatmap(title: str, metric: str, unit: str = "s", *, desc: str = "") -> Json:
    """Heatmap of a soakd histogram: requests per bucket per interval, for $target."""
    expr = f"sum by (le) (increase({metric}_bucket{{{T}}}[$__rate_interval]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [q(expr, "{{le}}", fmt="heatmap")],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Spectral", "steps": 64},
            "yAxis": {"unit": unit},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"show": True, "yHistogram": True},
            "legend": {"show": True},
        },
    }


def table(
    title: str,
    targets: list[Json],
    *,
    desc: str = "",
    rename: dict[str, str] | None = None,
    units: dict[str, str] | None = None,
) -> Json:
    """A table of instant queries merged on their labels; ``rename`` maps column names."""
    hide = {"Time": True, "__name__": True, "job": True, "instance": True, "alertstate": True}
    overrides = [
        {"matcher": {"id": "byName", "options": col}, "properties": [{"id": "unit", "value": unit}]}
        for col, unit in (units or {}).items()
    ]
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {}, "overrides": overrides},
        "options": {"showHeader": True},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": hide, "renameByName": rename or {}}},
        ],
    }


# --- dashboards -----------------------------------------------------------------------


class Dashboard:
    """Lays panels out left to right on Grafana's 24-column grid, rows top to bottom."""

    def __init__(self, uid: str, title: str, description: str) -> None:
        self.uid, self.title, self.description = uid, title, description
        self.panels: list[Json] = []
        self._x = self._y = self._row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": self._y, "w": 24, "h": 1},
            }
        )
        self._y += 1

    def add(self, panel: Json, w: int = 12, h: int = 8) -> None:
        if self._x + w > 24:
            self._newline()
        panel["gridPos"] = {"x": self._x, "y": self._y, "w": w, "h": h}
        self.panels.append(panel)
        self._x += w
        self._row_h = max(self._row_h, h)

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
        self._x = self._row_h = 0

    def to_json(self) -> Json:
        for i, panel in enumerate(self.panels, start=1):
            panel["id"] = i
            for j, target in enumerate(panel.get("targets", [])):
                target["refId"] = chr(ord("A") + j)
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["soakd"],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "refresh": "10s",
            "schemaVersion": 39,
            "time": {"from": "now-1h", "to": "now"},
            "annotations": {"list": []},
            "links": [
                {
                    "type": "dashboards",
                    "tags": ["soakd"],
                    "title": "soakd",
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                }
            ],
            "templating": {"list": TEMPLATING},
            "panels": self.panels,
        }


def _query_var(name: str, label: str, query: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


TEMPLATING: list[Json] = [
    {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {"text": "Prometheus", "value": "prometheus"},
    },
    _query_var("target", "Target", "label_values(soakd_requests_total, target)"),
    _query_var("gpu", "GPU", "label_values(soakd_gpu_memory_used_bytes, gpu)"),
]


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
            [q("soakd_phase_active == 1", "{{phase}}")],
            text_mode="name",
            desc="The phase running now (soakd_phase_active).",
        ),
        4,
        4,
    )
    d.add(
        stat(
            "Phase index",
            [q("soakd_phase_index")],
            desc="-1 before the first phase, the number of phases after the last.",
        ),
        3,
        4,
    )
    d.add(stat("Elapsed", [q("soakd_run_elapsed_seconds")], "dtdurations"), 4, 4)
    d.add(stat("Remaining", [q("soakd_run_remaining_seconds")], "dtdurations"), 4, 4)
    d.add(
        stat(
            "Alerts firing",
            [q('count(ALERTS{alertstate="firing"}) or vector(0)')],
            thresholds=[(None, "green"), (1, "red")],
            desc="Alerts firing now in this Prometheus (all of soakd's rules).",
        ),
        3,
        4,
    )
    d.add(
        table(
            "soakd",
            [q("soakd_build_info", instant=True, fmt="table")],
            rename={"version": "version", "run_id": "run", "node": "node"},
        ),
        6,
        4,
    )
    d.row("Load and errors")
    d.add(
        timeseries(
            "Requests per second",
            [
                q(f"target:soakd_requests:rate1m{{{T}}}", "{{target}} done"),
                q(f"soakd_offered_rate_rps{{{T}}}", "{{target}} offered"),
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
                q(f"target:soakd_requests_errors:ratio_rate1m{{{T}}}", "{{target}} failed (1m)"),
                q(f"soakd_run_error_ratio{{{T}}}", "{{target}} failed (whole run)"),
                q(f"target:soakd_requests_5xx:ratio_rate5m{{{T}}}", "{{target}} 5xx (5m)"),
                q(f"soakd_run_5xx_ratio{{{T}}}", "{{target}} 5xx (whole run)"),
                q("max(soakd_error_ratio_limit)", "error limit"),
                q("max(soakd_server_error_ratio_limit)", "5xx limit"),
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
                    "sum by (target, outcome) "
                    f"(rate(soakd_requests_total{{{T}}}[$__rate_interval]))",
                    "{{target}} {{outcome}}",
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
                q(f"soakd_in_flight_requests{{{T}}}", "{{target}} in flight"),
                q(f"soakd_offered_concurrency{{{T}}}", "{{target}} offered concurrency"),
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
                q(f"target:soakd_output_tokens:rate1m{{{T}}}", "{{target}}"),
            ],
            "short",
        ),
        8,
    )
    d.add(
        timeseries(
            "Dispatch lag P99",
            [
                q(f"target:soakd_dispatch_lag_seconds:p99_1m{{{T}}}", "{{target}}"),
                q("max(soakd_dispatch_lag_limit_seconds)", "limit"),
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
                q("sum by (instance) (soakd_workers_up)", "{{instance}} up"),
                q("sum by (instance) (soakd_workers)", "{{instance}} configured"),
                q(
                    "sum by (instance) (increase(soakd_worker_restarts_total[5m]))",
                    "{{instance}} restarts (5m)",
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
                q(f"target:soakd_time_to_first_token_seconds:p50_5m{{{T}}}", "{{target}} P50"),
                p99_with_exemplars("soakd_time_to_first_token_seconds"),
                q("max(soakd_slo_ttft_p99_seconds)", "P99 SLO"),
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
                q(f"target:soakd_request_duration_seconds:p50_5m{{{T}}}", "{{target}} P50"),
                p99_with_exemplars("soakd_request_duration_seconds"),
                q("max(soakd_slo_e2e_p99_seconds)", "P99 SLO"),
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
            [q(f"soakd_gateway_breaker_state{{{T}}}", "{{target}} {{breaker}}")],
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
                    "sum by (target, reason) "
                    f"(rate(soakd_gateway_rejections_total{{{T}}}[$__rate_interval]))",
                    "{{target}} {{reason}}",
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
                q(f"soakd_gateway_concurrency_limit{{{T}}}", "{{target}} limit"),
                q(f"soakd_gateway_in_flight_requests{{{T}}}", "{{target}} in flight"),
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
                q(f"soakd_gateway_queue_depth{{{T}}}", "{{target}} waiting"),
                q(f"soakd_gateway_up{{{T}}}", "{{target}} gateway read by soakd"),
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
            [q('ALERTS{alertstate="firing"}', instant=True, fmt="table")],
            desc="From Prometheus' ALERTS series; Alertmanager decides who is told.",
        ),
        24,
        6,
    )
    return d


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
                q(f"target:soakd_inter_token_latency_seconds:p50_5m{{{T}}}", "{{target}} P50"),
                q(f"target:soakd_inter_token_latency_seconds:p99_5m{{{T}}}", "{{target}} P99"),
            ],
            "s",
        ),
        8,
    )
    d.add(
        timeseries(
            "Time per output token, P50 and P99 (5m)",
            [
                q(f"target:soakd_time_per_output_token_seconds:p50_5m{{{T}}}", "{{target}} P50"),
                q(f"target:soakd_time_per_output_token_seconds:p99_5m{{{T}}}", "{{target}} P99"),
            ],
            "s",
        ),
        8,
    )
    d.add(
        timeseries(
            "Dispatch lag P99 (1m)",
            [
                q(f"target:soakd_dispatch_lag_seconds:p99_1m{{{T}}}", "{{target}}"),
                q("max(soakd_dispatch_lag_limit_seconds)", "limit"),
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
                    "{{target}} E2E",
                ),
                q(
                    f"target:soakd_time_to_first_token_seconds:p99_5m_jitter1h{{{T}}}",
                    "{{target}} TTFT",
                ),
                q("max(soakd_jitter_ratio_limit)", "limit"),
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
    d.row("soakd (client) next to the server (vLLM /metrics)")
    d.add(
        timeseries(
            "P99 time to first token: client vs server (5m)",
            [
                q(f"target:soakd_time_to_first_token_seconds:p99_5m{{{T}}}", "{{target}} soakd"),
                q(
                    "histogram_quantile(0.99, sum by (target, le) (rate("
                    f"vllm:time_to_first_token_seconds_bucket{{{T}}}[5m])))",
                    "{{target}} server",
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
                q(f"target:soakd_request_duration_seconds:p99_5m{{{T}}}", "{{target}} soakd"),
                q(
                    "histogram_quantile(0.99, sum by (target, le) (rate("
                    f"vllm:e2e_request_latency_seconds_bucket{{{T}}}[5m])))",
                    "{{target}} server",
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
                    "histogram_quantile(0.99, sum by (target, le) (rate("
                    f"vllm:request_queue_time_seconds_bucket{{{T}}}[5m])))",
                    "{{target}}",
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
                q(f"target:soakd_output_tokens:rate1m{{{T}}}", "{{target}} soakd"),
                q(
                    "sum by (target) (rate("
                    f"vllm:generation_tokens_total{{{T}}}[$__rate_interval]))",
                    "{{target}} server",
                ),
            ],
            "short",
        ),
        24,
    )
    return d


def gpu() -> Dashboard:
    d = Dashboard(
        "soakd-gpu",
        "soakd / GPU",
        "VRAM against the limit, per process, leak slope, and the card's health.",
    )
    d.row("Memory")
    d.add(
        timeseries(
            "VRAM used vs limit",
            [
                q(f"soakd_gpu_memory_used_bytes{{{G}}}", "GPU {{gpu}} used"),
                q(f"soakd_gpu_memory_total_bytes{{{G}}}", "GPU {{gpu}} total"),
                q("max(soakd_vram_limit_bytes)", "limit"),
            ],
            "decbytes",
            limit_series="limit",
            desc="VramAboveLimit fires when the median of 10s stays above the limit for 5s, "
            "and stays until it has been below for a minute (docs/alerting.md: what the "
            "line means under vLLM's reservation).",
        ),
        12,
    )
    d.add(
        timeseries(
            "VRAM per process",
            [
                q(f"soakd_gpu_process_memory_bytes{{{G}}}", "GPU {{gpu}} {{target}}"),
            ],
            "decbytes",
            stack=True,
            desc=NVML + "Per process, named by the soakd target it belongs to ('other' for "
            "the rest).",
        ),
        12,
    )
    d.add(
        stat(
            "Headroom to the limit",
            [
                q(
                    f"soakd_vram_limit_bytes - on (job, instance) group_right "
                    f"soakd_gpu_memory_used_bytes{{{G}}}",
                    "GPU {{gpu}}",
                ),
            ],
            "decbytes",
            thresholds=[(None, "red"), (0, "orange"), (200e6, "green")],
        ),
        6,
        5,
    )
    d.add(
        stat(
            "Peak VRAM this run",
            [
                q(f"soakd_gpu_memory_used_peak_bytes{{{G}}}", "GPU {{gpu}}"),
            ],
            "decbytes",
        ),
        6,
        5,
    )
    d.add(
        stat(
            "Reserved by the driver",
            [
                q(f"soakd_gpu_memory_reserved_bytes{{{G}}}", "GPU {{gpu}}"),
            ],
            "decbytes",
            desc=NVML + "Memory the driver keeps for itself (NVML's memory info v2).",
        ),
        6,
        5,
    )
    d.add(
        stat(
            "GPU source up",
            [q("soakd_gpu_probe_up", "{{source}}")],
            thresholds=[(None, "red"), (1, "green")],
            desc="0: soakd reads no GPU (no driver, or the DCGM source fails).",
        ),
        6,
        5,
    )
    d.add(
        timeseries(
            "VRAM leak slope (bytes per hour)",
            [
                q(f"soakd_gpu_memory_leak_slope_bytes_per_hour{{{G}}}", "GPU {{gpu}}"),
                q("max(soakd_vram_leak_limit_bytes_per_hour)", "limit"),
            ],
            "decbytes",
            min_=None,
            limit_series="limit",
            desc="Robust slope of VRAM used per GPU over soakd's leak window; VramLeak "
            "compares it with the limit once the window is 80 % full.",
        ),
        12,
    )
    d.add(
        timeseries(
            "VRAM leak slope per process (bytes per hour)",
            [
                q(
                    f"soakd_gpu_process_memory_leak_slope_bytes_per_hour{{{G}}}",
                    "GPU {{gpu}} {{target}}",
                ),
            ],
            "decbytes",
            min_=None,
            desc=NVML + "The same slope for each target's GPU processes.",
        ),
        12,
    )
    d.row("Health")
    d.add(
        timeseries(
            "Temperature",
            [
                q(f"soakd_gpu_temperature_celsius{{{G}}}", "GPU {{gpu}}"),
            ],
            "celsius",
            min_=None,
        ),
        8,
    )
    d.add(
        timeseries(
            "Power",
            [
                q(f"soakd_gpu_power_watts{{{G}}}", "GPU {{gpu}} draw"),
                q(
                    f"rate(soakd_gpu_energy_joules_total{{{G}}}[$__rate_interval])",
                    "GPU {{gpu}} from energy",
                ),
            ],
            "watt",
        ),
        8,
    )
    d.add(
        timeseries(
            "Utilization",
            [
                q(f"soakd_gpu_utilization_ratio{{{G}}}", "GPU {{gpu}}"),
            ],
            "percentunit",
            max_=1,
        ),
        8,
    )
    d.add(
        timeseries(
            "Clocks",
            [
                q(f"soakd_gpu_sm_clock_hertz{{{G}}}", "GPU {{gpu}} SM"),
                q(f"soakd_gpu_memory_clock_hertz{{{G}}}", "GPU {{gpu}} memory"),
            ],
            "hertz",
        ),
        8,
    )
    d.add(
        state_timeline(
            "Throttle reasons",
            [
                q(
                    f"max by (gpu, reason) (soakd_gpu_throttle_active{{{G}}})",
                    "GPU {{gpu}} {{reason}}",
                ),
            ],
            desc=NVML + "Why the clocks are held back; GpuThrottling warns on the thermal "
            "and hardware reasons.",
            mapping={"0": ("no", "green"), "1": ("active", "orange")},
        ),
        16,
    )
    d.add(
        stat(
            "XID errors in range",
            [
                q(f"sum(increase(soakd_gpu_xid_errors_total{{{G}}}[$__range])) or vector(0)"),
            ],
            thresholds=[(None, "green"), (1, "red")],
        ),
        6,
        4,
    )
    d.add(
        table(
            "XID errors by code (this run)",
            [
                q(
                    f"sum by (gpu, xid) (soakd_gpu_xid_errors_total{{{G}}})",
                    instant=True,
                    fmt="table",
                ),
            ],
            rename={"Value": "errors"},
        ),
        6,
        4,
    )
    d.add(
        table(
            "GPUs",
            [q(f"soakd_gpu_info{{{G}}}", instant=True, fmt="table")],
            rename={"Value": "present"},
        ),
        12,
        4,
    )
    return d


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
                q(f"soakd_server_requests_running{{{T}}}", "{{target}} running"),
                q(f"soakd_server_requests_waiting{{{T}}}", "{{target}} waiting"),
                q(f"soakd_in_flight_requests{{{T}}}", "{{target}} in flight (soakd)"),
            ],
            desc="Waiting > 0 means the server queues: TTFT grows with it.",
        ),
        12,
    )
    d.add(
        timeseries(
            "KV cache usage",
            [
                q(f"soakd_server_kv_cache_usage_ratio{{{T}}}", "{{target}}"),
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
                q(f"rate(soakd_server_preemptions_total{{{T}}}[$__rate_interval])", "{{target}}"),
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
                q(f"soakd_server_resident_memory_bytes{{{T}}}", "{{target}}"),
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
                    "{{target}}",
                ),
            ],
            "bytes",
            min_=None,
            desc="Robust slope of the RSS over soakd's leak window: a host-memory leak.",
        ),
        8,
    )
    d.row("Health")
    d.add(
        state_timeline(
            "Target up",
            [q(f"soakd_target_up{{{T}}}", "{{target}}")],
            mapping={"0": ("down", "red"), "1": ("up", "green")},
        ),
        12,
    )
    d.add(
        timeseries(
            "Server uptime",
            [
                q(f"time() - soakd_server_start_time_seconds{{{T}}}", "{{target}}"),
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
                q(f"sum by (target) (soakd_target_restarts_total{{{T}}})", "{{target}}"),
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
                q(f"max by (target) (soakd_target_oom_events_total{{{T}}})", "{{target}}"),
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
                    f"sum by (target, source) (soakd_target_oom_events_total{{{T}}})",
                    "{{target}} {{source}}",
                ),
                q(f"soakd_oom_errors_total{{{T}}}", "{{target}} error bodies"),
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
                q(f"rate(soakd_target_scrape_errors_total{{{T}}}[$__rate_interval])", "{{target}}"),
            ],
            "short",
        ),
        24,
        6,
    )
    return d


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
        d.add(timeseries(title, [q(f"{metric}{{{T}}}", "{{target}}")], unit), 12)
    return d


DASHBOARDS = (overview, latency, gpu, server, targets)


def build() -> dict[str, str]:
    """File name -> JSON text, for every dashboard."""
    out = {}
    for make in DASHBOARDS:
        dash = make().to_json()
        out[f"{dash['uid']}.json"] = json.dumps(dash, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed JSON differs from this build"
    )
    args = parser.parse_args(argv)
    built = build()
    if args.check:
        stale = sorted(
            name
            for name, text in built.items()
            if not (OUT / name).is_file() or (OUT / name).read_text() != text
        )
        extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in built)
        for name in stale:
            print(
                f"grafana/dashboards/{name} is stale: run python grafana/build.py", file=sys.stderr
            )
        for name in extra:
            print(f"grafana/dashboards/{name} is not built by grafana/build.py", file=sys.stderr)
        return 1 if stale or extra else 0
    OUT.mkdir(exist_ok=True)
    for name, text in built.items():
        (OUT / name).write_text(text)
        print(f"wrote grafana/dashboards/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
