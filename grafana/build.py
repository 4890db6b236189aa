"""Build soakd's Grafana dashboards: ``python grafana/build.py`` writes grafana/dashboards/.

The JSON files are committed; ``python grafana/build.py --check`` fails when they differ
from what this file builds (tests/unit/test_observability_static.py runs it). Edit here,
not in the JSON.

Every query uses the metric names of docs/metrics.md (soakd_*), the recording rules of
prometheus/rules/soakd-recording.yml (target:*, gpu:*, instance:*), or the few target-side
vLLM names listed in prometheus/external-metrics.txt. Panels filter on the ``$site``,
``$node``, ``$target`` and ``$gpu`` template variables and keep node and site apart, so the
same dashboards serve one edge box and a central Prometheus of many (docs/alerting.md).
Only the Python standard library is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
# Every selector keeps to the boxes picked in the node and site variables, and every
# aggregation keeps them apart (`by (node, site, ...)`): with "All" centrally there is one
# line per box, never a quantile or a sum merged across sites. On an edge the series carry
# no node or site label (its Prometheus adds them only to what leaves the box), the lists
# are empty and "All" (.*) matches the box itself.
BOX = "node, site"
F = 'node=~"$node", site=~"$site"'
T = F + ', target=~"$target"'
G = F + ', gpu=~"$gpu"'

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


def per_box(metric: str) -> str:
    """A gauge each soakd exports once (a limit, an SLO): one line per selected box."""
    return f"max by ({BOX}) ({metric}{{{F}}})"


def boxes_seen() -> str:
    """0 for every box whose soakd Prometheus scraped (or tried to) in the dashboard's range:
    the fallback that gives a box with nothing to count a 0 instead of no row."""
    return f'max by ({BOX}) (0 * max_over_time(up{{job="soakd", {F}}}[$__range]))'


def p99_with_exemplars(histogram: str) -> Json:
    """The 5m P99 of a soakd latency histogram, read from its buckets (not the recording
    rule, which keeps no exemplars), with the buckets' exemplars: the trace ids."""
    return q(
        "histogram_quantile(0.99, "
        f"sum by ({BOX}, target, le) (rate({histogram}_bucket{{{T}}}[5m])))",
        "{{node}} {{target}} P99",
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
    """A time series panel; ``limit_series``: the legends ending in it (one per box) are
    drawn as red dashed lines."""
    limits = [limit_series] if isinstance(limit_series, str) else limit_series or []
    overrides = [
        {
            "matcher": {"id": "byRegexp", "options": f".*{limit}"},
            "properties": [
                {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "custom.fillOpacity", "value": 0},
            ],
        }
        for limit in limits
    ]
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
    """Heatmap of a soakd histogram: requests per bucket per interval, for $target; one
    panel per box (repeated over $node), since one heatmap holds one distribution."""
    expr = f"sum by ({BOX}, le) (increase({metric}_bucket{{{T}}}[$__rate_interval]))"
    return {
        "type": "heatmap",
        "title": f"{title} $node",
        "repeat": "node",
        "repeatDirection": "h",
        "maxPerRow": 3,
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


def fleet_table(
    title: str,
    columns: list[tuple[str, str, str, list[tuple[float | None, str]]]],
    *,
    sort_by: str,
    desc: str = "",
) -> Json:
    """One row per box: each (column, expression, unit, thresholds) an instant query
    aggregated ``by (node, site)``, merged on those two labels, sorted worst first."""
    targets = [q(expr, instant=True, fmt="table") for _, expr, _, _ in columns]
    rename = {f"Value #{chr(ord('A') + i)}": name for i, (name, *_) in enumerate(columns)}
    overrides = [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [
                {"id": "unit", "value": unit},
                {
                    "id": "thresholds",
                    "value": {
                        "mode": "absolute",
                        "steps": [{"value": v, "color": c} for v, c in steps],
                    },
                },
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ],
        }
        for name, _, unit, steps in columns
    ]
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {}, "overrides": overrides},
        "options": {"showHeader": True, "sortBy": [{"displayName": sort_by, "desc": True}]},
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {"node": 0, "site": 1},
                    "renameByName": rename,
                },
            },
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
    # site, then the nodes of the sites picked; empty on an edge (see F above)
    _query_var("site", "Site", "label_values(soakd_phase_index, site)"),
    _query_var("node", "Node", 'label_values(soakd_phase_index{site=~"$site"}, node)'),
    _query_var("target", "Target", f"label_values(soakd_requests_total{{{F}}}, target)"),
    _query_var("gpu", "GPU", f"label_values(soakd_gpu_memory_used_bytes{{{F}}}, gpu)"),
]


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
                q(f"soakd_gpu_memory_used_bytes{{{G}}}", "{{node}} GPU {{gpu}} used"),
                q(f"soakd_gpu_memory_total_bytes{{{G}}}", "{{node}} GPU {{gpu}} total"),
                q(per_box("soakd_vram_limit_bytes"), "{{node}} limit"),
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
                q(f"soakd_gpu_process_memory_bytes{{{G}}}", "{{node}} GPU {{gpu}} {{target}}"),
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
                    f"soakd_vram_limit_bytes{{{F}}} - on ({BOX}, job, instance) group_right "
                    f"soakd_gpu_memory_used_bytes{{{G}}}",
                    "{{node}} GPU {{gpu}}",
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
                q(f"soakd_gpu_memory_used_peak_bytes{{{G}}}", "{{node}} GPU {{gpu}}"),
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
                q(f"soakd_gpu_memory_reserved_bytes{{{G}}}", "{{node}} GPU {{gpu}}"),
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
            [q(f"soakd_gpu_probe_up{{{F}}}", "{{node}} {{source}}")],
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
                q(f"soakd_gpu_memory_leak_slope_bytes_per_hour{{{G}}}", "{{node}} GPU {{gpu}}"),
                q(per_box("soakd_vram_leak_limit_bytes_per_hour"), "{{node}} limit"),
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
                    "{{node}} GPU {{gpu}} {{target}}",
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
                q(f"soakd_gpu_temperature_celsius{{{G}}}", "{{node}} GPU {{gpu}}"),
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
                q(f"soakd_gpu_power_watts{{{G}}}", "{{node}} GPU {{gpu}} draw"),
                q(
                    f"rate(soakd_gpu_energy_joules_total{{{G}}}[$__rate_interval])",
                    "{{node}} GPU {{gpu}} from energy",
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
                q(f"soakd_gpu_utilization_ratio{{{G}}}", "{{node}} GPU {{gpu}}"),
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
                q(f"soakd_gpu_sm_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}} SM"),
                q(f"soakd_gpu_memory_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}} memory"),
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
                    f"max by ({BOX}, gpu, reason) (soakd_gpu_throttle_active{{{G}}})",
                    "{{node}} GPU {{gpu}} {{reason}}",
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
                q(
                    f"sum by ({BOX}) (increase(soakd_gpu_xid_errors_total{{{G}}}[$__range]))"
                    f" or {boxes_seen()}",
                    "{{node}}",
                ),
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
                    f"sum by ({BOX}, gpu, xid) (soakd_gpu_xid_errors_total{{{G}}})",
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
    return d


DASHBOARDS = (fleet, overview, latency, gpu, server, targets)


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
