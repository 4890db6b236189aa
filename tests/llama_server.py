"""Test fixture room: start and stop llama.cpp's ``llama-server`` (CPU) on the tiny GGUF.

Needs ``scripts/setup-llama-server.sh`` to have run (it builds the binary into
``.cache/llama-server/<version>/``, about 10 minutes on 2 cores the first time, then
reuses it). The model is written by ``tests/make_tiny_gguf.py``. Typical use::

    @pytest.fixture(scope="module")
    def llama():
        with start_llama_server(model_path) as server:
            yield server

It runs as ``llama-server -t 1 -np 4 --metrics`` on 127.0.0.1, in its own session
(process group) under a small Python watcher that kills the group when the test
process dies however it died (EOF on its stdin, as in tests/vllm_server.py), so
nothing outlives a test run. Logs go to ``.cache/logs/llama-server-*.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.vllm_server import HOST, _group_members, _http_get, free_port, sum_samples

ROOT = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = ROOT / "scripts" / "setup-llama-server.sh"
LOG_DIR = ROOT / ".cache" / "logs"
SERVED_MODEL_NAME = "tiny"
SETUP_HINT = (
    "run scripts/setup-llama-server.sh first (it builds llama-server from the "
    "llama-cpp-python sdist, about 10 min on 2 cores, once)"
)


def _default_version() -> str:
    """The llama-cpp-python version the setup script builds (one source of truth)."""
    text = SETUP_SCRIPT.read_text()
    match = re.search(r"LLAMA_CPP_PYTHON_VERSION:-([0-9][0-9A-Za-z.]*)", text)
    if match is None:
        raise RuntimeError(f"no default LLAMA_CPP_PYTHON_VERSION in {SETUP_SCRIPT}")
    return match.group(1)


VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION") or _default_version()

# Runs llama-server as a child in the same process group, plus a daemon thread that
# blocks on stdin (a pipe whose write end only the test process holds): EOF means the
# test process is gone, so the group is killed. SIGTERM reaches both (killpg); the
# watcher ignores it and exits with llama-server's code.
_BOOTSTRAP = """
import os, signal, subprocess, sys, threading
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)

def _default_signals():  # ignored signals stay ignored across exec: undo that
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)

child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, preexec_fn=_default_signals)

def _watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        return
    os.killpg(0, signal.SIGKILL)

threading.Thread(target=_watch_parent, name="soakd-parent-watch", daemon=True).start()
sys.exit(child.wait())
"""


class LlamaServerNotSetUp(RuntimeError):
    """The binary is missing: the fix is scripts/setup-llama-server.sh."""


class LlamaServerStartError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log tail."""


def binary_candidates() -> list[Path]:
    """Where the setup script leaves the binary: $SOAKD_LLAMA_SERVER, the repo's cache,
    then the machine-wide cache a previous clone filled."""
    found = []
    env = os.environ.get("SOAKD_LLAMA_SERVER")
    if env:
        found.append(Path(env))
    found.append(ROOT / ".cache" / "llama-server" / VERSION / "llama-server")
    shared = os.environ.get("SOAKD_LLAMA_CACHE")
    if shared:
        found.append(Path(shared) / f"llama-server-{VERSION}")
    found.append(Path("/var/cache/soakd") / f"llama-server-{VERSION}")
    found.append(Path.home() / ".cache" / "soakd" / f"llama-server-{VERSION}")
    return found


def check_setup() -> Path:
    """The llama-server binary, or LlamaServerNotSetUp naming where it was looked for."""
    candidates = binary_candidates()
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise LlamaServerNotSetUp(
        f"no llama-server {VERSION} binary (looked at {looked}): {SETUP_HINT}"
    )


