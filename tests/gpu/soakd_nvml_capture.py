"""GPU machine: capture what a real ``soakd run`` exports with NVML, for the dashboard test.

Needs an NVIDIA GPU, torch, nvidia-ml-py and soakd (with its own dependencies); run it
from the repository root:

    python tests/gpu/soakd_nvml_capture.py [--out tests/data/soakd-nvml-metrics.txt]

A child process holds 1 GiB on the GPU (its command line carries a marker that the soak
config maps to the target with ``process_name``), and ``soakd run`` soaks the embedded
simulator for a minute with ``gpu.source: nvml`` and a 60 s leak window. Once soakd's
``/metrics`` shows the per-process memory, the leak slopes and 45 s of plan time, the page
is written to ``--out``; tests/integration/test_alerting_e2e.py replays it to a real
Prometheus and requires data in every GPU panel, the "NVML only" ones included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MARKER = "soakd_nvml_capture_gpu_holder"
HOLDER = (
    "import sys, time, torch\n"
    "x = torch.ones(1 << 30, dtype=torch.uint8, device='cuda')\n"
    "print('holding', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)
CONFIG = f"""
run: {{name: nvml-capture, drain_timeout: 5s}}
targets:
  - {{name: edge, simulator: fast, model: m, process_name: {MARKER}}}
workload: {{max_tokens: 32, prompts: {{input_tokens: {{mean: 32}}}}}}
phases:
  - {{name: warm, duration: 20s, load: {{mode: closed, concurrency: 2}}}}
  - {{name: steady, duration: 60s, load: {{mode: poisson, rate: 10}}}}
gpu: {{source: nvml, interval: 1s, leak_window: 60s}}
slo: {{vram_peak: 3.9GB}}
probes: {{scrape_interval: 1s, health_interval: 1s}}
"""
NEEDED = (
    'soakd_gpu_process_memory_bytes{gpu="0",target="edge"}',
    "soakd_gpu_memory_leak_slope_bytes_per_hour{",
    "soakd_gpu_process_memory_leak_slope_bytes_per_hour{",
    "soakd_gpu_throttle_active{",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/soakd-nvml-metrics.txt"))
    parser.add_argument("--port", type=int, default=19464)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        holder_py = Path(tmp) / f"{MARKER}.py"
        holder_py.write_text(HOLDER)
        holder = subprocess.Popen(
            [sys.executable, str(holder_py), "150"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "holding":
            print("the GPU holder did not start", file=sys.stderr)
            return 1
        config = Path(tmp) / "soak.yaml"
        config.write_text(CONFIG)
        soakd = subprocess.Popen(
            [sys.executable, "-m", "soakd", "run", str(config), "--no-live",
             "--metrics-addr", f"127.0.0.1:{args.port}", "--run-dir", str(Path(tmp) / "run")],
            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(1)
                try:
                    url = f"http://127.0.0.1:{args.port}/metrics"
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        text = resp.read().decode()
                except OSError:
                    continue
                elapsed = [
                    float(line.split()[-1])
                    for line in text.splitlines()
                    if line.startswith("soakd_run_elapsed_seconds ")
                ]
                if all(n in text for n in NEEDED) and elapsed and elapsed[0] >= 45:
                    args.out.write_text(text)
                    print(f"wrote {args.out}: {len(text.splitlines())} lines")
                    return 0
            print("soakd's /metrics never showed: " + ", ".join(NEEDED), file=sys.stderr)
            return 1
        finally:
            soakd.terminate()
            soakd.wait(30)
            holder.terminate()
            holder.wait(10)


if __name__ == "__main__":
    sys.exit(main())
