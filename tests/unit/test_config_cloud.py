"""Config of cloud targets (kinds, spend caps, 429 handling), gateways and phase modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from soakd.config import (
    ConfigError,
    TargetConfig,
    config_from_dict,
    gateway_config_from_dict,
    load_gateway_config,
)


def cfg(target: dict[str, Any], **phase: Any) -> Any:
    return config_from_dict({
        "targets": [{"name": "cloud", "base_url": "https://x.example.com", **target}],
        "phases": [{"name": "p", "duration": "1m", **phase}],
    })  # fmt: skip


@pytest.mark.parametrize(
    ("target", "endpoint"),
    [
        ({"kind": "azure", "api_version": "2024-06-01", "model": "gpt-4o"},
         "https://x.example.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01"),
        ({"kind": "azure", "api_version": "2024-06-01", "deployment": "d1", "api": "completions",
          "base_url": "https://x.example.com/openai/"},
         "https://x.example.com/openai/deployments/d1/completions?api-version=2024-06-01"),
        ({"path": "/llm/v2/chat"}, "https://x.example.com/llm/v2/chat"),
        ({"base_url": "https://x.example.com/v1/"}, "https://x.example.com/v1/chat/completions"),
        ({}, "https://x.example.com/v1/chat/completions"),
    ],
)  # fmt: skip
def test_endpoints(target: dict[str, Any], endpoint: str) -> None:
    assert cfg(target).targets[0].endpoint == endpoint


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"kind": "azure"}, "targets[cloud]: kind 'azure' needs api_version"),
        ({"kind": "azure", "api_version": "1", "organization": "o"}, "not for kind 'azure'"),
        ({"api_version": "2024-06-01"}, "api_version and deployment are for kind 'azure'"),
        ({"kind": "gcp"}, "targets[cloud].kind"),
        ({"path": "no-slash"}, "targets[cloud].path"),
        ({"headers": {"api-key": "x"}}, "would put a secret in the config"),
        ({"spend": {"max_requests": 0}}, "targets[cloud].spend.max_requests"),
        ({"spend": {"max_dollars": 5}}, "unknown key"),
        ({"gateway": {"vram_breaker": {"lower_mark_bytes": "4GB"}}}, "lower_mark_bytes"),
    ],
)
def test_bad_cloud_targets(target: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        cfg(target)


def test_spend_and_rate_limit_defaults() -> None:
    t: TargetConfig = cfg({"spend": {"max_tokens_per_hour": 10_000}}).targets[0]
    assert t.spend.enabled
    assert t.spend.max_tokens_per_hour == 10_000
    assert t.rate_limit.honour_retry_after
    assert t.rate_limit.max_pause == 300
    assert not cfg({}).targets[0].spend.enabled


def test_phase_gateway_modes_need_a_gateway() -> None:
    ok = cfg({"gateway": {}}, gateway={"cloud": {"adaptive": True}})
    assert ok.phases[0].gateway["cloud"].adaptive is True
    assert ok.phases[0].gateway["cloud"].vram_breaker is None
    with pytest.raises(ConfigError, match="has no gateway"):
        cfg({}, gateway={"cloud": {"adaptive": True}})


def test_gateway_config_file_and_env(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "upstream: http://127.0.0.1:8000/\n"
        "listen: 0.0.0.0:9000\n"
        "vram_breaker: {limit_bytes: 3.9GB, hold: 5s}\n"
        "concurrency: {adaptive: true, limit: 8, target_p95: 500ms}\n"
        "gpu: {source: dcgm}\n"
    )
    gw = load_gateway_config(
        path, {"SOAKD_GATEWAY__VRAM_BREAKER__HOLD": "2s", "SOAKD__IGNORED": "x"}
    )
    assert gw.upstream == "http://127.0.0.1:8000"
    assert (gw.host, gw.port) == ("0.0.0.0", 9000)
    assert gw.vram_breaker.limit_bytes == 3.9e9
    assert gw.vram_breaker.hold == 2.0
    assert gw.concurrency.target_p95 == 0.5
    assert gw.limits.max_body_bytes == 8 << 20
    with pytest.raises(ConfigError, match="upstream: required"):
        gateway_config_from_dict({})
    with pytest.raises(ConfigError, match=r"concurrency\.queu: unknown key"):
        gateway_config_from_dict({"upstream": "http://h", "concurrency": {"queu": 1}})
