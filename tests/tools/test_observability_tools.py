"""The observability bundle through its own tools: promtool and amtool accept the shipped
files, the rule unit tests pass, Alertmanager routes by severity.

Needs promtool and amtool (scripts/setup-prometheus.sh); skipped without them, except in
CI (``CI`` set), where a missing tool fails the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests import observability as obs


def _ok(result) -> str:  # type: ignore[no-untyped-def]
    return f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"


# --- the tools accept the files -----------------------------------------------------------


def test_promtool_check_config() -> None:
    result = obs.run_tool(obs.promtool(), "check", "config", str(obs.PROM_CONFIG))
    assert result.returncode == 0, _ok(result)
    assert f"{len(obs.RULE_FILES)} rule files found" in result.stdout


def test_promtool_check_config_of_the_local_variant(tmp_path: Path) -> None:
    """The config the integration test derives from the shipped one is valid too."""
    cfg = obs.local_prometheus_config(
        {"soakd:9464": "127.0.0.1:19464", "vllm:8000": "127.0.0.1:18000"}, "127.0.0.1:19093"
    )
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = obs.run_tool(obs.promtool(), "check", "config", str(path))
    assert result.returncode == 0, _ok(result)
    assert [job["job_name"] for job in cfg["scrape_configs"]] == ["soakd", "targets"]


def test_promtool_check_rules() -> None:
    result = obs.run_tool(obs.promtool(), "check", "rules", *map(str, obs.RULE_FILES))
    assert result.returncode == 0, _ok(result)


def test_promtool_rule_unit_tests() -> None:
    # 177 s seen on a 2-core box with a load average of 12: the limit is the test's own
    # (300 s) less a margin
    result = obs.run_tool(
        obs.promtool(),
        "test",
        "rules",
        *map(str, obs.RULE_TESTS),
        timeout=280,
    )
    assert result.returncode == 0, _ok(result)


AM_CONFIGS = [obs.AM_CONFIG, obs.CENTRAL_AM_CONFIG]


@pytest.mark.parametrize("config", AM_CONFIGS, ids=["edge", "central"])
def test_amtool_check_config(config: Path) -> None:
    result = obs.run_tool(obs.amtool(), "check-config", str(config))
    assert result.returncode == 0, _ok(result)


@pytest.mark.parametrize("config", AM_CONFIGS, ids=["edge", "central"])
def test_alertmanager_commented_examples_are_valid(config: Path, tmp_path: Path) -> None:
    """Uncommenting the email/Slack/PagerDuty examples gives a valid config too."""
    example = re.compile(r"^(\s*)# ((?:- )?[a-z_]+:.*)$")
    lines = [example.sub(r"\1\2", line) for line in config.read_text().splitlines()]
    text = "\n".join(lines) + "\n"
    for receiver in ("email_configs", "slack_configs", "pagerduty_configs", "smtp_smarthost"):
        assert f"{receiver}:" in text
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    result = obs.run_tool(obs.amtool(), "check-config", str(path))
    assert result.returncode == 0, _ok(result)


@pytest.mark.parametrize("config", AM_CONFIGS, ids=["edge", "central"])
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "VramAboveLimit", "severity": "page", "gpu": "0"}, "page"),
        ({"alertname": "VramLeak", "severity": "warn", "gpu": "0"}, "warn"),
        ({"alertname": "EdgeUnreachable", "severity": "page", "node": "a", "site": "x"}, "page"),
        ({"alertname": "Unknown"}, "warn"),
    ],
)
def test_alertmanager_routes_by_severity(
    config: Path, labels: dict[str, str], receiver: str
) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    result = obs.run_tool(
        obs.amtool(), "config", "routes", "test", f"--config.file={config}", *args
    )
    assert result.returncode == 0, _ok(result)
    assert result.stdout.split() == [receiver]


@pytest.mark.parametrize("config", AM_CONFIGS, ids=["edge", "central"])
def test_a_target_down_at_one_site_inhibits_nothing_at_another(
    config: Path, tmp_path: Path
) -> None:
    """A real Alertmanager with the shipped routes, alerts added and read back with amtool:
    TargetDown of `vllm` on box a (site A) silences a's own latency and error alerts of
    `vllm`, and nothing of box b (site B), whose target has the same name."""
    obs.amtool()
    am = obs.alertmanager_daemon("http://127.0.0.1:9/alerts", tmp_path, config=config)
    am.start()
    try:
        url = f"--alertmanager.url={am.url}"
        a, b = ["node=edge-a", "site=A"], ["node=edge-b", "site=B"]
        alerts = [
            ["TargetDown", "severity=page", "target=vllm", *a],
            ["ErrorRatioHigh", "severity=page", "target=vllm", *a],
            ["P99TTFTAboveSLO", "severity=warn", "target=vllm", *a],
            ["ErrorRatioHigh", "severity=page", "target=vllm", *b],
            ["P99TTFTAboveSLO", "severity=warn", "target=vllm", *b],
            ["P99E2EAboveSLO", "severity=warn", "target=cloud", *a],
        ]
        for labels in alerts:
            result = obs.run_tool(obs.amtool(), "alert", "add", url, *labels)
            assert result.returncode == 0, _ok(result)

        def query(*flags: str) -> set[tuple[str, str, str]]:
            result = obs.run_tool(obs.amtool(), "alert", "query", url, "-o", "json", *flags)
            assert result.returncode == 0, _ok(result)
            return {
                (x["labels"]["alertname"], x["labels"]["node"], x["labels"]["target"])
                for x in json.loads(result.stdout)
            }

        assert query("--inhibited") == {
            ("ErrorRatioHigh", "edge-a", "vllm"),
            ("P99TTFTAboveSLO", "edge-a", "vllm"),
        }
        assert query() == {
            ("TargetDown", "edge-a", "vllm"),
            ("ErrorRatioHigh", "edge-b", "vllm"),
            ("P99TTFTAboveSLO", "edge-b", "vllm"),
            ("P99E2EAboveSLO", "edge-a", "cloud"),
        }
    finally:
        am.stop()
