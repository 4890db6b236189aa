"""The observability bundle through its own tools: promtool and amtool accept the shipped
files, the rule unit tests pass, Alertmanager routes by severity.

Needs promtool and amtool (scripts/setup-prometheus.sh); skipped without them, except in
CI (``CI`` set), where a missing tool fails the test.
"""

from __future__ import annotations

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


def test_amtool_check_config() -> None:
    result = obs.run_tool(obs.amtool(), "check-config", str(obs.AM_CONFIG))
    assert result.returncode == 0, _ok(result)


def test_alertmanager_commented_examples_are_valid(tmp_path: Path) -> None:
    """Uncommenting the email/Slack/PagerDuty examples gives a valid config too."""
    example = re.compile(r"^(\s*)# ((?:- )?[a-z_]+:.*)$")
    lines = [example.sub(r"\1\2", line) for line in obs.AM_CONFIG.read_text().splitlines()]
    text = "\n".join(lines) + "\n"
    for receiver in ("email_configs", "slack_configs", "pagerduty_configs", "smtp_smarthost"):
        assert f"{receiver}:" in text
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    result = obs.run_tool(obs.amtool(), "check-config", str(path))
    assert result.returncode == 0, _ok(result)


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "VramAboveLimit", "severity": "page", "gpu": "0"}, "page"),
        ({"alertname": "VramLeak", "severity": "warn", "gpu": "0"}, "warn"),
        ({"alertname": "Unknown"}, "warn"),
    ],
)
def test_alertmanager_routes_by_severity(labels: dict[str, str], receiver: str) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    result = obs.run_tool(
        obs.amtool(), "config", "routes", "test", f"--config.file={obs.AM_CONFIG}", *args
    )
    assert result.returncode == 0, _ok(result)
    assert result.stdout.split() == [receiver]
