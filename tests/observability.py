"""Test helpers for the observability bundle: the shipped files, the real Prometheus and
Alertmanager binaries, and the metric names used by rules and dashboards.

Used by tests/unit/test_observability_static.py and
tests/integration/test_alerting_e2e.py. The binaries come from Debian's ``prometheus``
and ``prometheus-alertmanager`` packages (scripts/setup-prometheus.sh installs them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
PROM_DIR = ROOT / "prometheus"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
EXTERNAL_METRICS = PROM_DIR / "external-metrics.txt"
AM_CONFIG = ROOT / "deploy" / "alertmanager.yml"
CENTRAL_DIR = ROOT / "deploy" / "central"
CENTRAL_AM_CONFIG = CENTRAL_DIR / "alertmanager.yml"
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
GRAFANA_BUILD = ROOT / "grafana" / "build.py"
# The webhook URL in deploy/alertmanager.yml (and the central one's); tests replace it
# with their receiver's.
SHIPPED_WEBHOOK_URL = "http://alert-webhook:5001/alerts"
SHIPPED_WEBHOOK_URLS = {
    AM_CONFIG: SHIPPED_WEBHOOK_URL,
    CENTRAL_AM_CONFIG: "http://alert-webhook.example.internal:5001/alerts",
}
SETUP_HINT = "run scripts/setup-prometheus.sh (apt-get install prometheus prometheus-alertmanager)"
HOST = "127.0.0.1"


# --- binaries ---------------------------------------------------------------------------


def binary(*names: str) -> str:
    """Path of the first of ``names`` on PATH. When none is there: skip the test, or,
    in CI (``CI`` set), fail it, so that CI never passes by skipping."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    message = f"{' / '.join(names)} not found: {SETUP_HINT}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: missing tools are a failure, not a skip)")
    pytest.skip(message)


def promtool() -> str:
    return binary("promtool")


def amtool() -> str:
    return binary("amtool")


def prometheus_bin() -> str:
    return binary("prometheus")


def alertmanager_bin() -> str:
    return binary("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's


def run_tool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


# --- shipped files --------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [
        r
        for path in RULE_FILES
        for g in load_yaml(path)["groups"]
        for r in g["rules"]
        if "alert" in r
    ]


def recording_rules() -> list[dict[str, Any]]:
    return [
        r
        for path in RULE_FILES
        for g in load_yaml(path)["groups"]
        for r in g["rules"]
        if "record" in r
    ]


def grafana_builder() -> ModuleType:
    """grafana/build.py, imported from its path (grafana/ is not a package)."""
    spec = importlib.util.spec_from_file_location("soakd_grafana_build", GRAFANA_BUILD)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels inside collapsed rows


SIMULATED_RUN_EMPTY = frozenset({"TTFT by turn, P50 and P99 (5m)", "Prefix cache hit ratio"})
"""Panels a real soakd run against the simulator leaves empty, and why: it sends single
requests (no conversation turns), and the simulator keeps no prefix cache (vLLM's counters
it does not export)."""


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str
    description: str = ""

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} [{self.ref}]: {self.expr}"


def dashboard_queries() -> list[PanelQuery]:
    """Every Prometheus query of every panel of every shipped dashboard."""
    out = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        dash = json.loads(path.read_text())
        out.extend(
            PanelQuery(
                path.stem,
                panel.get("title", "?"),
                target.get("refId", "?"),
                target["expr"],
                panel.get("description", ""),
            )
            for panel in _panels(dash.get("panels", []))
            for target in panel.get("targets", [])
            if target.get("expr")
        )
    return out


def dashboard_variable_queries() -> list[tuple[str, str]]:
    """(dashboard, query) of every query-type template variable."""
    out = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        dash = json.loads(path.read_text())
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                query = var["query"]
                out.append((path.stem, query["query"] if isinstance(query, dict) else query))
    return out


