"""Secrets: the API key never appears in any output of a run, whatever the target does with
it (echoes it in errors, headers, redirects, tokens); the exporter binds 127.0.0.1 by
default, and basic auth and TLS guard it when asked."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.sim.spawn import free_port
from tests.faults.conftest import KEY, ROOT, figure, http_get, start_soakd, write_config
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEY_ENV = "SOAKD_FAULT_KEY"
FILE_KEY = "sk-file-" + KEY[::-1][:40]  # a second key, read from a file
WINDOW = 12


def leaks(blob: bytes, key: str) -> list[str]:
    """The key, or any WINDOW consecutive characters of it, in ``blob`` (raw or escaped)."""
    found = []
    for variant in {key, json.dumps(key)[1:-1]}:
        raw = variant.encode()
        for i in range(len(raw) - WINDOW + 1):
            if raw[i : i + WINDOW] in blob:
                found.append(variant[i : i + WINDOW])
                break
    return found


MODES = [
    "ok",
    "echo_key",
    "redirect_key",
    "key_stream",
    "oom_key",
    "error_200",
    "error_in_stream",
    "truncated",
    "reset",
    "s429",
    "malformed",
    "garbage",
]


def secrets_config(hostile: HostileServer, key_file: Path) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {
            "name": m.replace("_", "-"),
            "base_url": hostile.url(m),
            "model": "m",
            "api_key_env": KEY_ENV,
            "timeouts": {"connect": "1s", "ttft": "1s", "total": "2s"},
            "headers": {"X-Auth-Token": KEY},
            # failing on purpose: the preflight's lines are logged (and searched), not fatal
            "expect_failure": m not in ("ok", "key_stream"),
        }  # a key put where it should not be
        for m in MODES
    ]
    targets += [
        {
            "name": "from-file",
            "expect_failure": True,
            "base_url": hostile.url("echo_key"),
            "model": "m",
            "api_key_file": str(key_file),
        },
        # TLS to a plain-HTTP port: the handshake fails inside aiohttp
        {
            "name": "tls",
            "expect_failure": True,
            "base_url": hostile.url("ok").replace("http:", "https:"),
            "model": "m",
            "api_key_env": KEY_ENV,
            "timeouts": {"connect": "1s"},
        },
        # nothing listens: connection errors carry the URL inside aiohttp
        {
            "name": "refused",
            "expect_failure": True,
            "base_url": f"http://127.0.0.1:{free_port()}/v1",
            "model": "m",
            "api_key_env": KEY_ENV,
            "timeouts": {"connect": "1s"},
        },
    ]
    return {
        "run": {"name": "secrets", "drain_timeout": "3s"},
        "targets": targets,
        "workload": {"max_tokens": 8},
        "gpu": {"source": "none"},
        "logging": {"level": "debug", "format": "json"},
        "phases": [
            {
                "name": "p",
                "duration": "5s",
                "load": {"mode": "poisson", "rate": 4, "max_in_flight": 2},
            }
        ],
    }


def test_the_key_appears_in_no_output(hostile: HostileServer, tmp_path: Path) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text(FILE_KEY + "\n")
    cfg_path = write_config(tmp_path / "secrets.yaml", secrets_config(hostile, key_file))
    run_dir = tmp_path / "run"
    port = free_port()
    proc = start_soakd(cfg_path, run_dir, port, env={KEY_ENV: KEY})
    outputs: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                for path in ("/metrics", "/status", "/healthz", "/readyz"):
                    status, body = http_get(f"http://127.0.0.1:{port}{path}", timeout=2)
                    outputs[f"GET {path} ({status})"] = body
            except OSError:
                continue
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    outputs["stdout"], outputs["stderr"] = out.encode(), err.encode()
    # the key was in play: the server got it on every request
    assert hostile.stats.keys >= {KEY, FILE_KEY}
    assert "GET /metrics (200)" in outputs
    assert "GET /status (200)" in outputs

    py = str(ROOT / ".venv" / "bin" / "python")
    for args in (
        ["report", str(run_dir)],
        ["report", str(run_dir), "--format", "html"],
        ["report", str(run_dir), "--format", "json"],
        ["report", str(run_dir), "--format", "text"],
        ["export", str(run_dir)],
        ["export", str(run_dir), "--format", "jsonl", "--itl"],
    ):
        done = subprocess.run(
            [py, "-m", "soakd", *args], capture_output=True, timeout=120, cwd=ROOT, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[" ".join(args[:1] + args[2:])] = done.stdout + done.stderr
    files = 0
    for path in sorted(run_dir.rglob("*")):
        if path.is_file():
            outputs[str(path.relative_to(tmp_path))] = path.read_bytes()
            files += 1
    assert (run_dir / "journal.db").exists()
    assert files >= 4

    found = {
        name: hit
        for name, blob in outputs.items()
        for hit in [leaks(blob, KEY) + leaks(blob, FILE_KEY)]
        if hit
    }
    assert not found, found
    figure("secrets.outputs_searched", len(outputs))
    figure("secrets.bytes_searched", sum(len(b) for b in outputs.values()))
    # and the outputs are not empty of what happened: errors were logged and exported
    assert b"http_auth" in outputs["GET /metrics (200)"]
    assert b"timeout_connect" in outputs["GET /metrics (200)"]  # the TLS one, stuck in handshake
    assert b"connect_refused" in outputs["GET /metrics (200)"]


# --- the exporter ----------------------------------------------------------------------------


def run_briefly(
    tmp_path: Path, exporter: dict[str, Any], port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    cfg = {
        "run": {"name": "exp", "drain_timeout": "1s"},
        "targets": [{"name": "sim", "simulator": "fast", "model": "m"}],
        "gpu": {"source": "none"},
        "exporter": {"listen": f"127.0.0.1:{port}", **exporter},
        "phases": [{"name": "p", "duration": "60s", "load": {"mode": "closed", "concurrency": 1}}],
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "soakd",
            "run",
            str(path),
            "--no-live",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def wait_up(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    while time.monotonic() < deadline:
        try:
            with opener.open(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never came up")


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_exporter_binds_loopback_by_default(tmp_path: Path) -> None:
    from soakd.config import Exporter

    assert Exporter().host == "127.0.0.1"
    port = free_port()
    proc = run_briefly(tmp_path, {}, port)
    try:
        wait_up(f"http://127.0.0.1:{port}")
        # another loopback address reaches the same machine, but nothing listens there
        with pytest.raises(OSError), socket.create_connection(("127.0.0.2", port), timeout=2):
            pass
    finally:
        _, err = stop(proc)
    assert "exporter_exposed" not in err


def test_exporter_basic_auth(tmp_path: Path) -> None:
    port = free_port()
    password = "pw-" + KEY[-20:]
    proc = run_briefly(
        tmp_path,
        {"basic_auth": {"username": "prom", "password_env": "EXP_PW"}},
        port,
        env={"EXP_PW": password},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base)  # /healthz is open: health checks carry no password
        good = "Basic " + base64.b64encode(f"prom:{password}".encode()).decode()
        bad = "Basic " + base64.b64encode(b"prom:wrong").decode()
        for path in ("/metrics", "/status"):
            assert http_get(base + path)[0] == 401
            assert http_get(base + path, Authorization=bad)[0] == 401
            assert http_get(base + path, Authorization="Basic !!!")[0] == 401
            assert http_get(base + path, Authorization="Bearer " + password)[0] == 401
            status, _ = http_get(base + path, Authorization=good)
            assert status == 200
        assert http_get(base + "/readyz")[0] in (200, 503)
    finally:
        out, err = stop(proc)
    assert password not in out + err
    assert proc.returncode == 0, err[-2000:]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tls")
    crt, key = where / "exp.crt", where / "exp.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return crt, key


def test_exporter_tls_and_auth(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    crt, key = cert
    pw_file = tmp_path / "pw"
    pw_file.write_text("s3cret-exporter\n")
    port = free_port()
    proc = run_briefly(
        tmp_path,
        {
            "tls": {"cert_file": str(crt), "key_file": str(key)},
            "basic_auth": {"username": "prom", "password_file": str(pw_file)},
        },
        port,
    )
    ctx = ssl.create_default_context(cafile=str(crt))
    base = f"https://127.0.0.1:{port}"
    try:
        wait_up(base, ctx)
        import urllib.request

        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        req = urllib.request.Request(
            base + "/metrics",
            headers={
                "Authorization": "Basic " + base64.b64encode(b"prom:s3cret-exporter").decode()
            },
        )
        with opener.open(req, timeout=5) as resp:
            assert resp.status == 200
            assert b"soakd_requests_total" in resp.read()
        # plain HTTP on the TLS port gets nothing useful
        with pytest.raises(OSError):
            http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    finally:
        _, err = stop(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "https://127.0.0.1" in err  # exporter_listening says where


def test_exporter_misconfig_is_one_line(tmp_path: Path) -> None:
    bad = [
        ({"basic_auth": {"username": "prom"}}, "exporter.basic_auth"),
        ({"basic_auth": {"username": "prom", "password_env": "NOPE_NOT_SET"}}, "NOPE_NOT_SET"),
        ({"basic_auth": {"username": "prom", "password_file": "/nonexistent"}}, "password_file"),
        (
            {"tls": {"cert_file": "/nonexistent.crt", "key_file": "/nonexistent.key"}},
            "exporter.tls",
        ),
    ]
    for exporter, named in bad:
        cfg = {
            "targets": [{"name": "a", "base_url": "http://127.0.0.1:9"}],
            "phases": [{"name": "p", "duration": "1s"}],
            "exporter": exporter,
        }
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        for command in ("check", "run"):
            done = subprocess.run(
                [sys.executable, "-m", "soakd", command, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
                env={**os.environ, "NOPE_NOT_SET": ""},
            )
            assert done.returncode == 2, (exporter, done.stderr)
            assert done.stderr.strip().count("\n") == 0, done.stderr
            assert named in done.stderr, (named, done.stderr)
