"""The deployment files, checked without Docker and without any tool (no engine runs here
or in CI):

- every file a service mounts from the repo exists, every image is pinned, every
  ${VAR} is explained in .env.example, the profiles start what they should;
- the Dockerfile follows the structural rules it promises;
- the soakd configs pass `soakd check`;
- the LiteLLM entrypoint and the alert webhook do what compose relies on.

The same files through their tools (check-jsonschema, the compose CLI, hadolint,
systemd-analyze, promtool): tests/tools/test_deploy_tools.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

try:
    from tests import deploy as d
except ModuleNotFoundError:  # tests/unit is not a package: pytest put only it on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import deploy as d

from soakd.config import RunConfig, load_config, parse_duration

COMPOSE = d.load_yaml(d.COMPOSE_FILE)
SERVICES = d.services(COMPOSE)


def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=d.ROOT, **kw)


def out(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"


# --- compose: the overlay -----------------------------------------------------------------


def test_build_ca_overlay_adds_the_build_secret_only() -> None:
    """docker-compose.build-ca.yml (Compose v2) adds the build secret `ca` to every
    service that builds the soakd image, and nothing else."""
    overlay = d.load_yaml(d.BUILD_CA_COMPOSE_FILE)
    building = {name for name, svc in SERVICES.items() if "build" in svc}
    assert set(overlay["services"]) == building
    for svc in overlay["services"].values():
        assert set(svc) == {"build"}
        assert svc["build"]["secrets"] == ["ca"]
        assert svc["build"]["context"] == SERVICES["soakd"]["build"]["context"]
    assert set(overlay["secrets"]) == {"ca"}
    assert "SOAKD_BUILD_CA_FILE" in overlay["secrets"]["ca"]["file"]


# --- compose: what the services refer to -------------------------------------------------


@pytest.mark.parametrize("path", d.COMPOSE_FILES, ids=lambda p: p.name)
def test_every_mounted_file_exists(path: Path) -> None:
    mounts = d.bind_mounts(path)
    assert mounts
    missing = [
        f"{m.service}: {m.source.relative_to(d.ROOT)}" for m in mounts if not m.source.exists()
    ]
    assert not missing, f"mounted from the repo but missing: {missing}"
    for m in mounts:
        if m.target.endswith((".yml", ".yaml", ".py", ".sh", ".json")):
            assert m.source.is_file(), f"{m.service}: {m.source} should be a file"


def test_build_context_and_grafana_home_dashboard_exist() -> None:
    for name, svc in SERVICES.items():
        if "build" in svc:
            context = d.ROOT / svc["build"]["context"]
            assert (context / svc["build"].get("dockerfile", "Dockerfile")).is_file(), name
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    mounted = {m.target: m.source for m in d.bind_mounts(d.COMPOSE_FILE) if m.service == "grafana"}
    folder = "/var/lib/grafana/dashboards/soakd"
    assert home.startswith(folder + "/")
    assert (mounted[folder] / home.removeprefix(folder + "/")).is_file()


@pytest.mark.parametrize("path", d.COMPOSE_FILES, ids=lambda p: p.name)
def test_every_image_is_pinned(path: Path) -> None:
    compose = d.load_yaml(path)
    example = d.env_example()
    for name, svc in d.services(compose).items():
        assert "image" in svc, f"{name}: no image"
        for env in ({}, example):  # the compose default, and what .env.example sets
            image = d.interpolate(svc["image"], env)
            ref, _, _digest = image.partition("@")
            repo, _, tag = ref.rpartition(":")
            if "build" in svc:
                assert tag, f"{name}: built image without a tag: {image}"
                continue
            assert repo, f"{name}: image {image!r}"
            assert tag, f"{name}: image {image!r} has no tag"
            assert "/" not in tag, f"{name}: image {image!r} has no tag"
            assert tag not in ("latest", "main-latest", "main-stable", "stable", "nightly"), (
                f"{name}: {image} is not pinned"
            )
            assert re.search(r"\d", tag), f"{name}: {image}: a tag without a version"


@pytest.mark.parametrize("path", d.COMPOSE_FILES, ids=lambda p: p.name)
def test_env_example_explains_every_variable(path: Path) -> None:
    compose = d.load_yaml(path)
    used = d.variables(compose)
    used |= {s["environment"] for s in compose.get("secrets", {}).values() if "environment" in s}
    if path == d.CENTRAL_COMPOSE_FILE:
        # set per host on the command line: every required one (${VAR:?...}) is in the
        # docs' walkthrough; the others have defaults
        required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", path.read_text()))
        assert required == {"AM_ADVERTISE", "AM_PEER_1", "AM_PEER_2"}
        docs = (d.ROOT / "docs" / "deployment.md").read_text()
        assert all(name in docs for name in required)
        return
    example = d.env_example()
    assert not used - set(example), f"not in .env.example: {sorted(used - set(example))}"
    # each is explained: its paragraph (lines since the last blank one) has a comment
    paragraph: list[str] = []
    for line in d.ENV_EXAMPLE.read_text().splitlines():
        if not line.strip():
            paragraph = []
            continue
        paragraph.append(line)
        if not line.startswith("#"):
            assert any(p.startswith("#") for p in paragraph), f"unexplained: {line}"
    unused = set(example) - used - {"COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME"}
    assert not unused, f".env.example sets variables compose does not use: {sorted(unused)}"


def test_secrets_and_volumes_are_declared() -> None:
    declared_secrets = set(COMPOSE.get("secrets", {}))
    declared_volumes = set(COMPOSE.get("volumes", {}))
    used_secrets: set[str] = set()
    used_volumes: set[str] = set()
    for svc in SERVICES.values():
        used_secrets.update(
            s if isinstance(s, str) else s["source"] for s in svc.get("secrets", [])
        )
        used_volumes |= d.named_volumes(svc)
    assert used_secrets == declared_secrets
    assert used_volumes == declared_volumes


# --- compose: profiles, dependencies, the contract with the observability bundle ----------


def test_profiles_gpu_is_the_default_and_sim_needs_no_gpu() -> None:
    assert all(svc.get("profiles") for svc in SERVICES.values()), (
        "a service without a profile would start in every setup"
    )
    assert d.env_example()["COMPOSE_PROFILES"] == "gpu"
    gpu, sim = d.active(COMPOSE, {"gpu"}), d.active(COMPOSE, {"sim"})
    assert {"vllm", "gateway", "soakd", "prometheus", "alertmanager", "grafana"} <= set(gpu)
    assert {"soakd-sim", "soakd-demo", "prometheus", "alertmanager", "grafana"} <= set(sim)
    assert not [n for n, s in sim.items() if d.gpu_reserved(s)], "sim must run without a GPU"
    assert d.gpu_reserved(SERVICES["vllm"])
    assert SERVICES["dcgm-exporter"]["profiles"] == ["gpu-metrics"]


@pytest.mark.parametrize("profiles", list(d.PROFILE_SETS))
def test_dependencies_are_in_the_same_setup(profiles: str) -> None:
    running = d.active(COMPOSE, d.PROFILE_SETS[profiles])
    for name, svc in running.items():
        for dep in svc.get("depends_on", {}):
            assert dep in running, f"{profiles}: {name} depends on {dep}, which is not started"


@pytest.mark.parametrize("profiles", ["gpu", "sim"])
def test_prometheus_and_alertmanager_reach_their_targets(profiles: str) -> None:
    """The host names in prometheus/prometheus.yml and deploy/alertmanager.yml are
    services (or aliases) of each setup, and soakd's target names match the `target`
    label Prometheus puts on the servers' own metrics."""
    running = d.active(COMPOSE, d.PROFILE_SETS[profiles])
    names: set[str] = set()
    for name, svc in running.items():
        names |= d.hostnames(name, svc)
    prom = d.load_yaml(d.ROOT / "prometheus" / "prometheus.yml")
    for job in prom["scrape_configs"]:
        if job["job_name"] == "dcgm":
            continue  # profile gpu-metrics; down otherwise, on purpose
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                assert target.rpartition(":")[0] in names, f"{profiles}: {job['job_name']}"
    for am in prom["alerting"]["alertmanagers"]:
        for static in am["static_configs"]:
            for target in static["targets"]:
                assert target.rpartition(":")[0] in names
    hooks = re.findall(
        r"url: http://([a-z0-9-]+):", (d.ROOT / "deploy" / "alertmanager.yml").read_text()
    )
    assert hooks
    assert set(hooks) <= names
    labelled = {
        static.get("labels", {}).get("target")
        for job in prom["scrape_configs"]
        if job["job_name"] == "targets"
        for static in job["static_configs"]
    }
    config = d.SOAKD_SIM_CONFIG if profiles == "sim" else d.SOAKD_COMPOSE_CONFIG
    soak_targets = {t["name"] for t in d.load_yaml(config)["targets"]}
    assert labelled - {None} <= soak_targets