GRAFANA_VARS = {
    "site": ".*",
    "node": ".*",
    "target": ".*",
    "gpu": ".*",
    "__rate_interval": "10s",
    "__range": "60s",
    "__interval": "1s",
}
BOX_VARIABLES = ("site", "node")
"""Empty on an edge (its series carry no node or site label), a list of boxes centrally."""


def expand_grafana(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace Grafana's ``$name``/``${name}`` variables as Grafana would with "All"."""
    values = {**GRAFANA_VARS, **(values or {})}

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


# --- metric names in PromQL -------------------------------------------------------------

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    # aggregation operators, which may be followed by `by (...)` before their parenthesis
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer, not a parser: strings,
    label matchers, ranges, grouping label lists, variables and function names are
    removed first; what is left that looks like a name is a metric name)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _PROMQL_WORDS:
            continue
        names.add(name)
    return names


def label_values_metric(query: str) -> str:
    """``label_values(metric{...}, label)`` -> metric."""
    return label_values_query(query)[0].split("{")[0]


def label_values_query(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` -> (selector, label)."""
    match = re.fullmatch(
        r"\s*label_values\(\s*([A-Za-z_:][\w:]*\s*(?:\{[^}]*\})?)\s*,\s*(\w+)\s*\)\s*", query
    )
    assert match, f"unexpected variable query {query!r}"
    return match.group(1), match.group(2)


def soakd_sample_names() -> set[str]:
    """Every sample name soakd can put on /metrics: its own metric classes, the limit gauges
    (exported when their slo key is set), and the gateways it runs, re-exported
    (soakd/probes/gateways.py). No ``*_created``: soakd switches them off."""
    from soakd.gateway.metrics import GatewayMetrics
    from soakd.journal.metrics import JournalMetrics
    from soakd.metrics.capacity import CapacityMetrics
    from soakd.metrics.checks import CheckMetrics
    from soakd.metrics.limits import LIMIT_HELP
    from soakd.metrics.run import GuardMetrics, Metrics, ProbeMetrics
    from soakd.probes.gateways import UP
    from soakd.workers.pool import WorkerMetrics

    registry = CollectorRegistry()
    Metrics(registry)
    ProbeMetrics(registry)
    JournalMetrics(registry)
    GuardMetrics(registry)
    WorkerMetrics(registry, 2)
    CheckMetrics(registry)
    CapacityMetrics(registry)
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "info": ("_info",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
    }
    families = [*registry.collect(), *GatewayMetrics().registry.collect()]
    return (
        {UP}
        | {family.name + suffix for family in families for suffix in suffixes[family.type]}
        | set(LIMIT_HELP)
    )


def external_metric_names() -> dict[str, str]:
    """prometheus/external-metrics.txt: name -> the section (source) it is listed under."""
    out, section = {}, ""
    for line in EXTERNAL_METRICS.read_text().splitlines():
        text = line.strip()
        if text.startswith("## "):
            section = text[3:].strip()
        elif text and not text.startswith("#"):
            out[text.split()[0]] = section
    return out


# --- running Prometheus and Alertmanager ----------------------------------------------------


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


TEST_NODE = "edge-test"
TEST_SITE = "lab-test"
"""The node and site the tests' Prometheus puts on every alert (external labels)."""


def local_prometheus_config(hosts: dict[str, str], alertmanager: str) -> dict[str, Any]:
    """The shipped prometheus.yml with its compose hosts swapped for local addresses.

    Intervals, job names, labels and the rules are kept (rule files by absolute path);
    a job whose hosts are not all in ``hosts`` is dropped (e.g. dcgm-exporter)."""
    cfg = load_yaml(PROM_CONFIG)
    # the names compose fills in from ${SOAKD_NODE} and ${SOAKD_SITE}: here fixed ones
    labels = cfg.setdefault("global", {})["external_labels"]
    assert labels == {"node": "${SOAKD_NODE}", "site": "${SOAKD_SITE}"}, labels
    cfg["global"]["external_labels"] = {"node": TEST_NODE, "site": TEST_SITE}
    cfg["rule_files"] = [str(PROM_DIR / pattern) for pattern in cfg["rule_files"]]
    cfg["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [alertmanager]}]}]
    jobs = []
    for job in cfg["scrape_configs"]:
        statics = job.get("static_configs", [])
        addrs = [a for s in statics for a in s["targets"]]
        if not addrs or not all(a in hosts for a in addrs):
            continue
        for s in statics:
            s["targets"] = [hosts[a] for a in s["targets"]]
        jobs.append(job)
    cfg["scrape_configs"] = jobs
    return cfg


def local_alertmanager_config(webhook_url: str, path: Path = AM_CONFIG) -> str:
    """A shipped Alertmanager config with its webhook pointed at ``webhook_url``."""
    text, shipped = path.read_text(), SHIPPED_WEBHOOK_URLS[path]
    assert shipped in text, f"{path} no longer uses {shipped}"
    return text.replace(shipped, webhook_url)


def _get(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class Daemon:
    """A Prometheus or Alertmanager child process, its log in a file, stopped for sure."""

    def __init__(self, name: str, argv: list[str], log_path: Path, url: str) -> None:
        self.name, self.argv, self.log_path, self.url = name, argv, log_path, url
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        with self.log_path.open("ab") as log:  # a restart appends
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}): {self.log_tail()}"
                )
            if _get(self.url + "/-/ready") == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {timeout:g} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


def prometheus_daemon(config: dict[str, Any], workdir: Path, *flags: str) -> Daemon:
    """A Prometheus with ``config`` and its own TSDB in ``workdir``; ``flags`` added."""
    port = free_port()
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [
        prometheus_bin(),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address={HOST}:{port}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
        *flags,
    ]
    return Daemon("prometheus", argv, workdir / "prometheus.log", f"http://{HOST}:{port}")


def rules_with_for(sources: list[Path], dest: Path, waits: dict[str, str]) -> list[Path]:
    """Copies of rule files in ``dest`` with the `for:` of the alerts named in ``waits``
    shortened (a test's clock, not the rule's meaning: expressions stay as shipped)."""
    dest.mkdir(parents=True, exist_ok=True)
    seen, out = set(), []
    for source in sources:
        doc = load_yaml(source)
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") in waits:
                    assert "for" in rule, rule["alert"]
                    rule["for"] = waits[rule["alert"]]
                    seen.add(rule["alert"])
        path = dest / source.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(path)
    assert seen == set(waits), f"no such alerts: {set(waits) - seen}"
    return out


def alertmanager_daemon(
    webhook_url: str,
    workdir: Path,
    *,
    config: Path = AM_CONFIG,
    name: str = "alertmanager",
    cluster: tuple[int, list[int]] | None = None,
) -> Daemon:
    """An Alertmanager with a shipped config; alone, or a cluster peer: ``cluster`` is
    (its gossip port, the other peers' gossip ports), all on 127.0.0.1."""
    port = free_port()
    config_path = workdir / f"{name}.yml"
    config_path.write_text(local_alertmanager_config(webhook_url, config))
    argv = [
        alertmanager_bin(),
        f"--config.file={config_path}",
        f"--storage.path={workdir / (name + '-data')}",
        f"--web.listen-address={HOST}:{port}",
        "--log.level=warn",
    ]
    if cluster is None:
        argv.append("--cluster.listen-address=")
    else:
        gossip, peers = cluster
        argv += [
            f"--cluster.listen-address={HOST}:{gossip}",
            f"--cluster.advertise-address={HOST}:{gossip}",
            *(f"--cluster.peer={HOST}:{peer}" for peer in peers),
        ]
    return Daemon(name, argv, workdir / f"{name}.log", f"http://{HOST}:{port}")