class LlamaServer:
    """One llama-server on 127.0.0.1 serving ``model`` as ``tiny``. Not started until
    ``start()``; the port is fixed at construction (a free one if ``port`` is None)."""

    def __init__(
        self,
        model: Path,
        port: int | None = None,
        *,
        threads: int = 1,
        parallel: int = 4,
        ctx_size: int = 4096,
        timeout: float = 60.0,
        stop_timeout: float = 10.0,
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.binary = check_setup()
        if not Path(model).is_file():
            raise LlamaServerNotSetUp(f"no model at {model} (tests/make_tiny_gguf.py writes it)")
        self.model_path = Path(model)
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.threads = threads
        self.parallel = parallel
        self.ctx_size = ctx_size
        self.timeout = timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args)
        log_dir = Path(log_dir) if log_dir is not None else LOG_DIR
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = log_dir / f"llama-server-{stamp}-{os.getpid()}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.model = SERVED_MODEL_NAME
        self.ready_seconds: float | None = None
        self.starts = 0

    # --- addresses ---------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    @property
    def health_url(self) -> str:
        return self.base_url + "/health"

    # --- lifecycle ---------------------------------------------------------------------

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "-m", str(self.model_path),
            "--alias", self.model,
            "--host", HOST,
            "--port", str(self.port),
            "-t", str(self.threads),
            "-np", str(self.parallel),
            "-c", str(self.ctx_size),
            "--metrics",
            "--no-webui",
            *self.extra_args,
        ]  # fmt: skip

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> LlamaServer:
        """Launch and wait for /health and /v1/models. Raises LlamaServerStartError."""
        if self.is_running():
            raise RuntimeError(f"llama-server already running (pid {self.proc_pid})")
        for attempt in range(3):
            try:
                self._launch_and_wait()
            except LlamaServerStartError as exc:
                text = str(exc).lower()
                if self._auto_port and "bind" in text and attempt < 2:
                    self.port = free_port()  # someone took the port meanwhile
                    continue
                raise
            else:
                return self
        raise AssertionError("unreachable")

    @property
    def proc_pid(self) -> int | None:
        """pid of the watcher, which is also the process group id."""
        return self.proc.pid if self.proc is not None else None

    def _launch_and_wait(self) -> None:
        self.starts += 1
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n=== soakd test: start #{self.starts} on port {self.port} ===\n".encode())
            log.write((" ".join(self.command()) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, *self.command()],
                cwd=ROOT,
                stdin=subprocess.PIPE,  # never written; its EOF tells the watcher we died
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = t0 + self.timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                self._reap_group()
                raise LlamaServerStartError(
                    f"llama-server exited with code {code} during startup on port "
                    f"{self.port}; log {self.log_path}:\n{self.log_tail()}"
                )
            if self._ready():
                self.ready_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LlamaServerStartError(
                    f"llama-server not ready on {self.base_url} after {self.timeout:g} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            status, _ = _http_get(self.health_url)
            if status != 200:
                return False
            status, body = _http_get(self.api_url + "/models")
        except (OSError, urllib.error.URLError):
            return False
        if status != 200:
            return False
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
        return self.model in ids

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the group, SIGKILL what is left after ``grace`` seconds. Idempotent."""
        if self.proc is None:
            return None
        grace = self.stop_timeout if grace is None else grace
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.proc.poll()
            if not _group_members(pgid):
                break
            time.sleep(0.05)
        self._reap_group()
        return self.proc.returncode

    def _reap_group(self) -> None:
        assert self.proc is not None
        pgid = self.proc.pid
        for _ in range(100):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
            if self.proc.poll() is not None and not _group_members(pgid):
                if self.proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        self.proc.stdin.close()
                return
        raise RuntimeError(f"processes of group {pgid} survived SIGKILL: {_group_members(pgid)}")

    async def astart(self) -> LlamaServer:
        return await asyncio.to_thread(self.start)

    async def astop(self, grace: float | None = None) -> int | None:
        return await asyncio.to_thread(self.stop, grace)

    # --- inspection --------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def metrics_text(self) -> str:
        status, body = _http_get(self.metrics_url, timeout=5.0)
        if status != 200:
            raise RuntimeError(f"GET {self.metrics_url} -> {status}")
        return body.decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 if none)."""
        return sum_samples(self.metrics_text(), name, **labels)

    def __enter__(self) -> LlamaServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<LlamaServer {self.base_url} pid={self.proc_pid} {state}>"


@contextlib.contextmanager
def start_llama_server(
    model: Path, port: int | None = None, **kwargs: Any
) -> Iterator[LlamaServer]:
    """Start a LlamaServer (see its arguments), yield it ready, stop it on exit."""
    server = LlamaServer(model, port, **kwargs)
    try:
        server.start()
        yield server
    finally:
        server.stop()
