"""``soakd capacity`` against a real vLLM (CPU, the tiny model): a sweep bounded to 150 s
finds a knee, judged by vLLM's own queue (``vllm:num_requests_waiting``), with its KV-cache
use read from its /metrics at every step. Run: pytest tests/integration/test_capacity_vllm.py
-m vllm -s (prints the curve)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from rich.console import Console

from soakd.capacity.result import curve_table, knee_text
from soakd.capacity.sweep import sweep
from soakd.config import config_from_dict
from tests.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]

BOUND_S = 150.0


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_bounded_sweep_finds_vllms_knee(vllm: VllmServer, tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "run": {"name": "cap-vllm"},
            "targets": [{"name": "vllm", "base_url": vllm.base_url, "model": vllm.model}],
            "workload": {
                "max_tokens": 16,
                "prompts": {"input_tokens": {"mean": 32}},
                "calibrate": "off",
            },
            "phases": [{"name": "p", "duration": "1m", "load": {"mode": "poisson", "rate": 1}}],
            "slo": {"e2e_p99": "5s", "error_ratio": 0.01},
            "capacity": {
                "start": 1,
                "min_step": "5s",
                "max_step": "12s",
                "max_time": f"{BOUND_S:g}s",
                "ceiling": 256,
            },
            "gpu": {"source": "none"},
        }
    )
    result = asyncio.run(sweep(cfg, tmp_path / "sweep", metrics_addr=_port()))
    knee = result.targets["vllm"]
    Console(width=160).print(curve_table(knee))
    print(knee_text(knee), f"sweep {result.seconds:.0f} s")
    assert result.seconds <= BOUND_S
    assert knee.knee is not None, knee
    assert knee.steps[0].passed  # 1 req/s is far below what it serves
    # vLLM's own queue judged every step, and its KV cache was read
    assert all(p.queue_source == "server" for p in knee.steps)
    assert all(p.kv_cache_max is not None for p in knee.steps)
    held = [p for p in knee.steps if p.passed]
    assert all(p.e2e_p99_ms is not None and p.e2e_p99_ms <= 5000 for p in held)
