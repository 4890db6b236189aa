"""GPU machine driver: soakd soaks a real vLLM on an H200 held to a 4 GB edge card's budget.

A Llama-shaped ~1.1B-parameter model (random weights: ``--load-format dummy``, so no
weight files are needed) is served by vLLM with ``--gpu-memory-utilization 0.028``
(3.9 GiB of the H200: what a 4 GB card leaves), and soakd drives it at concurrency
1, 8, 32, 64 and 128, past what the KV cache holds. Once every 5 s this prints what
soakd exports: device and per-process VRAM (NVML), the server's running / waiting
queue, KV-cache usage and preemptions (scraped from vLLM's /metrics), and soakd's own
token count; at the end, soakd's tokens against vLLM's ``vllm:generation_tokens_total``.

    python tests/gpu/vllm_h200_soak.py --tokenizer DIR --out DIR [--step-s 40]

Needs vLLM importable (see the team's notes on bringing it to the GPU machine), soakd
and its dependencies, and a tokenizer directory (tokenizer.json and friends; the tiny
model that scripts/setup-vllm.sh builds has one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

EDGE_1B = {  # TinyLlama-1.1B's shape with the tokenizer's vocabulary
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "use_cache": True,
}
STEPS = (1, 8, 32, 64, 128)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def active_phase(text: str) -> str:
    for family in text_string_to_metric_families(text):
        if family.name == "soakd_phase_active":
            for s in family.samples:
                if s.value == 1:
                    return str(s.labels["phase"])
    return "-"


def make_model(tokenizer: Path, out: Path) -> Path:
    model = out / "edge-1b"
    model.mkdir(parents=True, exist_ok=True)
    for f in tokenizer.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copy(f, model / f.name)
    vocab = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    (model / "config.json").write_text(json.dumps({**EDGE_1B, "vocab_size": vocab}, indent=1))
    return model


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode}")
        try:
            fetch(url + "/health")
            return time.monotonic() - start
        except OSError:
            time.sleep(1)
    raise SystemExit("vLLM not ready in time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--step-s", type=float, default=40.0)
    ap.add_argument("--port", type=int, default=18000)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = make_model(args.tokenizer, args.out)
    base = f"http://127.0.0.1:{args.port}"
    vllm_log = (args.out / "vllm.log").open("wb")
    vllm = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            "edge-1b",
            "--load-format",
            "dummy",
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
            "--gpu-memory-utilization",
            "0.028",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "64",
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ],
        stdout=vllm_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ready = wait_ready(base, vllm, 400)
        print(f"vLLM ready in {ready:.0f} s (pid {vllm.pid})", flush=True)
        before = metric(fetch(base + "/metrics"), "vllm:generation_tokens_total")
        cfg = {
            "run": {"name": "h200-edge", "drain_timeout": "60s"},
            "targets": [
                {
                    "name": "vllm-edge",
                    "base_url": base,
                    "model": "edge-1b",
                    "pid": vllm.pid,
                    "timeouts": {"ttft": "120s", "total": "300s"},
                }
            ],
            "workload": {
                "max_tokens": 256,
                "seed": 1,
                "prompts": {
                    "input_tokens": {
                        "dist": "normal",
                        "mean": 300,
                        "stddev": 60,
                        "min": 64,
                        "max": 600,
                    }
                },
            },
            "phases": [
                {
                    "name": f"c{c}",
                    "duration": f"{args.step_s}s",
                    "load": {"mode": "closed", "concurrency": c},
                }
                for c in STEPS
            ],
            "gpu": {"source": "nvml", "interval": "1s"},
            "probes": {"scrape_interval": "2s", "health_interval": "2s"},
        }
        cfg_path = args.out / "soak.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        soak = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "soakd",
                "run",
                str(cfg_path),
                "--no-live",
                "--metrics-addr",
                "127.0.0.1:9464",
                "--run-dir",
                str(args.out / "run"),
            ],
            stdout=(args.out / "soakd.out").open("w"),
            stderr=(args.out / "soakd.err").open("w"),
        )
        print(
            f"{'t_s':>5} {'phase':>5} {'dev_MiB':>8} {'vllm_MiB':>8} {'running':>7} "
            f"{'waiting':>7} {'kv_%':>5} {'preempt':>7} {'tokens':>8} {'ok':>6} {'err':>4}",
            flush=True,
        )
        start = time.monotonic()
        text = ""
        while soak.poll() is None:
            time.sleep(5)
            try:
                text = fetch("http://127.0.0.1:9464/metrics")
            except OSError:
                continue
            phase = active_phase(text)
            ok = metric(text, "soakd_requests_total", outcome="ok")
            proc_mib = metric(text, "soakd_gpu_process_memory_bytes", target="vllm-edge") / 2**20
            print(
                f"{time.monotonic() - start:5.0f} {phase:>5} "
                f"{metric(text, 'soakd_gpu_memory_used_bytes') / 2**20:8.0f} "
                f"{proc_mib:8.0f} "
                f"{metric(text, 'soakd_server_requests_running'):7.0f} "
                f"{metric(text, 'soakd_server_requests_waiting'):7.0f} "
                f"{metric(text, 'soakd_server_kv_cache_usage_ratio') * 100:5.1f} "
                f"{metric(text, 'soakd_server_preemptions_total'):7.0f} "
                f"{metric(text, 'soakd_output_tokens_total'):8.0f} {ok:6.0f} "
                f"{metric(text, 'soakd_requests_total') - ok:4.0f}",
                flush=True,
            )
        after = metric(fetch(base + "/metrics"), "vllm:generation_tokens_total")
        summary = json.loads((args.out / "run" / "summary.json").read_text())
        tokens = sum(t["output_tokens"] for t in summary["targets"].values())
        print(
            f"\nsoakd exit {soak.returncode}; soakd output tokens {tokens}, "
            f"vLLM generation_tokens_total delta {after - before:.0f}: "
            f"{'EQUAL' if tokens == after - before else 'DIFFERENT'}"
        )
        print((args.out / "soakd.out").read_text()[-4000:])
        return 0 if soak.returncode == 0 and tokens == after - before else 1
    finally:
        os.killpg(vllm.pid, signal.SIGTERM)
        try:
            vllm.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(vllm.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
