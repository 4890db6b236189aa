"""The observability bundle, checked without running it or any tool: every alert has
unit tests, the dashboards are what grafana/build.py builds (that every metric name they
read exists: tests/unit/test_metric_names.py). promtool and amtool on the shipped files:
tests/tools/test_observability_tools.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    from tests import observability as obs
except ModuleNotFoundError:  # tests/unit is not a package: pytest put only it on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import observability as obs

SEVERITIES = {"page", "warn"}


def test_alertmanager_inhibition_and_grouping() -> None:
    """Grouped per alert, box and target; a TargetDown silences its own target's symptoms
    on its own box only. The fleet's file routes exactly as the edge's."""
    cfg = obs.load_yaml(obs.AM_CONFIG)
    central = obs.load_yaml(obs.CENTRAL_AM_CONFIG)
    assert cfg["route"] == central["route"]
    assert cfg["inhibit_rules"] == central["inhibit_rules"]
    assert [r["name"] for r in cfg["receivers"]] == [r["name"] for r in central["receivers"]]
    assert cfg["route"]["group_by"] == ["alertname", "node", "site", "target"]
    (rule,) = cfg["inhibit_rules"]
    assert rule["source_matchers"] == ['alertname="TargetDown"']
    assert rule["equal"] == ["node", "target"]
    inhibited = re.fullmatch(r'alertname=~"(.*)"', rule["target_matchers"][0])
    assert inhibited
    names = set(inhibited.group(1).split("|"))
    alerts = {r["alert"]: r for r in obs.alert_rules()}
    assert names <= set(alerts), names - set(alerts)
    assert {"P99E2EAboveSLO", "P99TTFTAboveSLO", "ErrorRatioHigh"} <= names
    for name in names:  # every inhibited alert carries the target label to match on
        assert "target" in alerts[name]["annotations"]["summary"], name


def test_every_summary_names_node_site_and_target() -> None:
    """A page says which box, where, and which server: the edge's alerts from its
    external labels, the central's from the series' own labels."""
    targeted = set()
    for path in obs.RULE_TESTS:
        for case in obs.load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                if any("target" in a["exp_labels"] for a in check.get("exp_alerts") or []):
                    targeted.add(check["alertname"])
    for alert in obs.alert_rules():
        summary = alert["annotations"]["summary"]
        for label in ("node", "site"):
            assert f"$externalLabels.{label} }}" in summary, alert["alert"]
        if alert["alert"] in targeted:
            assert "$labels.target }}" in summary, alert["alert"]
    for group in obs.load_yaml(obs.CENTRAL_DIR / "rules" / "central.yml")["groups"]:
        for rule in group["rules"]:
            summary = rule["annotations"]["summary"]
            assert "$labels.node }}" in summary, rule["alert"]
            assert "$labels.site }}" in summary, rule["alert"]


# --- rules ---------------------------------------------------------------------------------


def test_every_alert_has_severity_annotations_and_tests() -> None:
    alerts = obs.alert_rules()
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names)), "duplicate alert names"
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in obs.RULE_TESTS:
        for case in obs.load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    docs = (obs.ROOT / "docs" / "alerting.md").read_text()
    for alert in alerts:
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert {"summary", "description", "runbook"} <= set(alert["annotations"]), name
        assert name in fired, f"{name}: no promtool test where it fires"
        assert name in quiet, f"{name}: no promtool test where it stays quiet"
        assert f"### {name}" in docs, f"{name} is not documented in docs/alerting.md"


def test_the_issue_alert_list_is_covered() -> None:
    names = {a["alert"] for a in obs.alert_rules()}
    assert {
        "VramAboveLimit",
        "VramLeak",
        "TargetOOM",
        "TargetDown",
        "TargetRestarted",
        "ErrorRatioHigh",
        "Http429Storm",
        "P99E2EAboveSLO",
        "P99TTFTAboveSLO",
        "P99E2EJitterHigh",
        "P99TTFTJitterHigh",
        "GpuTemperatureHigh",
        "GpuThrottling",
        "SoakdDown",
        "SoakdStalled",
        "DispatchLagHigh",
    } <= names


def test_vram_alert_reads_a_10s_median_against_the_exported_limit() -> None:
    (vram,) = [a for a in obs.alert_rules() if a["alert"] == "VramAboveLimit"]
    assert "quantile_over_time(0.5, soakd_gpu_memory_used_bytes[10s])" in vram["expr"]
    assert vram["keep_firing_for"] == "1m"  # no flapping through dips (Prometheus >= 2.42)
    assert vram["labels"]["severity"] == "page"
    assert obs.metric_names(vram["expr"]) == {
        "soakd_gpu_memory_used_bytes",
        "soakd_vram_limit_bytes",
    }
    cfg = obs.load_yaml(obs.PROM_CONFIG)["global"]
    # a 10 s median needs ten readings and evaluations inside it
    assert cfg["scrape_interval"] == cfg["evaluation_interval"] == "1s"


def test_recording_rule_names_are_unique_and_used() -> None:
    recorded = [r["record"] for r in obs.recording_rules()]
    assert len(recorded) == len(set(recorded))
    used = set()
    for rule in obs.alert_rules() + obs.recording_rules():
        used |= obs.metric_names(rule["expr"])
    for query in obs.dashboard_queries():
        used |= obs.metric_names(query.expr)
    assert set(recorded) <= used, f"recorded but never read: {set(recorded) - used}"


# --- every metric name exists -----------------------------------------------------------------


def test_metric_name_lexer() -> None:
    expr = (
        'sum by (job, target) (rate(a_total{x="y:z"}[5m] offset 1m)) '
        '> on (job) group_left b_limit and c:rec:ratio{t=~"$target"} unless vector(0) '
        ">= bool 1e9 or histogram_quantile(0.99, vllm:x_bucket)"
    )
    assert obs.metric_names(expr) == {"a_total", "b_limit", "c:rec:ratio", "vllm:x_bucket"}


# test_every_metric_name_exists: tests/unit/test_metric_names.py (with the probes' and the
# report's names, and vLLM's reference capture)


# --- dashboards ------------------------------------------------------------------------------


def test_committed_dashboards_equal_the_generator_output() -> None:
    built = obs.grafana_builder().build()
    on_disk = {p.name: p.read_text() for p in obs.DASHBOARD_DIR.glob("*.json")}
    assert set(built) == set(on_disk), "run python grafana/build.py"
    for name, text in built.items():
        assert on_disk[name] == text, f"{name} is stale: run python grafana/build.py"


def test_dashboards_have_the_required_content() -> None:
    import json

    dashboards = {p.stem: json.loads(p.read_text()) for p in obs.DASHBOARD_DIR.glob("*.json")}
    assert set(dashboards) == {
        "soakd-fleet",
        "soakd-overview",
        "soakd-latency",
        "soakd-gpu",
        "soakd-server",
        "soakd-targets",
    }
    for uid, dash in dashboards.items():
        assert dash["uid"] == uid
        variables = {v["name"] for v in dash["templating"]["list"]}
        assert {"datasource", "site", "node", "target", "gpu"} <= variables, uid
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), uid
        for panel in dash["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (uid, panel["title"])
    exprs = {q.dashboard: [] for q in obs.dashboard_queries()}
    for q in obs.dashboard_queries():
        exprs[q.dashboard].append(q.expr)
    joined = {k: "\n".join(v) for k, v in exprs.items()}
    assert "ALERTS" in joined["soakd-overview"]
    assert "soakd_phase_active" in joined["soakd-overview"]
    assert "soakd_vram_limit_bytes" in joined["soakd-gpu"]
    assert "soakd_gpu_xid_errors_total" in joined["soakd-gpu"]
    assert "soakd_server_kv_cache_usage_ratio" in joined["soakd-server"]
    heatmaps = [
        p
        for p in json.loads((obs.DASHBOARD_DIR / "soakd-latency.json").read_text())["panels"]
        if p["type"] == "heatmap"
    ]
    assert len(heatmaps) == 5
    for panel in heatmaps:  # one distribution per box
        assert panel["repeat"] == "node"
    fleet = json.loads((obs.DASHBOARD_DIR / "soakd-fleet.json").read_text())
    (table,) = [p for p in fleet["panels"] if p["type"] == "table"]
    columns = list(table["transformations"][1]["options"]["renameByName"].values())
    assert columns == [
        "soakd up",
        "pages firing",
        "goodput (worst target, 1m)",
        "TTFT P99 / SLO",
        "E2E P99 / SLO",
        "VRAM peak / limit",
        "OOM events (run)",
        "restarts (run)",
        "VRAM leak slope",
    ]
    assert table["options"]["sortBy"] == [{"displayName": "pages firing", "desc": True}]


def test_the_latency_dashboard_breaks_ttft_down_by_context_and_turn() -> None:
    """TTFT by context length and by turn: a P50 and a P99 per target and key, the keys
    the metrics' bounded labels (soakd/measure/breakdown.py), read over 5 minutes."""
    import json

    panels = json.loads((obs.DASHBOARD_DIR / "soakd-latency.json").read_text())["panels"]
    by_title = {p["title"]: p for p in panels}
    for title, metric, label in (
        ("TTFT by context length, P50 and P99 (5m)", "soakd_ttft_by_context_seconds", "context"),
        ("TTFT by turn, P50 and P99 (5m)", "soakd_turn_ttft_seconds", "turn"),
    ):
        exprs = [t["expr"] for t in by_title[title]["targets"]]
        assert [e.split(",")[0] for e in exprs] == [
            "histogram_quantile(0.5",
            "histogram_quantile(0.99",
        ]
        for expr in exprs:
            assert f"rate({metric}_bucket{{" in expr
            assert f"by (node, site, target, {label}, le)" in expr


