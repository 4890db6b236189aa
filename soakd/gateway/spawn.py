"""Gateway room, spawn: runs ``soakd gateway`` as a child for targets with a ``gateway:`` section.

A separate process, like the simulator: the gateway is part of the measured path, and its
CPU must not show up as soakd's own latency. Its config is written to the run directory
(no secret in it), its admin token (random, for the per-phase modes) goes by environment,
and its log to ``gateway-<target>.log``.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import structlog
import yaml

from soakd.config import GatewayModes, GatewaySettings
from soakd.spawn import Child, free_port, spawn_soakd

log = structlog.get_logger()

TOKEN_ENV = "SOAKD_GATEWAY_ADMIN_TOKEN"  # noqa: S105 - the name of a variable, not a token


@dataclass
class GatewayProcess(Child):
    """A running ``soakd gateway`` in front of ``target``'s server."""

    target: str
    _token: str = field(repr=False)  # never in a repr, a log line or a traceback

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
    child = await spawn_soakd(
        ["gateway", "--config", str(cfg_path)],
        what=f"gateway for {target}",
        url=f"http://127.0.0.1:{port}",
        ready_path="/healthz",
        log_path=log_path,
        env=env,
        timeout_s=timeout_s,
    )
    gw = GatewayProcess(child.proc, child.url, target, token)
    log.info("gateway_started", target=target, url=gw.url, upstream=upstream, pid=gw.proc.pid)
    return gw
