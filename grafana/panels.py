"""The pieces every soakd dashboard is made of: queries, panels, the grid layout and the
template variables (grafana/build.py writes the dashboards; one module a dashboard,
grafana/dash_*.py).

Every selector keeps to the ``$site`` and ``$node`` variables and every aggregation keeps
node and site apart, so the same dashboards serve one edge box and a central Prometheus of
many (docs/alerting.md). Only the Python standard library is used.
"""

from __future__ import annotations

from typing import Any

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