def test_every_dashboard_expression_keeps_node_and_site() -> None:
    """Against a central Prometheus, "All" must give one line per box: every selector
    filters on the node and site variables, every aggregation and match keeps both
    labels, nothing is aggregated or padded without them (a bare `max(...)` or
    `vector(0)` merges the sites)."""
    box = 'node=~"$node", site=~"$site"'
    for q in obs.dashboard_queries():
        expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', q.expr)  # no metric names in strings
        for name in obs.metric_names(q.expr):
            spots = [m.end() for m in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])", q.expr)]
            assert spots, (str(q), name)
            for end in spots:
                selector = re.match(r"\{[^}]*\}", q.expr[end:])
                assert selector, f"{q}: {name} unfiltered"
                assert box in selector.group(0), f"{q}: {name} unfiltered"
        for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
            labels = {x.strip() for x in clause.split(",")}
            assert {"node", "site"} <= labels, f"{q}: by/on ({clause})"
        bare = re.search(r"\b(sum|max|min|count|avg|group|topk|bottomk|vector)\s*\(", expr)
        assert not bare, f"{q}: {bare.group(0) if bare else ''} without by (node, site)"


def test_the_node_and_site_variables_are_on_every_dashboard() -> None:
    import json

    for path in obs.DASHBOARD_DIR.glob("*.json"):
        variables = {v["name"]: v for v in json.loads(path.read_text())["templating"]["list"]}
        for name in ("site", "node"):
            var = variables[name]
            assert var["multi"], (path.name, name)
            assert var["includeAll"], (path.name, name)
            assert var["allValue"] == ".*", (path.name, name)  # matches an edge's no label


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    ds = obs.load_yaml(obs.ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["uid"] == "prometheus"
    prov = obs.load_yaml(obs.ROOT / "grafana" / "provisioning" / "dashboards" / "soakd.yml")
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]
