"""GPU-machine checks: collected only with SOAKD_GPU_TESTS=1 (they need an NVIDIA GPU and torch)."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("SOAKD_GPU_TESTS") == "1" else ["*.py"]
