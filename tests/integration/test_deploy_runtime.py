"""The container's runtime, without Docker: the Dockerfile's install steps replayed in a
fresh venv, and the `sim` profile's services started from it as plain processes with
the compose file's commands, environment and health checks.

What differs from a container, and only that: the compose host names (soakd-sim) and
the in-container paths (/etc/soakd/soakd.yaml, /var/lib/soakd) are mapped to 127.0.0.1
ports and temporary directories; tini is not in front. The base Python is this
machine's 3.11 (the image's minor version).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from tests import deploy as d
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import deploy as d

from soakd.config import parse_duration

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPOSE = d.load_yaml(d.COMPOSE_FILE)
SERVICES = d.services(COMPOSE)
ENV = d.env_example()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dockerfile_run(stage_from: str, needle: str) -> str:
    """The RUN line of a stage (by its FROM ... AS name) that contains ``needle``."""
    ins = d.dockerfile_instructions()
    stage = next(i.stage for i in ins if i.keyword == "FROM" and i.args.endswith(stage_from))
    return next(i.args for i in ins if i.stage == stage and i.keyword == "RUN" and needle in i.args)


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv built the way the image is: the builder's `pip wheel` on the build context
    that .dockerignore lets through, then the runtime's offline `pip install`."""
    assert sys.version_info[:2] == (3, 11), "the image runs Python 3.11"
    root = tmp_path_factory.mktemp("image")
    context, wheels = root / "src", root / "wheels"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(d.ROOT / name, context / name)
    shutil.copytree(
        d.ROOT / "soakd", context / "soakd", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # the step is `RUN --mount=type=secret,id=ca <use the CA if given> && pip wheel ...`
    build = "pip wheel " + dockerfile_run("builder", "pip wheel").split("pip wheel ", 1)[1]
    assert build == "pip wheel --wheel-dir /wheels ."
    subprocess.run(
        [sys.executable, "-m", *shlex.split(build.replace("/wheels", str(wheels)))],
        cwd=context,
        check=True,
        capture_output=True,
        timeout=240,
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = dockerfile_run("runtime", "pip install")
    install = install.split(" pip install ", 1)[1].replace("/wheels", str(wheels))
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
    env.pop("PIP_FIND_LINKS", None)
    subprocess.run(
        f"{venv}/bin/pip install -q {install}",
        shell=True,
        check=True,
        env=env,
        capture_output=True,
        timeout=240,
    )
    names = {
        line.split("==")[0].lower()
        for line in subprocess.run(
            [str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True, check=True
        ).stdout.split()
    }
    assert "soakd" in names
    assert not names & {"pytest", "ruff", "mypy", "hypothesis"}, "test extras in the image"
    return venv


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def healthcheck(service: str, port: int, python: Path, env: dict[str, str]) -> int:
    """Run a service's compose healthcheck command, its port mapped."""
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[0] == "CMD"
    argv = [str(python) if a in ("python", "python3") else a for a in test[1:]]
    argv = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in argv]
    return subprocess.run(argv, env=env, capture_output=True, timeout=10).returncode


def interpolated(command: list[str]) -> list[str]:
    return [d.interpolate(a, ENV) for a in command]


@contextlib.contextmanager
def process(
    argv: list[str], env: dict[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def ok_requests(metrics: str, target: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if (
            line.startswith("soakd_requests_total{")
            and f'target="{target}"' in line
            and 'outcome="ok"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_sim_profile_runs_from_the_image_environment(runtime_venv: Path, tmp_path: Path) -> None:
    bin_dir = runtime_venv / "bin"
    base_env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    state = tmp_path / "var-lib-soakd"  # the soakd-data volume, WORKDIR of the image
    state.mkdir()

    # soakd-sim: `soakd sim --host 0.0.0.0 --port 8000 --profile ${SIM_PROFILE} ...`
    sim_port = free_port()
    sim_cmd = interpolated(SERVICES["soakd-sim"]["command"])
    assert sim_cmd[:5] == ["sim", "--host", "0.0.0.0", "--port", "8000"]
    sim_argv = [
        str(bin_dir / "soakd"),
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(sim_port),
        *sim_cmd[5:],
    ]

    # soakd-demo: its command, environment, config mount and run dir
    demo = SERVICES["soakd-demo"]
    metrics_port = free_port()
    mounts = {
        m.target: m.source for m in d.bind_mounts(d.COMPOSE_FILE) if m.service == "soakd-demo"
    }
    replace = {
        "/etc/soakd/soakd.yaml": str(mounts["/etc/soakd/soakd.yaml"]),
        "0.0.0.0:9464": f"127.0.0.1:{metrics_port}",
    }
    demo_args = []
    for arg in interpolated(demo["command"]):
        arg = replace.get(arg, arg)
        if arg.startswith("/var/lib/soakd/"):
            arg = str(state / arg.removeprefix("/var/lib/soakd/"))
        demo_args.append(arg)
    run_dir = Path(demo_args[demo_args.index("--run-dir") + 1])
    demo_env = {
        **base_env,
        **{k: d.interpolate(v, ENV) for k, v in demo["environment"].items()},
        # the compose network's host name soakd-sim, mapped to the local port
        "SOAKD__TARGETS__VLLM__BASE_URL": f"http://127.0.0.1:{sim_port}",
        "SOAKD__GPU__DCGM_URL": f"http://127.0.0.1:{sim_port}/metrics",
    }
    demo_argv = [str(bin_dir / "soakd"), *demo_args]
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    grace = parse_duration(demo["stop_grace_period"])

    # alert-webhook: its entrypoint after tini, with its command
    hook = SERVICES["alert-webhook"]
    hook_port = free_port()
    assert hook["entrypoint"][:2] == ["tini", "--"]
    hook_argv = [str(bin_dir / "python") if a == "python" else a for a in hook["entrypoint"][2:]]
    hook_argv[-1] = str(d.ALERT_WEBHOOK)  # mounted at /opt/soakd/alert_webhook.py
    hook_argv += ["--host", "127.0.0.1", "--port", str(hook_port)]

    with (
        process(sim_argv, base_env, state, tmp_path / "sim.log") as sim,
        process(hook_argv, base_env, state, tmp_path / "hook.log") as hook_proc,
    ):
        wait_for(
            lambda: healthcheck("soakd-sim", sim_port, bin_dir / "python", base_env) == 0,
            30,
            "soakd-sim's compose healthcheck",
        )
        wait_for(
            lambda: healthcheck("alert-webhook", hook_port, bin_dir / "python", base_env) == 0,
            15,
            "alert-webhook's healthcheck",
        )

        # first session: healthy, metrics flow for both targets, SIGTERM drains, exit 0
        with process(demo_argv, demo_env, state, tmp_path / "demo-1.log") as proc:
            # the image's HEALTHCHECK command, as Docker would run it
            hc_env = {**base_env, "SOAKD_HEALTHZ_URL": f"{metrics_url}/healthz"}
            image_hc = next(
                i.args for i in d.dockerfile_instructions() if i.keyword == "HEALTHCHECK"
            )
            hc_argv = d.exec_form(image_hc.split(" CMD ", 1)[1])
            hc_argv[0] = str(bin_dir / hc_argv[0])
            wait_for(
                lambda: subprocess.run(hc_argv, env=hc_env, timeout=10).returncode == 0,
                30,
                "the image's HEALTHCHECK",
            )
            wait_for(
                lambda: (
                    ok_requests(get(f"{metrics_url}/metrics")[1], "vllm") > 0
                    and ok_requests(get(f"{metrics_url}/metrics")[1], "gateway") > 0
                ),
                40,
                "successful requests on both targets",
            )
            status = json.loads(get(f"{metrics_url}/status")[1])
            assert status["node"] == ENV["SOAKD_NODE"]
            assert 'node="' + ENV["SOAKD_NODE"] + '"' in get(f"{metrics_url}/metrics")[1]
            first_run_id = status["run_id"]
            proc.send_signal(signal.SIGTERM)  # docker stop
            assert proc.wait(grace) == 0, (tmp_path / "demo-1.log").read_text()[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["run_id"] == first_run_id
        assert not summary["completed"]

        # restart (restart policy, reboot, `docker compose start`): the run resumes
        with process(demo_argv, demo_env, state, tmp_path / "demo-2.log") as proc:
            wait_for(lambda: get(f"{metrics_url}/healthz")[0] == 200, 30, "/healthz again")
            assert json.loads(get(f"{metrics_url}/status")[1])["run_id"] == first_run_id
            # the exporter answers while the preflight runs: stop once the run has resumed
            wait_for(lambda: "run_resumed" in (run_dir / "soakd.log").read_text(), 30, "the resume")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(grace) == 0, (tmp_path / "demo-2.log").read_text()[-3000:]

        # `docker stop` of the other two: both go at once (soakd sim has no SIGTERM
        # handler and dies of the signal, which is all a stop needs from it)
        for p in (sim, hook_proc):
            p.send_signal(signal.SIGTERM)
        assert sim.wait(10) in (0, -signal.SIGTERM)
        assert hook_proc.wait(10) == 0
