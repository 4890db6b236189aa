"""Every metric name soakd reads is one it exports, or a foreign one listed explicitly.

Readers: the probes (foreign pages; the samples they journal), the report (journaled
samples), the alert and recording rules, and the Grafana dashboards. soakd's own names
are the constants of ``soakd/metrics/names.py``, registered by its metric classes; the
foreign ones (vLLM, llama.cpp, DCGM, a process collector, Prometheus' own) are listed in
``soakd/metrics/names.py`` (what soakd's code reads) and ``prometheus/external-metrics.txt``
(what the rules and dashboards read), checked against reference captures.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from soakd.metrics import names as mn

try:
    from tests import observability as obs
except ModuleNotFoundError:  # tests/unit is not a package: pytest put only it on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import observability as obs

SOAKD = obs.ROOT / "soakd"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_info")
NOT_METRICS = {
    "soakd_version",  # a column of the journal's run table
    "soakd_sim_runtime",  # an aiohttp AppKey
    "soakd_gateway_",  # the prefix of the gateway families re-exported
}
"""String literals in soakd/ that look like soakd metric names and are not."""
NAME = re.compile(r"(?:soakd_|vllm:|llamacpp:|DCGM_FI_)[A-Za-z0-9_:]*")


def _constants() -> dict[str, str]:
    return {k: v for k, v in vars(mn).items() if k.isupper() and isinstance(v, str)}


def _family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _exported(name: str, registered: set[str]) -> bool:
    """A sample name soakd exports, or a histogram family's name (its samples are)."""
    return name in registered or name + "_count" in registered


def _foreign(name: str) -> bool:
    return name in mn.FOREIGN or _family(name) in mn.FOREIGN


def _literals_in_soakd() -> dict[str, str]:
    """Every string literal in soakd/ (but metrics/names.py) shaped like a metric name."""
    found: dict[str, str] = {}
    for path in sorted(SOAKD.rglob("*.py")):
        if path == SOAKD / "metrics" / "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and NAME.fullmatch(node.value)
                and node.value not in NOT_METRICS
            ):
                found.setdefault(node.value, str(path.relative_to(obs.ROOT)))
    return found


def _capture_names(path: Path) -> set[str]:
    return _capture_names_text(path.read_text())


def test_every_metric_name_read_is_registered_or_listed_foreign() -> None:
    registered = obs.soakd_sample_names()
    problems: list[str] = []

    # soakd's own constants: each one is exported, and each exported family has one
    own = {k: v for k, v in _constants().items() if v.startswith("soakd_")}
    problems += [
        f"{k} = {v!r}: not registered" for k, v in own.items() if not _exported(v, registered)
    ]
    named = set(own.values())
    problems += [
        f"{n}: exported without a constant in metrics/names.py"
        for n in sorted(registered)
        if n not in named and _family(n) not in named
    ]

    # the probes read foreign pages by these names; the simulator serves them
    from soakd.probes.gpu.dcgm import WANTED as DCGM_WANTED
    from soakd.probes.server import FIELDS
    from soakd.profiles import get_profile
    from soakd.sim.exposition import CardIdentity, render_dcgm
    from soakd.sim.gpu import GpuModel

    read = {n for names in FIELDS.values() for n in names} | set(DCGM_WANTED)
    problems += [f"{n}: read by the probes, not listed foreign" for n in read if not _foreign(n)]
    vllm_page = _capture_names(obs.ROOT / "tests/data/vllm-0.32-cpu-metrics.txt")
    vllm = vllm_page | {_family(n) for n in vllm_page}
    problems += [f"{n}: not in vLLM 0.32's capture" for n in (mn.VLLM | mn.VLLM_SIM_ONLY) - vllm]
    llama = {_family(n) for n in _capture_names(obs.ROOT / "tests/data/llama-server-metrics.txt")}
    problems += [f"{n}: not in llama-server's capture" for n in mn.LLAMACPP - llama]
    profile = get_profile("edge-4gb")
    page = render_dcgm(GpuModel(profile, 0.0).sample(1.0, 0), CardIdentity.for_profile(profile))
    problems += [
        f"{n}: served by the simulator, not listed foreign"
        for n in _capture_names_text(page)
        if n not in mn.DCGM
    ]

    # every metric-shaped literal left in soakd/ (the report's among them)
    for name, where in _literals_in_soakd().items():
        if not (_exported(name, registered) or _foreign(name)):
            problems.append(f"{name} ({where}): neither registered nor listed foreign")
    from soakd.report import SAMPLE_NAMES

    problems += [
        f"{n}: in soakd.report.SAMPLE_NAMES, not registered"
        for n in SAMPLE_NAMES
        if not _exported(n, registered)
    ]

    # the alert and recording rules, and the dashboards
    recorded = {r["record"] for r in obs.recording_rules()}
    external = obs.external_metric_names()
    used: dict[str, str] = {}
    for rule in obs.alert_rules() + obs.recording_rules():
        for name in obs.metric_names(rule["expr"]):
            used.setdefault(name, f"rule {rule.get('alert') or rule.get('record')}")
    for query in obs.dashboard_queries():
        for name in obs.metric_names(query.expr):
            used.setdefault(name, f"panel {query}")
    for dashboard, query in obs.dashboard_variable_queries():
        used.setdefault(obs.label_values_metric(query), f"variable of {dashboard}")
    allowed = registered | recorded | set(external)
    problems += [
        f"{n} ({where}): nobody exports it" for n, where in used.items() if n not in allowed
    ]
    unused = set(external) - set(used)
    problems += [f"{n}: listed in {obs.EXTERNAL_METRICS.name}, used nowhere" for n in unused]
    for name, section in external.items():
        if section == "vllm" and name not in vllm:
            problems.append(f"{name}: listed as vLLM's, not in vLLM 0.32's capture")
        if section == "vllm" and _family(name) not in mn.VLLM:
            problems.append(f"{name}: a vLLM name the rules read, missing from metric_names.VLLM")

    # the soakd names the rules and dashboards use are documented
    documented = (obs.ROOT / "docs" / "metrics.md").read_text()
    for name in used:
        if name in registered and _family(name) not in documented and name not in documented:
            problems.append(f"{name}: used by a rule or a panel, not in docs/metrics.md")

    assert not problems, "\n".join(problems)


def _capture_names_text(text: str) -> set[str]:
    return {
        line.split("{")[0].split()[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
