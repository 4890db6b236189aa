"""Gateway room, spawn: runs ``soakd gateway`` as a child for targets with a ``gateway:`` section.

A separate process, like the simulator: the gateway is part of the measured path, and its
CPU must not show up as soakd's own latency. Its config is written to the run directory
(no secret in it), its admin token (random, for the per-phase modes) goes by environment,
and its log to ``gateway-<target>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
import yaml

from soakd.config import GatewayModes, GatewaySettings
from soakd.sim.spawn import _die_with_parent, free_port

log = structlog.get_logger()

TOKEN_ENV = "SOAKD_GATEWAY_ADMIN_TOKEN"  # noqa: S105 - the name of a variable, not a token


@dataclass
class GatewayProcess:
    proc: asyncio.subprocess.Process
    url: str
    target: str
    _token: str

    async def set_modes(self, modes: GatewayModes) -> dict[str, Any] | None:
        """Switch features (a phase's ``gateway:``); None (logged) when it did not answer."""
        body = modes.model_dump(exclude_none=True)
        try:
            async with (
                aiohttp.ClientSession(trust_env=False) as session,
                session.put(
                    f"{self.url}/gateway/modes",
                    json=body,
                    headers={"Authorization": f"Bearer {self._token}"},
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as resp,
            ):
                if resp.status == 200:
                    result: dict[str, Any] = await resp.json()
                    return result
                why = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = type(exc).__name__
        log.error("gateway_modes_failed", target=self.target, modes=body, reason=why)
        return None

    async def aclose(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def spawn_gateway(
    target: str,
    settings: GatewaySettings,
    upstream: str,
    run_dir: Path,
    timeout_s: float = 30.0,
) -> GatewayProcess:
    """Start ``soakd gateway`` in front of ``upstream`` on a free loopback port; wait for
    /healthz. Raises RuntimeError (with the log's tail) when it does not come up."""
    port = free_port()
    doc = settings.model_dump(mode="json") | {
        "upstream": upstream,
        "listen": f"127.0.0.1:{port}",
        "admin_token_env": TOKEN_ENV,
    }
    cfg_path = run_dir / f"gateway-{target}.yaml"
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    log_path = run_dir / f"gateway-{target}.log"
    token = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAKD_GATEWAY__")}
    env[TOKEN_ENV] = token
    with log_path.open("ab") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "soakd",
            "gateway",
            "--config",
            str(cfg_path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            preexec_fn=_die_with_parent,  # a SIGKILLed soakd leaves no gateway behind
        )
    gw = GatewayProcess(proc, f"http://127.0.0.1:{port}", target, token)
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(trust_env=False) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = log_path.read_text(errors="replace").strip()[-300:]
                raise RuntimeError(f"gateway for {target} exited ({proc.returncode}): {tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(gw.url + "/healthz") as resp:
                    if resp.status == 200:
                        log.info(
                            "gateway_started",
                            target=target,
                            url=gw.url,
                            upstream=upstream,
                            pid=proc.pid,
                        )
                        return gw
            await asyncio.sleep(0.1)
    await gw.aclose()
    raise RuntimeError(f"gateway for {target} did not answer on {gw.url} within {timeout_s:g} s")