def test_soakd_stops_within_the_grace_period() -> None:
    for service, config in (("soakd", d.SOAKD_COMPOSE_CONFIG), ("soakd-demo", d.SOAKD_SIM_CONFIG)):
        svc = SERVICES[service]
        drain = parse_duration(d.load_yaml(config)["run"].get("drain_timeout", "30s"))
        grace = parse_duration(svc["stop_grace_period"])
        assert grace >= drain + 10, f"{service}: stop_grace_period {grace}s, drain {drain}s"
        assert svc.get("stop_signal", "SIGTERM") == "SIGTERM"
        assert svc["restart"].startswith("on-failure")
        mounts = {m.target: m.source for m in d.bind_mounts(d.COMPOSE_FILE) if m.service == service}
        assert mounts["/etc/soakd/soakd.yaml"] == config
        assert "soakd-data" in d.named_volumes(svc)
        assert svc["command"][:2] == ["run", "/etc/soakd/soakd.yaml"]


def test_compose_command_is_the_image_default_plus_a_fixed_run_dir() -> None:
    """The image's CMD, plus a run directory that survives restarts (soakd resumes an
    unfinished run it finds there), one per setup."""
    cmd = d.exec_form([i for i in d.dockerfile_instructions() if i.keyword == "CMD"][-1].args)
    run_dirs = set()
    for name in ("soakd", "soakd-demo"):
        command = SERVICES[name]["command"]
        assert command[: len(cmd)] == cmd
        assert command[len(cmd)] == "--run-dir"
        assert len(command) == len(cmd) + 2
        run_dir = command[-1]
        assert run_dir.startswith("/var/lib/soakd/runs/")
        assert "${SOAKD_RUN_NAME" in run_dir
        run_dirs.add(d.interpolate(run_dir, d.env_example()))
    assert len(run_dirs) == 2, "the gpu and sim setups share the volume, not the run"


