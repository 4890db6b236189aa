"""The `sim` compose stack on a real Docker engine: docker-compose.yml as shipped, with
only the Prometheus and Alertmanager images swapped for Debian-built stand-ins
(compose.standins.yml; the soakd image's Python base is stood in for by tag).

Run by `make test-docker` (scripts/test-docker.sh), which installs Debian's docker.io and
docker-compose, starts an engine when none runs and builds the stand-ins first. Grafana
is left out (no package to build a stand-in from). The stack is brought up once for the
module, in file order: healthy, scraped, paging, stopped and resumed, killed and resumed;
`down -v` at the end, pass or fail.

Figures (build and start-up times, stop time, page delay, resume proof) are written to
.cache/docker/figures.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

try:
    from tests import deploy as d
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import deploy as d

from soakd.config import parse_duration

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

PROJECT = "soakd-test"
STANDINS = Path(__file__).with_name("compose.standins.yml")
LOGDIR = d.ROOT / ".cache" / "docker"
FIGURES = LOGDIR / "figures.json"
CA_BUNDLE = Path(os.environ.get("SOAKD_BUILD_CA_FILE", "/etc/ssl/certs/ca-certificates.crt"))
SIM_PROFILE = "edge-4gb-surge"  # 3.67 GB idle, 3.92 GB with 4 running: VramAboveLimit
STACK = ["soakd-sim", "soakd-demo", "prometheus", "alertmanager", "alert-webhook"]
PUBLISHED = {"soakd-sim": 8000, "soakd-demo": 9464, "prometheus": 9090, "alertmanager": 9093}
COMPOSE = d.load_yaml(d.COMPOSE_FILE)
SERVICES = d.services(COMPOSE)
RUN_DIR = "/var/lib/soakd/runs/sim-soak-1"

T = TypeVar("T")


def docker_cli() -> list[str]:
    """$DOCKER, else Debian's CLI (20.10: BuildKit built in; a newer `docker` earlier on
    PATH needs the buildx plugin for `build --secret`), else `docker`."""
    if os.environ.get("DOCKER"):
        return shlex.split(os.environ["DOCKER"])
    return ["/usr/bin/docker"] if Path("/usr/bin/docker").exists() else ["docker"]


def sh(argv: list[str], *, timeout: float = 120, check: bool = True, **kw: Any) -> str:
    """Run a command; on failure the error shows its output (never a secret: none here)."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and result.returncode != 0:
        pytest.fail(
            f"{shlex.join(argv)} exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return str(result.stdout)


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy (its value is returned)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            last, value = exc, None
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(
        f"timed out after {timeout:.0f} s waiting for {what}" + (f" ({last})" if last else "")
    )


def get(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body.decode()


@dataclass
class Stack:
    """The running project: compose commands with the test's env file and override."""

    compose: d.ComposeCli
    env_file: Path
    env: dict[str, str]
    figures: dict[str, Any] = field(default_factory=dict)
    up_started: float = 0.0  # time.monotonic() when `up` was run

    def argv(self, *args: str) -> list[str]:
        return [
            *self.compose.argv,
            "--project-name",
            PROJECT,
            "--env-file",
            str(self.env_file),
            "-f",
            str(d.COMPOSE_FILE),
            "-f",
            str(STANDINS),
            "--profile",
            "sim",
            *args,
        ]

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return sh(self.argv(*args), timeout=timeout, check=check, env=self.env, cwd=d.ROOT)

    def container(self, service: str) -> str:
        ids = self.run("ps", "-q", service).split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        out = sh([*docker_cli(), "inspect", self.container(service)])
        return dict(json.loads(out)[0])

    def health(self, service: str) -> str | None:
        state = self.inspect(service)["State"]
        health = state.get("Health") or {}
        return str(health["Status"]) if "Status" in health else None

    def wait_healthy(self, service: str, timeout: float = 240) -> None:
        def healthy() -> bool:
            return self.health(service) == "healthy"

        wait_for(healthy, timeout, f"{service} healthy (its HEALTHCHECK)")

    def logs(self, service: str, timestamps: bool = False) -> str:
        flags = ["-t"] if timestamps else []
        out = subprocess.run(
            [*docker_cli(), "logs", *flags, self.container(service)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout + out.stderr

    def events(self, service: str) -> list[dict[str, Any]]:
        """soakd's JSON log lines from the container's log (every session)."""
        lines = []
        for line in self.logs(service).splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and "event" in obj:
                    lines.append(obj)
        return lines


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def requests_total(target: str = "vllm") -> float:
    """soakd's soakd_requests_total for one target, summed over its labels."""
    total = 0.0
    for line in get("http://127.0.0.1:9464/metrics").splitlines():
        if line.startswith("soakd_requests_total{") and f'target="{target}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def status() -> dict[str, Any]:
    return dict(json.loads(get("http://127.0.0.1:9464/status")))


def prom_query(query: str) -> list[dict[str, Any]]:
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
    body = json.loads(get(url))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def save_figures(figures: dict[str, Any]) -> None:
    LOGDIR.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


# --- compose renders both setups, with the CLI this machine has -------------------------


@pytest.fixture(scope="module")
def compose() -> d.ComposeCli:
    cli = d.compose_binary()
    if cli is None:
        pytest.fail("no docker-compose / docker compose: scripts/setup-docker.sh installs it")
    return cli


@pytest.mark.parametrize("profile", ["gpu", "sim"])
def test_compose_config_renders_each_profile(
    compose: d.ComposeCli, profile: str, tmp_path: Path
) -> None:
    """`config` of the shipped file with .env.example as .env, as a user runs it: with
    Debian's docker-compose 1.29 here (the test fails on an older or a missing CLI)."""
    (tmp_path / ".env").write_text(d.ENV_EXAMPLE.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    base = [*compose.argv, "--project-directory", str(d.ROOT), "--env-file", str(tmp_path / ".env")]
    base += ["-f", str(d.COMPOSE_FILE), "--profile", profile]
    rendered = sh([*base, "config"], env=env, cwd=d.ROOT)
    listed = sh([*base, "config", "--services"], env=env, cwd=d.ROOT)
    started = d.services_for_profiles(compose, rendered, listed, {profile})
    assert started == set(d.active(COMPOSE, {profile}))
    assert {"prometheus", "alertmanager", "grafana"} <= started
    assert ("vllm" in started) == (profile == "gpu")
    assert ("soakd-sim" in started) == (profile == "sim")
    config = yaml.safe_load(rendered)
    assert "name" not in config, "top-level name: is Compose v2 only (COMPOSE_PROJECT_NAME)"
    for name in config["secrets"].values():
        assert set(name) == {"file"}, "secrets come from files"


def test_build_ca_overlay_renders_with_compose_v2(compose: d.ComposeCli, tmp_path: Path) -> None:
    """The CA build secret (docker-compose.build-ca.yml) is a Compose v2 feature; v1
    users build with `docker build --secret` (docs/deployment.md)."""
    if compose.major < 2:
        pytest.skip(f"Compose {compose.version} has no build secrets (v2 renders the overlay)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    env.update(d.env_example(), SOAKD_BUILD_CA_FILE=str(CA_BUNDLE))
    out = sh(
        [
            *compose.argv,
            *("-f", str(d.COMPOSE_FILE), "-f", str(d.BUILD_CA_COMPOSE_FILE)),
            *("--profile", "sim", "config"),
        ],
        env=env,
        cwd=d.ROOT,
    )
    config = yaml.safe_load(out)
    assert config["secrets"]["ca"]["file"] == str(CA_BUNDLE)
    assert config["services"]["soakd-demo"]["build"]["secrets"][0]["source"] == "ca"


# --- the stack --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(compose: d.ComposeCli, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Build soakd's image from the Dockerfile, bring the sim profile up (Grafana left
    out), and always tear it down with `down -v` (logs kept in .cache/docker/)."""
    docker = docker_cli()
    info = subprocess.run([*docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.fail(f"no Docker engine ({shlex.join(docker)} info): {info.stderr.strip()[-500:]}")
    root = tmp_path_factory.mktemp("compose")
    secrets = root / "secrets"
    secrets.mkdir(mode=0o700)
    env_lines = {
        **d.env_example(),
        "COMPOSE_PROJECT_NAME": PROJECT,
        "BIND_ADDRESS": "127.0.0.1",
        "SOAKD_NODE": "edge-docker-test",
        "SIM_PROFILE": SIM_PROFILE,
        "SOAKD_RUN_NAME": "soak-1",
    }
    for name in ("upstream_api_key", "litellm_master_key", "grafana_admin_password"):
        (secrets / name).write_text("not-used-by-the-sim-profile")
        env_lines[f"{name.upper()}_FILE"] = str(secrets / name)
    env_lines.pop("COMPOSE_PROFILES", None)
    env_file = root / "test.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env_lines.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    st = Stack(compose, env_file, env)
    st.figures["compose"] = f"{shlex.join(compose.argv)} {compose.version}"
    st.run("down", "-v", "--remove-orphans", check=False)  # a previous run's leftovers

    busy = [f"127.0.0.1:{p}" for p in PUBLISHED.values() if port_in_use(p)]
    assert not busy, f"ports the stack publishes are taken on this machine: {busy}"

    assert CA_BUNDLE.is_file(), f"{CA_BUNDLE}: pip's CA bundle for the build (SOAKD_BUILD_CA_FILE)"
    t0 = time.monotonic()
    LOGDIR.mkdir(parents=True, exist_ok=True)
    with (LOGDIR / "build.log").open("w") as log:
        build = subprocess.run(
            [
                *docker,
                *("build", "--progress=plain", "--secret", f"id=ca,src={CA_BUNDLE}"),
                *("-t", "soakd:local", str(d.ROOT)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
            timeout=900,
        )
    if build.returncode != 0:
        tail = (LOGDIR / "build.log").read_text()[-3000:]
        pytest.fail(f"docker build of the Dockerfile failed:\n{tail}")
    st.figures["image_build_s"] = round(time.monotonic() - t0, 1)
    size = sh([*docker, "image", "inspect", "-f", "{{.Size}}", "soakd:local"]).strip()
    st.figures["image_size_mb"] = round(int(size) / 1e6)

    try:
        t0 = time.monotonic()
        st.up_started = t0
        st.run("up", "-d", "--no-build", *STACK, timeout=600)
        st.figures["up_returned_s"] = round(time.monotonic() - t0, 1)
        yield st
    finally:
        for service in STACK:  # pytest.fail's exception is no Exception: name it
            with contextlib.suppress(Exception, pytest.fail.Exception):
                (LOGDIR / f"{service}.log").write_text(st.logs(service, timestamps=True))
        st.run("down", "-v", "--remove-orphans", timeout=300, check=False)
        save_figures(st.figures)


def test_soakd_runs_as_uid_10001_on_a_read_only_root(stack: Stack) -> None:
    docker = docker_cli()
    for service in ("soakd-sim", "soakd-demo"):
        info = stack.inspect(service)
        assert info["Config"]["Image"] == "soakd:local"
        assert info["HostConfig"]["ReadonlyRootfs"] is True, service
        cid = info["Id"]
        wait_for(partial(stack_running, cid), 120, f"{service} running")
        assert sh([*docker, "exec", cid, "id", "-u"]).strip() == "10001", service
        write = subprocess.run(
            [*docker, "exec", cid, "touch", "/probe"], capture_output=True, text=True, timeout=60
        )
        assert write.returncode != 0
        assert "Read-only file system" in write.stderr, write.stderr
        ps = sh([*docker, "top", cid, "-eo", "pid,uid,args"])
        soakd_lines = [line for line in ps.splitlines() if "soakd" in line and "tini" not in line]
        assert soakd_lines
        assert all(line.split()[1] == "10001" for line in soakd_lines), ps


def stack_running(cid: str) -> bool:
    out = sh([*docker_cli(), "inspect", "-f", "{{.State.Running}}", cid], check=False)
    return out.strip() == "true"


def test_sim_and_demo_become_healthy_through_their_healthchecks(stack: Stack) -> None:
    t0 = stack.up_started
    for service in ("soakd-sim", "soakd-demo"):
        info = stack.inspect(service)
        assert info["Config"]["Healthcheck"]["Test"], f"{service}: no HEALTHCHECK"
        stack.wait_healthy(service)
        stack.figures[f"{service}_healthy_s"] = round(time.monotonic() - t0, 1)
    # the demo's HEALTHCHECK is the image's (Dockerfile), the sim's the compose file's
    demo = stack.inspect("soakd-demo")["Config"]["Healthcheck"]["Test"]
    assert "/healthz" in " ".join(demo)
    for service in ("prometheus", "alertmanager", "alert-webhook"):
        stack.wait_healthy(service)
    stack.figures["all_healthy_s"] = round(time.monotonic() - t0, 1)


def test_ports_are_published_on_bind_address_only(stack: Stack) -> None:
    project = sh(
        [*docker_cli(), "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"]
    ).split()
    assert len(project) == len(STACK)
    published: dict[str, set[int]] = {}
    for cid in project:
        info = json.loads(sh([*docker_cli(), "inspect", cid]))[0]
        service = info["Config"]["Labels"]["com.docker.compose.service"]
        for bindings in (info["NetworkSettings"]["Ports"] or {}).values():
            for binding in bindings or []:
                assert binding["HostIp"] == "127.0.0.1", f"{service}: {binding}"
                published.setdefault(service, set()).add(int(binding["HostPort"]))
        # the containers share the stack's own network and no other
        assert set(info["NetworkSettings"]["Networks"]) == {f"{PROJECT}_default"}, service
    assert published == {name: {port} for name, port in PUBLISHED.items()}


def test_prometheus_scrapes_soakd_by_service_name_and_loads_the_rules(stack: Stack) -> None:
    def soakd_up() -> bool:
        result = prom_query('up{job="soakd"}')
        return bool(result) and all(r["value"][1] == "1" for r in result)

    wait_for(soakd_up, 120, 'up{job="soakd"} == 1 in Prometheus')
    (series,) = prom_query('up{job="soakd"}')
    assert series["metric"]["instance"] == "soakd:9464"  # the service alias, not an IP
    assert series["metric"].get("node") is None  # external labels are not on queries
    assert prom_query('up{job="targets",target="vllm"}')[0]["value"][1] == "1"
    body = json.loads(get("http://127.0.0.1:9090/api/v1/rules"))
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert {r["health"] for r in rules} == {"ok"}
    names = {r["name"] for r in rules}
    assert {"VramAboveLimit", "TargetDown", "SoakdDown"} <= names
    files = {g["file"] for g in body["data"]["groups"]}
    assert {Path(f).name for f in files} == {
        p.name for p in (d.ROOT / "prometheus" / "rules").glob("*.yml")
    }
    am = json.loads(get("http://127.0.0.1:9090/api/v1/alertmanagers"))
    active = [a["url"] for a in am["data"]["activeAlertmanagers"]]
    assert active
    assert all("alertmanager:9093" in url for url in active)


def test_a_vram_page_reaches_the_webhook_through_alertmanager(stack: Stack) -> None:
    """edge-4gb-surge passes 3.9 GB with 4 running requests (from the steady phase on,
    a minute in): VramAboveLimit (the median of the last 10 s above the line, no `for`)
    -> Alertmanager (page: group_wait 5s) -> the alert-webhook container."""

    def page() -> tuple[str, dict[str, Any]] | None:
        for line in stack.logs("alert-webhook", timestamps=True).splitlines():
            stamp, _, text = line.partition(" ")
            with contextlib.suppress(ValueError):
                obj = json.loads(text)
                if obj.get("alertname") == "VramAboveLimit" and obj.get("status") == "firing":
                    return stamp, obj
        return None

    stamp, alert = wait_for(page, 420, "VramAboveLimit at the alert-webhook container")
    assert alert["severity"] == "page"
    assert alert["receiver"] == "page"
    assert alert["node"] == "edge-docker-test"  # the edge Prometheus's external labels
    assert alert["site"] == d.env_example()["SOAKD_SITE"]
    assert alert["summary"].endswith(f"on edge-docker-test ({alert['site']})")
    received = parse_rfc3339(stamp)
    starts = parse_rfc3339(alert["starts_at"])
    stack.figures["page_delay_after_firing_s"] = round(received - starts, 1)
    crossed_at = first_vram_crossing(received)
    stack.figures["page_delay_after_vram_first_crossed_s"] = round(received - crossed_at, 1)
    # the alert's activeAt: when the 10 s median first stood above the line (no `for`)
    (held,) = prom_query('ALERTS_FOR_STATE{alertname="VramAboveLimit"}')
    active_at = float(held["value"][1])
    stack.figures["page_delay_after_alert_active_s"] = round(received - active_at, 1)
    assert 4 <= received - active_at < 60  # Alertmanager's group_wait (5 s), give or take
    up_wall = time.time() - (time.monotonic() - stack.up_started)
    stack.figures["page_after_up_s"] = round(received - up_wall, 1)
    # group_wait 5s after it fired, with room for a loaded machine
    assert 0 <= received - starts < 60
    # after the first reading above the line: the median needs 6 of its 11 readings above
    # (about 5 s at 1 s scrapes), then evaluation and group_wait 5s
    assert 8 <= received - crossed_at < 90


def first_vram_crossing(until: float) -> float:
    """When Prometheus first saw soakd's VRAM reading above soakd's configured limit."""
    query = "max(soakd_gpu_memory_used_bytes) > max(soakd_vram_limit_bytes)"
    args = {"query": query, "start": until - 600, "end": until, "step": "1"}
    url = "http://127.0.0.1:9090/api/v1/query_range?" + urllib.parse.urlencode(args)
    body = json.loads(get(url))
    assert body["status"] == "success", body
    (series,) = body["data"]["result"]
    return float(series["values"][0][0])


def parse_rfc3339(stamp: str) -> float:
    """Docker's and Alertmanager's timestamps (nanosecond fractions) as Unix seconds."""
    from datetime import datetime

    match = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    assert match, stamp
    base, frac, zone = match.groups()
    zone = "+00:00" if zone == "Z" else zone
    seconds = datetime.fromisoformat(base + zone).timestamp()
    return seconds + (float("0." + frac) if frac else 0.0)


def session_events(stack: Stack) -> list[dict[str, Any]]:
    return [e for e in stack.events("soakd-demo") if e.get("event") == "run_resumed"]


def test_stop_drains_within_the_grace_period_and_start_resumes(stack: Stack) -> None:
    grace = parse_duration(SERVICES["soakd-demo"]["stop_grace_period"])
    run_id = status()["run_id"]
    before = wait_for(lambda: requests_total() or None, 120, "requests counted")
    t0 = time.monotonic()
    stack.run("stop", "soakd-demo", timeout=grace + 60)
    stop_s = time.monotonic() - t0
    state = stack.inspect("soakd-demo")["State"]
    assert state["ExitCode"] == 0, state
    assert not state["OOMKilled"]
    assert stop_s < grace, f"stop took {stop_s:.1f} s, stop_grace_period is {grace} s"
    stack.figures["stop_to_exit_s"] = round(stop_s, 1)
    stack.figures["stop_grace_period_s"] = grace

    summary = json.loads(
        sh(
            [
                *docker_cli(),
                *("run", "--rm", "--entrypoint", "cat"),
                *("-v", f"{PROJECT}_soakd-data:/var/lib/soakd:ro"),
                *("soakd:local", f"{RUN_DIR}/summary.json"),
            ]
        )
    )
    assert summary["run_id"] == run_id
    assert summary["completed"] is False
    assert summary["targets"]["vllm"]["requests"] >= 1

    stack.run("start", "soakd-demo")
    resumed = wait_for(lambda: status()["run_id"], 120, "soakd-demo answering /status")
    assert resumed == run_id
    sessions = wait_for(lambda: session_events(stack), 60, "run_resumed in soakd-demo's log")
    assert sessions[-1]["session"] == 2
    assert sessions[-1]["run_id"] == run_id
    after = [requests_total()]

    def progressed() -> bool:
        after.append(requests_total())
        return after[-1] > after[0]

    wait_for(progressed, 120, "requests counted after the resume")
    assert after[0] >= before, f"counter went back: {before} before stop, {after[0]} after"
    assert after == sorted(after), f"counter went back: {after}"
    stack.figures["resume_after_stop"] = {
        "run_id": run_id,
        "session": 2,
        "vllm_requests_before_stop": before,
        "vllm_requests_after_start": after[0],
        "vllm_requests_later": after[-1],
    }
    stack.wait_healthy("soakd-demo")


def test_start_after_sigkill_resumes_with_the_journal_intact(stack: Stack) -> None:
    run_id = status()["run_id"]
    cid = stack.container("soakd-demo")
    started = stack.inspect("soakd-demo")["State"]["StartedAt"]
    # what the journal holds for sure: a value more than its 1 s commit interval old
    mark, t_mark = requests_total(), time.monotonic()
    wait_for(lambda: time.monotonic() - t_mark > 2.0 and requests_total() > mark, 120, "progress")
    sh([*docker_cli(), "kill", "-s", "SIGKILL", cid])

    def killed() -> dict[str, Any] | None:
        state = dict(stack.inspect("soakd-demo")["State"])
        # stopped, or already restarted by Docker (restart: on-failure)
        return state if not state["Running"] or state["StartedAt"] != started else None

    state = wait_for(killed, 60, "soakd-demo killed")
    stack.figures["docker_restarted_it_after_sigkill"] = bool(state["Running"])
    if not state["Running"]:
        assert state["ExitCode"] == 137, state
    stack.run("start", "soakd-demo")
    wait_for(lambda: status()["run_id"] == run_id, 120, "soakd-demo answering after the kill")
    sessions = wait_for(
        lambda: [e for e in session_events(stack) if e["session"] == 3], 60, "session 3"
    )
    assert sessions[-1]["run_id"] == run_id
    assert not sessions[-1].get("not_restored"), sessions[-1]
    after = requests_total()
    assert after >= mark, f"journal lost committed requests: {mark} before the kill, {after} after"
    check = sh(
        [
            *docker_cli(),
            *("exec", stack.container("soakd-demo"), "python", "-c"),
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
            "print(c.execute('PRAGMA integrity_check').fetchone()[0]); "
            "print(c.execute('SELECT COUNT(*) FROM requests').fetchone()[0])",
            f"{RUN_DIR}/journal.db",
        ]
    ).split()
    assert check[0] == "ok", check
    stack.figures["resume_after_sigkill"] = {
        "run_id": run_id,
        "session": 3,
        "vllm_requests_committed_before_kill": mark,
        "vllm_requests_after_start": after,
        "journal_rows": int(check[1]),
    }
