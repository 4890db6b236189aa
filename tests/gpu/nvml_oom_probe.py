"""GPU machine check: soakd's NVML probe follows a real CUDA process up to a real CUDA OOM.

Needs an NVIDIA GPU, torch, nvidia-ml-py and soakd (with its own dependencies); run it
from the repository root:

    python tests/gpu/nvml_oom_probe.py [--gpu 0] [--step-gib 8] [--step-s 0.5]

A child process opens a CUDA context, allocates ``--step-gib`` every ``--step-s``
seconds until torch raises a real CUDA out-of-memory error, prints it to its log,
holds its memory two seconds and exits. Alongside, soakd's probes run exactly as in a
soak (``make_probes`` with ``gpu.source: nvml``, the child mapped to a target by its
PID, its log as the target's ``oom_log``), and once a second this prints what soakd
exports next to what ``nvidia-smi`` says: device VRAM, the child's VRAM, the peak, the
leak slope and the OOM events. Exit status 0 when they agree:

- soakd's peak device VRAM and the child's peak VRAM within 2 % (or 64 MiB) of the
  largest nvidia-smi showed;
- the leak slope while allocating within 35 % of the child's allocation rate;
- OOM events: ``log`` 1 (the CUDA OOM line), ``process_vanished`` 1 (the child exited).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20


# --- the CUDA child (imports only torch) ----------------------------------------------------


def child(step_gib: float, step_s: float) -> int:
    import torch

    torch.empty(1, device="cuda")  # the CUDA context
    print(f"child {os.getpid()}: CUDA context up on {torch.cuda.get_device_name()}", flush=True)
    time.sleep(2 * step_s)  # a flat start, so the slope has a baseline
    blocks = []
    oom_error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    try:
        while True:
            blocks.append(torch.empty(int(step_gib * GIB), dtype=torch.uint8, device="cuda"))
            print(f"child: holding {len(blocks) * step_gib:g} GiB", flush=True)
            time.sleep(step_s)
    except oom_error as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        time.sleep(2.0)  # hold the memory, so every sampler sees the peak
        return 3


# --- the parent: soakd's probes and nvidia-smi ---------------------------------------------------


def smi(gpu: int, pid: int) -> tuple[float | None, float | None]:
    """(device MiB used, the child's MiB) from nvidia-smi; None where it did not say."""
    used = proc = None
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "-i",
                str(gpu),
                "--query-gpu=memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        used = float(out.splitlines()[0]) if out else None
        apps = subprocess.run(
            [
                "nvidia-smi",
                "-i",
                str(gpu),
                "--query-compute-apps=pid,used_memory",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        for line in apps.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
                proc = float(parts[1])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    return used, proc


async def parent(args: argparse.Namespace) -> int:
    import asyncio

    from prometheus_client import CollectorRegistry

    from soakd.config import config_from_dict
    from soakd.logs import setup_logging
    from soakd.metrics.run import ProbeMetrics
    from soakd.model import Sample
    from soakd.probes import make_probes

    setup_logging("info", "console")
    workdir = Path(tempfile.mkdtemp(prefix="soakd-gpu-"))
    log_path = workdir / "cuda-child.log"
    log_path.touch()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(args.gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    with log_path.open("ab") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child",
            "--step-gib",
            str(args.step_gib),
            "--step-s",
            str(args.step_s),
            stdout=log_file,
            stderr=log_file,
            env=env,
        )
    target = "cuda-child"
    cfg = config_from_dict(
        {
            "targets": [
                {
                    "name": target,
                    "base_url": "http://127.0.0.1:9",
                    "scrape": False,
                    "pid": proc.pid,
                    "oom_log": str(log_path),
                }
            ],
            "phases": [{"name": "p", "duration": "1h"}],
            "gpu": {"source": "nvml", "interval": args.interval, "leak_window": "60s"},
            "probes": {"health_interval": 0.5},
        }
    )
    reg = CollectorRegistry()
    samples: list[Sample] = []
    probes = make_probes(cfg, ProbeMetrics(reg), {target: "http://127.0.0.1:9"}, samples.append)
    task = asyncio.create_task(probes.run())
    g = str(args.gpu)

    def get(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    def mib(x: float | None) -> str:
        return "-" if x is None else f"{x / MIB:9.0f}"

    print(f"child pid {proc.pid}, log {log_path}")
    print(
        f"{'t_s':>5} {'soakd_used':>10} {'smi_used':>9} {'soakd_proc':>10} {'smi_proc':>9} "
        f"{'soakd_peak':>10} {'slope_GiB/h':>11} {'oom_log':>7} {'vanished':>8}"
    )
    start = time.monotonic()
    smi_used_max = smi_proc_max = 0.0
    slope_max = 0.0
    exited_at: float | None = None
    try:
        while True:
            await asyncio.sleep(1.0)
            t = time.monotonic() - start
            used_smi, proc_smi = await asyncio.to_thread(smi, args.gpu, proc.pid)
            smi_used_max = max(smi_used_max, used_smi or 0.0)
            smi_proc_max = max(smi_proc_max, proc_smi or 0.0)
            slope = get("soakd_gpu_memory_leak_slope_bytes_per_hour", gpu=g)
            if slope is not None and exited_at is None:
                slope_max = max(slope_max, slope)
            oom_log = get("soakd_target_oom_events_total", target=target, source="log")
            vanished = get(
                "soakd_target_oom_events_total", target=target, source="process_vanished"
            )
            print(
                f"{t:5.1f} {mib(get('soakd_gpu_memory_used_bytes', gpu=g)):>10} "
                f"{'-' if used_smi is None else f'{used_smi:9.0f}':>9} "
                f"{mib(get('soakd_gpu_process_memory_bytes', gpu=g, target=target)):>10} "
                f"{'-' if proc_smi is None else f'{proc_smi:9.0f}':>9} "
                f"{mib(get('soakd_gpu_memory_used_peak_bytes', gpu=g)):>10} "
                f"{'-' if slope is None else f'{slope / GIB:11.1f}':>11} "
                f"{oom_log or 0:7.0f} {vanished or 0:8.0f}",
                flush=True,
            )
            if proc.returncode is not None and exited_at is None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > 3.0:
                break
            if t > args.timeout:
                print("timed out waiting for the child's OOM")
                proc.kill()
                await proc.wait()
                return 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await probes.aclose()

    if not get("soakd_gpu_probe_up", source="nvml"):
        print("soakd's NVML probe saw no GPU here: nothing to compare")
        return 2
    peak_dev = (get("soakd_gpu_memory_used_peak_bytes", gpu=g) or 0.0) / MIB

    def proc_peak(who: str) -> float:
        values = [
            x.value
            for x in samples
            if x.name == "soakd_gpu_process_memory_bytes" and dict(x.labels).get("target") == who
        ]
        return max(values, default=0.0) / MIB

    peak_proc = proc_peak(target)
    if peak_proc == 0:
        print(
            f"the child's PID was never in NVML's list; processes of no target peaked at "
            f"{proc_peak('other'):.0f} MiB (a PID namespace hiding the real PID?)"
        )
    expected_slope = args.step_gib * GIB / args.step_s * 3600
    ooms = {
        src: get("soakd_target_oom_events_total", target=target, source=src) or 0.0
        for src in ("error_body", "restart_after_errors", "process_vanished", "log")
    }
    xids = {
        k: v
        for k, v in ((s.labels, s.value) for s in samples if s.name == "soakd_gpu_xid_errors_total")
    }
    child_log = log_path.read_text(errors="replace")
    print("\n--- child's log (tail)\n" + "\n".join(child_log.splitlines()[-4:]))
    print("\n--- summary")

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= max(64.0, 0.02 * max(a, b))

    checks = [
        (
            f"peak device VRAM: soakd {peak_dev:.0f} MiB, nvidia-smi max {smi_used_max:.0f} MiB",
            peak_dev > 0 and close(peak_dev, smi_used_max),
        ),
        (
            f"peak child VRAM: soakd {peak_proc:.0f} MiB, nvidia-smi max {smi_proc_max:.0f} MiB",
            peak_proc > 0 and close(peak_proc, smi_proc_max),
        ),
        (
            f"leak slope while allocating: soakd {slope_max / GIB:.0f} GiB/h, "
            f"allocation rate {expected_slope / GIB:.0f} GiB/h",
            abs(slope_max - expected_slope) <= 0.35 * expected_slope,
        ),
        (f"OOM events by source: {ooms}", ooms["log"] == 1 and ooms["process_vanished"] == 1),
        ("child hit a real CUDA OOM", "out of memory" in child_log.lower()),
    ]
    print(f"XID events seen: {xids or 'none'} (a CUDA OOM raises none)")
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0, help="NVML / PCI bus order index")
    ap.add_argument("--step-gib", type=float, default=8.0, help="allocated per step")
    ap.add_argument("--step-s", type=float, default=0.5, help="seconds between steps")
    ap.add_argument("--interval", type=float, default=0.25, help="soakd's gpu.interval")
    ap.add_argument("--timeout", type=float, default=240.0, help="give up after (s)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.step_gib, args.step_s)
    try:
        import soakd  # noqa: F401
    except ImportError:  # run from a checkout without installing soakd
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import asyncio

    return asyncio.run(parent(args))


if __name__ == "__main__":
    sys.exit(main())