def test_every_long_running_service_restarts_and_rotates_logs() -> None:
    for name, svc in SERVICES.items():
        assert svc.get("restart"), f"{name}: no restart policy"
        logging = svc.get("logging", {})
        assert logging.get("driver") == "json-file", f"{name}: container logs are not rotated"
        assert "max-size" in logging.get("options", {}), f"{name}: logs are not rotated"


def test_node_and_site_reach_soakd_and_prometheus_from_the_same_values() -> None:
    """soakd's run.node / run.site and the edge Prometheus's external labels come from the
    same two variables of .env, with the same defaults."""
    for service in ("soakd", "soakd-demo"):
        env = SERVICES[service]["environment"]
        assert env["SOAKD__RUN__NODE"] == "${SOAKD_NODE:-edge-1}"
        assert env["SOAKD__RUN__SITE"] == "${SOAKD_SITE:-lab-1}"
    prom = SERVICES["prometheus"]
    assert "--enable-feature=expand-external-labels" in prom["command"]
    assert prom["environment"]["SOAKD_NODE"] == "${SOAKD_NODE:-edge-1}"
    assert prom["environment"]["SOAKD_SITE"] == "${SOAKD_SITE:-lab-1}"
    example = d.env_example()
    assert (example["SOAKD_NODE"], example["SOAKD_SITE"]) == ("edge-1", "lab-1")
    for config in (d.SOAKD_COMPOSE_CONFIG, d.SOAKD_SIM_CONFIG):
        assert d.load_yaml(config)["run"]["site"] == "lab-1"


def test_edge_prometheus_and_the_snippet_name_node_and_site() -> None:
    expected = {"node": "${SOAKD_NODE}", "site": "${SOAKD_SITE}"}
    prom = d.load_yaml(d.ROOT / "prometheus" / "prometheus.yml")
    assert prom["global"]["external_labels"] == expected
    snippet = d.load_yaml(d.CENTRAL_DIR / "edge-prometheus.snippet.yml")
    assert snippet["global"]["external_labels"] == expected


# --- soakd's configs -----------------------------------------------------------------------


def test_sim_config_passes_soakd_check() -> None:
    result = run(sys.executable, "-m", "soakd", "check", str(d.SOAKD_SIM_CONFIG))
    assert result.returncode == 0, out(result)
    assert result.stdout.startswith(f"{d.SOAKD_SIM_CONFIG}: ok")


