"""Client overhead: soakd's CPU per request and per streamed token, against a bare aiohttp loop.

Both clients run in their own process against the same server (the embedded simulator,
``fast`` profile, in a third process), closed loop, same concurrency, same token count.
CPU is the client process's user+system time over the measured requests, net of a
warm-up; RSS is read from /proc at checkpoints. The ratio soakd/bare is the figure
to watch: the bare loop is the floor for a Python asyncio client.

    .venv/bin/python bench/overhead.py --requests 20000 --concurrency 16 --tokens 16
    .venv/bin/python bench/overhead.py --requests 100000 --only soakd   # RSS after 100k
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from soakd.model import Finished

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARMUP = 500


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _checkpoints(n: int) -> set[int]:
    """RSS is read at 10k, 100k, 1M and at every fifth of the run."""
    return {c for c in (10_000, 100_000, 1_000_000) if c <= n} | {n * i // 5 for i in range(1, 6)}


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def bare(url: str, n: int, conc: int, tokens: int) -> dict[str, object]:
    """The floor: aiohttp, iter_any, split lines, json.loads each data line."""
    import aiohttp

    body = json.dumps(
        {
            "model": "soakd-sim",
            "messages": [{"role": "user", "content": "hello " * 20}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    done = 0
    got_tokens = 0
    marks: dict[str, float] = {}
    start_cpu = 0.0
    checkpoints = _checkpoints(n)
    conn = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            nonlocal done, got_tokens, start_cpu
            while done < n + WARMUP:
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if line.startswith(b"data: ") and line[6:7] == b"{":
                                obj = json.loads(line[6:])
                                for ch in obj.get("choices") or ():
                                    if ch.get("delta", {}).get("content"):
                                        got_tokens += 1
                done += 1
                if done == WARMUP:
                    start_cpu = cpu_s()
                    got_tokens = 0
                if done - WARMUP in checkpoints:
                    marks[str(done - WARMUP)] = rss_mb()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    return {
        "cpu_s": cpu_s() - start_cpu,
        "requests": done - WARMUP,
        "tokens": got_tokens,
        "wall_s": wall,
        "rss_mb": marks,
        "rss_final_mb": rss_mb(),
    }


async def soakd_client(url: str, n: int, conc: int, tokens: int) -> dict[str, object]:
    """soakd's whole hot path: Runner + OpenAITarget + Metrics + RunStats (fed folds of the
    outcomes, as the journal's writer feeds them: bench/clients.py's Folding)."""
    from clients import Folding

    from soakd.config import Prompts, TargetConfig, TokenLength, Workload
    from soakd.metrics.run import Metrics
    from soakd.model import Phase, Plan
    from soakd.run.stats import RunStats
    from soakd.shapes import Closed
    from soakd.targets.openai import open_target
    from soakd.workload.build import Builder
    from soakd.workload.prompts import make_prompt_source
    from soakd.workload.runner import Runner

    metrics = Metrics()
    stats = RunStats(["t"])
    metrics.add_target("t", ["p"])
    state = {"done": 0, "tokens": 0, "start_cpu": 0.0}
    marks: dict[str, float] = {}
    checkpoints = _checkpoints(n)
    runner: Runner

    class Counter:
        def record(self, o: Finished) -> None:
            state["done"] += 1
            state["tokens"] += o.output_tokens or 0
            d = state["done"]
            if d == WARMUP:
                state["start_cpu"] = cpu_s()
                state["tokens"] = 0
            if d - WARMUP in checkpoints:
                marks[str(d - WARMUP)] = rss_mb()
            if d >= n + WARMUP:
                runner.stop()

    plan = Plan((Phase(0, "p", 0, 10**15, {"t": Closed(conc)}),))
    workload = Workload(max_tokens=tokens, prompts=Prompts(input_tokens=TokenLength(mean=20)))
    # the text is built where it is sent: this process's builder (soakd/workload/build.py)
    cfg = TargetConfig(name="t", base_url=url, model="soakd-sim")
    target = await open_target(cfg, builder=Builder(workload))
    folding = Folding(metrics, stats)
    runner = Runner(
        plan,
        {"t": target},
        make_prompt_source(workload),
        [Counter()],
        max_tokens=tokens,
        temperature=0.7,
        journal=folding,
    )
    t0 = time.perf_counter()
    await runner.run()
    await runner.drain(30)
    folding.flush()
    wall = time.perf_counter() - t0
    await target.aclose()
    errors = stats.total["t"].requests - stats.total["t"].ok
    return {
        "cpu_s": cpu_s() - state["start_cpu"],
        "requests": state["done"] - WARMUP,
        "tokens": state["tokens"],
        "wall_s": wall,
        "rss_mb": marks,
        "rss_final_mb": rss_mb(),
        "errors": errors,
    }


def child(mode: str, url: str, n: int, conc: int, tokens: int) -> None:
    fn = bare if mode == "bare" else soakd_client
    result = asyncio.run(fn(url, n, conc, tokens))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def start_sim(profile: str) -> tuple[subprocess.Popen[bytes], str]:
    from soakd.sim.spawn import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "soakd", "sim", "--port", str(port), "--profile", profile],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health").close()
        except OSError:
            time.sleep(0.1)
        else:
            return proc, f"http://127.0.0.1:{port}"
    proc.kill()
    raise SystemExit("simulator did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--profile", default="fast")
    ap.add_argument("--only", choices=["bare", "soakd"])
    ap.add_argument("--child", choices=["bare", "soakd"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.url, args.requests, args.concurrency, args.tokens)
        return
    sim, base = start_sim(args.profile)
    url = base + "/v1/chat/completions"
    results = {}
    try:
        for mode in [args.only] if args.only else ["bare", "soakd"]:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--url",
                    base if mode == "soakd" else url,
                    "--requests",
                    str(args.requests),
                    "--concurrency",
                    str(args.concurrency),
                    "--tokens",
                    str(args.tokens),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        sim.terminate()
        sim.wait()
    print(
        f"server: soakd sim --profile {args.profile}; {args.requests} requests after "
        f"{WARMUP} warm-up, concurrency {args.concurrency}, {args.tokens} tokens each; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    print(f"{'client':8} {'req/s':>8} {'CPU/req':>10} {'CPU/token':>10} {'peak RSS':>9}  RSS at")
    for mode, r in results.items():
        per_req = r["cpu_s"] / r["requests"] * 1e3
        per_tok = r["cpu_s"] / max(1, r["tokens"]) * 1e6
        print(
            f"{mode:8} {r['requests'] / r['wall_s']:8.0f} {per_req:8.3f}ms {per_tok:8.1f}us "
            f"{r['peak_rss_mb']:7.1f}MB  {r['rss_mb']}"
        )
    if len(results) == 2:
        b, s = results["bare"], results["soakd"]
        ratio_req = (s["cpu_s"] / s["requests"]) / (b["cpu_s"] / b["requests"])
        ratio_tok = (s["cpu_s"] / max(1, s["tokens"])) / (b["cpu_s"] / max(1, b["tokens"]))
        print(f"soakd / bare: {ratio_req:.2f}x CPU per request, {ratio_tok:.2f}x per token")
    if results.get("soakd", {}).get("errors"):
        print(f"soakd saw {results['soakd']['errors']} errors")


if __name__ == "__main__":
    main()
