"""Targets room, headers: what every request to a target carries, so that the run's client
and the /tokenize client (soakd/targets/tokenize.py) present soakd alike."""

from __future__ import annotations

from pydantic import SecretStr

from soakd import __version__
from soakd.config import TargetConfig


def target_headers(
    cfg: TargetConfig, key: SecretStr | None, accept: dict[str, str] | None = None
) -> dict[str, str]:
    """What every request to a target carries, in the order sent: who soakd is, what it
    accepts, the key (``api-key`` for Azure, else a bearer token), the OpenAI account
    headers, then the config's own ``headers`` (which win). The client and the
    calibration's /tokenize client both use it, so they present themselves alike."""
    headers = {"User-Agent": f"soakd/{__version__}", "Content-Type": "application/json"}
    headers.update(accept or {})
    if key is not None and cfg.kind == "azure":
        headers["api-key"] = key.get_secret_value()
    elif key is not None:
        headers["Authorization"] = f"Bearer {key.get_secret_value()}"
    if cfg.organization:
        headers["OpenAI-Organization"] = cfg.organization
    if cfg.project:
        headers["OpenAI-Project"] = cfg.project
    headers.update(cfg.headers)
    return headers