def test_gpu_config_passes_soakd_check_with_the_compose_environment(tmp_path: Path) -> None:
    key = tmp_path / "litellm_master_key"
    key.write_text("sk-test\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAKD__")}
    example = d.env_example()
    for name, value in SERVICES["soakd"]["environment"].items():
        env[name] = d.interpolate(value, example)
    env["SOAKD__TARGETS__GATEWAY__API_KEY_FILE"] = str(key)  # /run/secrets/... in compose
    result = run(sys.executable, "-m", "soakd", "check", str(d.SOAKD_COMPOSE_CONFIG), env=env)
    assert result.returncode == 0, out(result)
    cfg = load_config(d.SOAKD_COMPOSE_CONFIG, env)
    assert cfg.run.node == example["SOAKD_NODE"]
    assert cfg.target("vllm").model == example["VLLM_SERVED_MODEL_NAME"]
    assert cfg.exporter.listen == "0.0.0.0:9464"
    # the gateway's key is the secret compose mounts
    raw = d.load_yaml(d.SOAKD_COMPOSE_CONFIG)
    gateway = next(t for t in raw["targets"] if t["name"] == "gateway")
    assert gateway["api_key_file"] == "/run/secrets/litellm_master_key"
    assert "litellm_master_key" in SERVICES["soakd"]["secrets"]
    # the plan is 72 h, as the docs say
    phases = sum(parse_duration(p["duration"]) for p in raw["phases"])
    assert phases == parse_duration(raw["run"]["duration"]) == 72 * 3600


def test_systemd_env_example_overrides_are_valid_config_keys() -> None:
    env = {k: v for k, v in d.env_example(d.SYSTEMD_ENV_EXAMPLE).items() if k.startswith("SOAKD__")}
    assert env
    cfg = load_config(d.ROOT / "examples" / "demo.yaml", env)
    assert cfg.run.node == env["SOAKD__RUN__NODE"]


# --- Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_structure() -> None:
    ins = d.dockerfile_instructions()
    froms = [i for i in ins if i.keyword == "FROM"]
    assert len(froms) >= 2, "multi-stage: a builder and a runtime"
    for f in froms:
        image = f.args.split()[0]
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", image), (
            f"base image not pinned to a 3.11 patch release: {image}"
        )
    runtime = froms[-1].stage
    final = [i for i in ins if i.stage == runtime]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users, "no USER: runs as root"
    assert users[-1].split(":")[0] not in ("0", "root"), "runs as root"
    assert not any(i.keyword == "ADD" for i in ins), "ADD (URLs, archives): use COPY"
    health = [i.args for i in final if i.keyword == "HEALTHCHECK"]
    assert health
    assert "/healthz" in health[-1]
    assert "curl" not in health[-1]
    assert [i.args for i in final if i.keyword == "STOPSIGNAL"] == ["SIGTERM"]
    entry = d.exec_form([i for i in final if i.keyword == "ENTRYPOINT"][-1].args)
    assert entry[:2] == ["tini", "--"]
    assert entry[2] == "soakd"
    assert [i.args for i in final if i.keyword == "WORKDIR"][-1] == "/var/lib/soakd"
    assert any("/var/lib/soakd" in i.args for i in final if i.keyword == "VOLUME")
    cmd = d.exec_form([i for i in final if i.keyword == "CMD"][-1].args)
    assert cmd[:2] == ["run", "/etc/soakd/soakd.yaml"]
    assert "--no-live" in cmd
    installs = [i.args for i in final if i.keyword == "RUN" and "pip install" in i.args]
    assert installs
    assert all("--no-index" in a for a in installs), "runtime installs offline"
    assert not any("[test]" in i.args or "-e " in i.args for i in ins if i.keyword == "RUN")


