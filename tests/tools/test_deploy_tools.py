"""The deployment files through their tools, no engine (tests/unit/test_deploy_static.py
holds the checks that need none):

- docker-compose.yml, deploy/central/compose.yml and the build-ca overlay validate
  against the Compose specification (check-jsonschema's vendored schema) and, where a
  Docker Compose CLI is installed, `docker compose config` resolves each profile set;
- the Dockerfile passes hadolint (and hadolint really lints);
- the systemd unit passes `systemd-analyze verify`;
- the central Prometheus configs (remote_write and federation) and the edge snippet pass
  `promtool check config`, the central rules their unit tests for both paths.

A missing tool skips its test, except in CI (``CI`` set), where it fails
(scripts/setup-tools.sh installs them all: make setup-tools).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests import deploy as d

BIN = Path(sys.executable).parent


def missing(what: str) -> NoReturn:
    """Skip the test for a missing tool, or in CI (``CI`` set) fail it: CI never passes
    by skipping."""
    message = f"{what} (scripts/setup-tools.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set: a missing tool is a failure")
    pytest.skip(message)


def tool(name: str) -> str:
    """Path of a tool: next to this Python (the venv) or on PATH; else ``missing``."""
    for candidate in (BIN / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    missing(f"{name} not found")


def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=d.ROOT, **kw)


def out(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"


COMPOSE = d.load_yaml(d.COMPOSE_FILE)


def promtool() -> str:
    return tool("promtool")


@pytest.mark.parametrize("path", d.COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_matches_the_compose_specification(path: Path) -> None:
    exe = tool("check-jsonschema")
    result = run(exe, "--builtin-schema", "vendor.compose-spec", str(path))
    assert result.returncode == 0, out(result)


def test_the_schema_check_catches_a_bad_compose_file(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text(
        "services:\n  x:\n    image: a:1\n    restart: sometimes-maybe\n"
        "    stop_grace_period: [60]\n"
    )
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad))
    assert result.returncode != 0, out(result)


@pytest.mark.parametrize("profiles", [*d.PROFILE_SETS, "none"])
def test_docker_compose_config_resolves(profiles: str) -> None:
    """`docker compose config` needs no engine: interpolation, profiles, depends_on,
    secrets, volumes are all resolved by the real implementation, v2 or v1 (1.29)."""
    cli = d.compose_binary()
    if cli is None:
        missing("no Docker Compose CLI (docker compose plugin, docker-compose, or $DOCKER_COMPOSE)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    env.update(d.env_example())
    env["COMPOSE_PROFILES"] = (
        "" if profiles == "none" else ",".join(sorted(d.PROFILE_SETS[profiles]))
    )
    rendered = run(*cli.argv, "-f", str(d.COMPOSE_FILE), "config", env=env)
    assert rendered.returncode == 0, out(rendered)
    listed = run(*cli.argv, "-f", str(d.COMPOSE_FILE), "config", "--services", env=env)
    assert listed.returncode == 0, out(listed)
    wanted = set() if profiles == "none" else d.PROFILE_SETS[profiles]
    started = d.services_for_profiles(cli, rendered.stdout, listed.stdout, wanted)
    expected = set(d.active(COMPOSE, wanted))
    assert started == expected


def test_build_ca_overlay_matches_the_compose_specification() -> None:
    result = run(
        tool("check-jsonschema"),
        "--builtin-schema",
        "vendor.compose-spec",
        str(d.BUILD_CA_COMPOSE_FILE),
    )
    assert result.returncode == 0, out(result)


def test_dockerfile_passes_hadolint() -> None:
    result = run(tool("hadolint"), "--no-color", str(d.DOCKERFILE))
    assert result.returncode == 0, out(result)


def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:latest\nADD https://example.com/x.tgz /x\nRUN apt-get install -y curl\n"
    )
    result = run(tool("hadolint"), "--no-color", str(bad))
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = tool("systemd-analyze")  # Debian/Ubuntu: package systemd
    # verify checks that ExecStart's binary exists: point it at this venv's soakd
    soakd = BIN / "soakd"
    assert soakd.exists()
    unit = tmp_path / "soakd.service"
    text = d.SYSTEMD_UNIT.read_text()
    assert "/opt/soakd/venv/bin/soakd" in text
    unit.write_text(text.replace("/opt/soakd/venv/bin/soakd", str(soakd)))
    result = run(exe, "verify", str(unit))
    # verify exits 0 on unknown keys and bad values too, but says so on stderr
    assert result.returncode == 0, out(result)
    assert not result.stderr.strip(), out(result)


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus.federation.yml"])
def test_central_prometheus_configs(config: str) -> None:
    result = run(promtool(), "check", "config", str(d.CENTRAL_DIR / config))
    assert result.returncode == 0, out(result)


def test_central_rules_for_both_paths() -> None:
    """deploy/central/tests/: federation.yml and remote-write.yml, one per path."""
    tests = sorted((d.CENTRAL_DIR / "tests").glob("*.yml"))
    assert {p.stem for p in tests} == {"federation", "remote-write"}
    result = run(promtool(), "test", "rules", *map(str, tests))
    assert result.returncode == 0, out(result)


def test_edge_snippet_merges_into_the_edge_prometheus_config(tmp_path: Path) -> None:
    edge = d.load_yaml(d.ROOT / "prometheus" / "prometheus.yml")
    snippet = d.load_yaml(d.CENTRAL_DIR / "edge-prometheus.snippet.yml")
    edge.setdefault("global", {}).update(snippet["global"])
    edge["remote_write"] = snippet["remote_write"]
    edge["alerting"] = snippet["alerting"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(edge, sort_keys=False))
    shutil.copytree(d.ROOT / "prometheus" / "rules", tmp_path / "rules")
    result = run(promtool(), "check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, out(result)
    # the long-term stores the snippet offers instead, uncommented, are valid too
    text = (d.CENTRAL_DIR / "edge-prometheus.snippet.yml").read_text()
    stores = [
        line.replace("  # ", "  ", 1)
        for line in text.splitlines()
        if line.startswith(("  # - url:", "  #   "))
    ]
    assert any("/api/v1/push" in line for line in stores)  # Mimir
    assert any("/api/v1/receive" in line for line in stores)  # Thanos Receive
    edge["remote_write"] = yaml.safe_load("\n".join(stores))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(edge, sort_keys=False))
    result = run(promtool(), "check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, out(result)
