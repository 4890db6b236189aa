"""Runs the GPU-machine scripts as pytest tests (only with SOAKD_GPU_TESTS=1, see conftest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_nvml_probe_follows_a_real_cuda_oom() -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "nvml_oom_probe.py")], timeout=300, check=False
    )
    assert done.returncode == 0