def test_dockerignore_keeps_the_context_small_and_secret_free() -> None:
    lines = [
        ln.strip()
        for ln in (d.ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include"
    included = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = set()
    for i in d.dockerfile_instructions():
        if i.keyword == "COPY" and "--from" not in i.args:
            copied.update(p.rstrip("/") for p in i.args.split()[:-1] if not p.startswith("--"))
    assert copied <= included, f"COPY needs {copied - included}"
    assert ".env" not in included


# --- systemd ---------------------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in d.SYSTEMD_UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_settings() -> None:
    s = unit_settings()
    assert s["Type"] == ["exec"]
    assert s["User"][0] not in ("root", "0")
    assert s["EnvironmentFile"] == ["/etc/soakd/soakd.env"]
    assert s["KillSignal"] == ["SIGTERM"]
    assert s["KillMode"] == ["mixed"]
    assert s["Restart"] == ["on-failure"]
    assert s["RestartPreventExitStatus"] == ["2 3"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["ReadWritePaths"] == ["/var/lib/soakd"]
    assert s["WorkingDirectory"] == ["/var/lib/soakd"]
    assert parse_duration(s["TimeoutStopSec"][0]) > RunConfig().drain_timeout + 30
    assert "PrivateDevices" not in s, "it would hide /dev/nvidia* from the NVML probe"
    exec_start = s["ExecStart"][0].split()
    assert exec_start[1:] == [
        "run",
        "/etc/soakd/soakd.yaml",
        "--no-live",
        "--run-dir",
        "/var/lib/soakd/runs/${SOAKD_RUN_NAME}",
    ]
    assert s["Environment"] == ["SOAKD_RUN_NAME=soak-1"]  # soakd.env may override it
    assert "SOAKD_RUN_NAME" in d.env_example(d.SYSTEMD_ENV_EXAMPLE)


# --- deploy/central: federation, remote_write, the Alertmanager cluster --------------------


def test_central_prometheus_federates_the_edges() -> None:
    central = d.load_yaml(d.CENTRAL_DIR / "prometheus.federation.yml")
    job = next(j for j in central["scrape_configs"] if j["job_name"] == "edge-federate")
    assert job["honor_labels"] is True
    assert job["metrics_path"] == "/federate"
    assert any('job="soakd"' in m for m in job["params"]["match[]"])
    assert central["rule_files"] == ["rules/central.yml"]  # its list of boxes: edges/
    for entry in d.load_yaml(d.CENTRAL_DIR / "edges" / "edges.yml"):
        assert entry["labels"]["node"]
        assert entry["labels"]["site"]


def test_central_prometheus_receives_remote_write() -> None:
    """The recommended path: the central Prometheus of deploy/central/compose.yml takes
    the edges' remote_write (the snippet's first entry), with exemplars, and loads the
    central rules with the list of boxes."""
    central = d.load_yaml(d.CENTRAL_DIR / "prometheus.yml")
    assert "scrape_configs" not in central  # the data arrives
    assert central["rule_files"] == ["rules/*.yml"]
    cmd = d.load_yaml(d.CENTRAL_COMPOSE_FILE)["services"]["prometheus"]["command"]
    assert "--web.enable-remote-write-receiver" in cmd
    assert "--enable-feature=exemplar-storage" in cmd
    mounts = {m.target: m.source for m in d.bind_mounts(d.CENTRAL_COMPOSE_FILE)}
    assert mounts["/etc/prometheus/prometheus.yml"] == d.CENTRAL_DIR / "prometheus.yml"
    (first, *_) = d.load_yaml(d.CENTRAL_DIR / "edge-prometheus.snippet.yml")["remote_write"]
    assert first["url"].endswith(":9090/api/v1/write")
    assert first["send_exemplars"] is True
    listed = d.load_yaml(d.CENTRAL_DIR / "rules" / "fleet-nodes.yml")["groups"][0]["rules"]
    assert {r["record"] for r in listed} == {"node:soakd_expected:bool"}
    assert all({"node", "site"} == set(r["labels"]) for r in listed)


def test_central_grafana_reads_the_central_prometheus_at_its_resolution() -> None:
    """timeInterval is the resolution of what the central holds: the edges' own scrape
    interval, since remote_write sends every sample (federation: its scrape_interval)."""
    (source,) = d.load_yaml(d.CENTRAL_DIR / "grafana" / "datasources" / "central.yml")[
        "datasources"
    ]
    edge = d.load_yaml(d.ROOT / "prometheus" / "prometheus.yml")["global"]
    assert source["jsonData"]["timeInterval"] == edge["scrape_interval"]
    assert source["uid"] == "prometheus"  # the dashboards' default datasource
    text = (d.CENTRAL_DIR / "grafana" / "datasources" / "central.yml").read_text()
    federation = d.load_yaml(d.CENTRAL_DIR / "prometheus.federation.yml")["global"]
    assert f"{federation['scrape_interval']}; with 1s there" in text
    grafana = d.load_yaml(d.CENTRAL_COMPOSE_FILE)["services"]["grafana"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (d.ROOT / "grafana" / "dashboards" / home.rsplit("/", 1)[1]).is_file()


def test_central_alertmanagers_form_one_cluster() -> None:
    central = d.load_yaml(d.CENTRAL_COMPOSE_FILE)
    cmd = central["services"]["alertmanager"]["command"]
    assert sum(a.startswith("--cluster.peer=") for a in cmd) == 2  # three peers in all
    assert any(a.startswith("--cluster.listen-address=0.0.0.0:") for a in cmd)
    mounts = {m.target: m.source for m in d.bind_mounts(d.CENTRAL_COMPOSE_FILE)}
    assert mounts["/etc/alertmanager/alertmanager.yml"] == d.CENTRAL_DIR / "alertmanager.yml"
    snippet = d.load_yaml(d.CENTRAL_DIR / "edge-prometheus.snippet.yml")
    for config in ("prometheus.yml", "prometheus.federation.yml"):
        peers = d.load_yaml(d.CENTRAL_DIR / config)["alerting"]["alertmanagers"]
        assert peers == snippet["alerting"]["alertmanagers"]
        assert len(peers[0]["static_configs"][0]["targets"]) == 3


# --- the gateway's entrypoint and the alert webhook -----------------------------------------


def test_litellm_entrypoint_exports_the_secrets_and_execs(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "upstream_api_key").write_text("up-key\n")
    (secrets / "litellm_master_key").write_text("sk-master")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "litellm").write_text(
        '#!/bin/sh\necho "args=$*"\necho "up=$UPSTREAM_API_KEY master=$LITELLM_MASTER_KEY'
        ' costmap=$LITELLM_LOCAL_MODEL_COST_MAP"\n'
    )
    (fake / "litellm").chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "SECRETS_DIR": str(secrets),
        "UPSTREAM_BASE_URL": "https://api.example.com/v1",
        "UPSTREAM_MODEL": "openai/m",
        "UPSTREAM_API_KEY": "from-env-loses",
    }
    result = run("sh", str(d.LITELLM_ENTRYPOINT), env=env)
    assert result.returncode == 0, out(result)
    assert "args=--config /etc/litellm/config.yaml --host 0.0.0.0 --port 4000" in result.stdout
    assert "up=up-key master=sk-master costmap=True" in result.stdout
    # the mount point compose uses for the config is the one the script reads
    mounts = {m.target for m in d.bind_mounts(d.COMPOSE_FILE) if m.service == "gateway"}
    assert {"/etc/litellm/config.yaml", "/etc/litellm/entrypoint.sh"} <= mounts
    # a missing setting stops it with exit 2 and names the variable
    (secrets / "upstream_api_key").unlink()
    del env["UPSTREAM_API_KEY"]
    result = run("sh", str(d.LITELLM_ENTRYPOINT), env=env)
    assert result.returncode == 2
    assert "UPSTREAM_API_KEY" in result.stderr


def test_litellm_config_reads_what_compose_provides() -> None:
    cfg = d.load_yaml(d.ROOT / "deploy" / "litellm.yaml")
    refs = {m.group(1) for v in d.strings(cfg) if (m := re.fullmatch(r"os\.environ/(\w+)", v))}
    assert refs == {"UPSTREAM_MODEL", "UPSTREAM_BASE_URL", "UPSTREAM_API_KEY", "LITELLM_MASTER_KEY"}
    gateway = SERVICES["gateway"]
    provided = set(gateway["environment"]) | {s.upper() for s in gateway["secrets"]}
    assert refs <= provided
    assert [m["model_name"] for m in cfg["model_list"]] == ["cloud"]
    soak = d.load_yaml(d.SOAKD_COMPOSE_CONFIG)
    assert next(t for t in soak["targets"] if t["name"] == "gateway")["model"] == "cloud"
    assert cfg["litellm_settings"]["num_retries"] == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_alert_webhook_prints_one_line_per_alert() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(d.ALERT_WEBHOOK), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "listening"
        payload = {
            "receiver": "page",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "TargetOOM",
                        "severity": "page",
                        "target": "vllm",
                        "node": "edge-1",
                        "site": "lab-1",
                    },
                    "annotations": {"summary": "vllm ran out of memory on edge-1 (lab-1)"},
                    "startsAt": "2026-01-01T00:00:00Z",
                },
                {
                    "status": "firing",
                    "labels": {"alertname": "VramLeak", "severity": "warn"},
                    "annotations": {},
                },
            ],
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/alerts",
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        deadline = time.monotonic() + 5
        with urllib.request.urlopen(req, timeout=deadline - time.monotonic()) as resp:
            assert resp.status == 200
        first, second = json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())
        assert first["alertname"] == "TargetOOM"
        assert (first["node"], first["site"]) == ("edge-1", "lab-1")
        assert first["target"] == "vllm"
        assert first["receiver"] == "page"
        assert second["alertname"] == "VramLeak"
        assert second["severity"] == "warn"
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
