"""Test fixture room: LiteLLM's proxy, a real gateway no one here wrote, as a child process.

Needs ``scripts/setup-litellm.sh`` (it makes ``.venv-litellm``). Missing, the tests that
need it skip locally and fail in CI (``CI`` set), so a CI box without it cannot pass green.
Its venv also holds the ``openai`` SDK, which the gateway tests use as an outside client.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.vllm_server import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SOAKD_LITELLM_VENV", ROOT / ".venv-litellm"))
LOG_DIR = ROOT / ".cache" / "logs"
HOST = "127.0.0.1"
SETUP_HINT = "run scripts/setup-litellm.sh first (it installs litellm[proxy] into .venv-litellm)"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def litellm_ready() -> bool:
    return (VENV / "bin" / "litellm").exists() and (VENV / "bin" / "python").exists()


def litellm_python() -> Path:
    """The LiteLLM venv's python; skips the test (fails it in CI) when it is not set up."""
    python = VENV / "bin" / "python"
    if not litellm_ready():
        message = f"no LiteLLM venv at {VENV}: {SETUP_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


class LiteLLM:
    """``litellm --config`` on a free loopback port; ``stop()`` ends its process group."""

    def __init__(self, models: Mapping[str, str], master_key: str, log_name: str) -> None:
        """``models``: the alias clients ask for -> the backend's ``/v1`` URL (each backend
        serves one model under that same name)."""
        litellm_python()
        self.port = free_port()
        self.master_key = master_key
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"litellm-{log_name}-{os.getpid()}-{self.port}.log"
        self.config_path = LOG_DIR / f"litellm-{log_name}-{os.getpid()}-{self.port}.yaml"
        config: dict[str, Any] = {
            "model_list": [
                {"model_name": alias, "litellm_params": {
                    "model": f"openai/{alias}", "api_base": api_base, "api_key": "dummy",
                    "max_retries": 0}}
                for alias, api_base in models.items()
            ],
            "litellm_settings": {"num_retries": 0, "request_timeout": 60},
            "general_settings": {"master_key": "os.environ/SOAKD_TEST_LITELLM_MASTER_KEY"},
        }  # fmt: skip
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 90.0) -> LiteLLM:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1",
                   SOAKD_TEST_LITELLM_MASTER_KEY=self.master_key, LITELLM_LOG="ERROR",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(VENV / "bin" / "litellm"), "--config", str(self.config_path),
                 "--host", HOST, "--port", str(self.port), "--num_workers", "1"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=LOG_DIR,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited ({self.proc.returncode}): {self.tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                _OPENER.open(self.base_url + "/health/liveliness", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"litellm not ready after {timeout:g} s: {self.tail()}")

    def warm_up(self, model: str) -> None:
        """One request on the OpenAI route and one on the Azure route: LiteLLM's first
        request of a route is slow (over a second: lazy set-up), and a soak measures the
        steady state."""
        body = json.dumps(
            {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "warm up"}]}
        ).encode()
        for path, header in (
            ("/v1/chat/completions", ("Authorization", f"Bearer {self.master_key}")),
            (f"/openai/deployments/{model}/chat/completions?api-version=2024-06-01",
             ("api-key", self.master_key)),
        ):  # fmt: skip
            request = urllib.request.Request(self.base_url + path, data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      header[0]: header[1]})  # fmt: skip
            with _OPENER.open(request, timeout=120) as resp:
                resp.read()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def upstream_failures(self) -> int:
        """The requests LiteLLM failed because its own call to the backend failed (its
        log's ``InternalServerError`` lines; with ``max_retries: 0`` each is one 500)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return 0
        return sum(
            "Exception occured" in ln and "InternalServerError" in ln for ln in text.splitlines()
        )

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def run_litellm(models: Mapping[str, str], master_key: str, log_name: str) -> Iterator[LiteLLM]:
    proxy = LiteLLM(models, master_key, log_name)
    try:
        yield proxy.start()
    finally:
        proxy.stop()
