"""The two in-process clients of bench/suite.py: the bare aiohttp loop and soakd's hot path.

    python bench/clients.py bare  --url http://127.0.0.1:8000 --concurrency 64 --requests 5000
    python bench/clients.py soakd --url http://127.0.0.1:8000 --concurrency 64 --requests 5000

``bare`` is the floor for a Python asyncio client: aiohttp, ``iter_any``, split lines,
``json.loads`` each data line, one ``perf_counter_ns`` per read, TTFT and every gap
kept. ``soakd`` is soakd's whole per-request path without the journal and the HTTP
exporter: Runner + OpenAITarget + SSEDecoder + Metrics (Prometheus) + RunStats, the last
two fed folds of the outcomes as the journal's writer feeds them (``Folding``).

Both run closed loop until ``--requests`` have finished (or ``--max-seconds``), and
write ``--out`` (JSON: counts, CPU, RSS) and, with ``--timings``, the per-request TTFT
and every inter-token gap as int64 ns arrays (``<out>.ttft``, ``<out>.itl``).
``--uvloop`` runs either on uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from soakd.measure.fold import Fold
    from soakd.model import Outcome

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_perf_ns = time.perf_counter_ns


class Applies(Protocol):
    def apply(self, f: Fold) -> None: ...


class Folding:
    """An outcome sink for ``Metrics`` and ``RunStats``, which take folds, not outcomes: in
    `soakd run` the journal's writer folds each batch once and hands the fold on after its
    commit (soakd/measure/fold.py). With no journal, this folds the outcomes here,
    ``batch`` at a time (the rest at ``flush``), and applies each fold to every sink."""

    def __init__(self, *sinks: Applies, batch: int = 256) -> None:
        from soakd.measure.fold import fold

        self._fold, self._sinks, self._batch = fold, sinks, batch
        self._pending: list[Outcome] = []

    def record(self, o: Outcome) -> None:
        self._pending.append(o)
        if len(self._pending) >= self._batch:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            f = self._fold(self._pending)
            self._pending = []
            for sink in self._sinks:
                sink.apply(f)


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def bare(
    url: str, n: int, conc: int, tokens: int, max_s: float, ttft: array[int], itl: array[int]
) -> dict[str, object]:
    import aiohttp

    body = json.dumps(
        {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "hello " * 20}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    state = {"done": 0, "tokens": 0, "errors": 0}
    deadline = time.monotonic() + max_s
    endpoint = url.rstrip("/") + "/v1/chat/completions"
    conn = aiohttp.TCPConnector(limit=conc)
    loads = json.loads
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            while state["done"] < n and time.monotonic() < deadline:
                state["done"] += 1  # claimed: never more than n sent
                t0 = _perf_ns()
                last = 0
                try:
                    async with session.post(
                        endpoint, data=body, headers={"Content-Type": "application/json"}
                    ) as resp:
                        buf = b""
                        async for chunk in resp.content.iter_any():
                            now = _perf_ns()
                            buf += chunk
                            *lines, buf = buf.split(b"\n")
                            for line in lines:
                                if line.startswith(b"data: ") and line[6:7] == b"{":
                                    obj = loads(line[6:])
                                    for ch in obj.get("choices") or ():
                                        if ch.get("delta", {}).get("content"):
                                            state["tokens"] += 1
                                            if last:
                                                itl.append(now - last)
                                            else:
                                                ttft.append(now - t0)
                                            last = now
                except aiohttp.ClientError:
                    state["errors"] += 1

        await asyncio.gather(*(worker() for _ in range(conc)))
    return {"requests": state["done"], "tokens": state["tokens"], "errors": state["errors"]}


async def bare_open(
    url: str,
    n: int,
    rate: float,
    mode: str,
    tokens: int,
    max_s: float,
    ttft: array[int],
    itl: array[int],
    lag: array[int],
) -> dict[str, object]:
    """The floor for an open loop: sleep until each planned instant (absolute, from one
    start), then start the request as a task; lag = actual minus planned send."""
    import random

    import aiohttp

    body = json.dumps(
        {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "hello " * 20}],
            "max_tokens": tokens,
            "stream": True,
        }
    ).encode()
    endpoint = url.rstrip("/") + "/v1/chat/completions"
    rng = random.Random(0)
    state = {"tokens": 0, "errors": 0}
    loads = json.loads
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            t0 = _perf_ns()
            last = 0
            try:
                async with session.post(
                    endpoint, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        now = _perf_ns()
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if line.startswith(b"data: ") and line[6:7] == b"{":
                                obj = loads(line[6:])
                                for ch in obj.get("choices") or ():
                                    if ch.get("delta", {}).get("content"):
                                        state["tokens"] += 1
                                        if last:
                                            itl.append(now - last)
                                        else:
                                            ttft.append(now - t0)
                                        last = now
            except aiohttp.ClientError:
                state["errors"] += 1

        tasks = set()
        start = _perf_ns()
        t = 0.0
        for k in range(n):
            t = t + rng.expovariate(rate) if mode == "poisson" else k / rate
            due = start + int(t * 1e9)
            delay = due - _perf_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            lag.append(max(0, _perf_ns() - due))
            task = asyncio.get_running_loop().create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if t > max_s:
                break
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    return {"requests": len(lag), "tokens": state["tokens"], "errors": state["errors"]}


async def soakd_hot(
    url: str, n: int, conc: int, tokens: int, max_s: float, ttft: array[int], itl: array[int]
) -> dict[str, object]:
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
    state = {"done": 0, "tokens": 0}
    runner: Runner

    class Timings:
        """Folds each outcome (the journal's part) and keeps its timings, ITL included:
        the one reader of the whole Outcome, as the journal is in a run."""

        def record(self, o: Outcome) -> None:
            folding.record(o)
            state["done"] += 1
            state["tokens"] += o.output_tokens or 0
            t = o.ttft_ns
            if t is not None:
                ttft.append(t)
            itl.extend(o.itl_ns)
            if state["done"] >= n:
                runner.stop()

    plan = Plan((Phase(0, "p", 0, int(max_s * 1e9), {"t": Closed(conc)}),))
    workload = Workload(max_tokens=tokens, prompts=Prompts(input_tokens=TokenLength(mean=20)))
    # the text is built where it is sent: this process's builder (soakd/workload/build.py)
    cfg = TargetConfig(name="t", base_url=url, model="tiny-llama")
    target = await open_target(cfg, builder=Builder(workload))
    folding = Folding(metrics, stats)
    runner = Runner(
        plan,
        {"t": target},
        make_prompt_source(workload),
        [],
        max_tokens=tokens,
        temperature=0.0,
        journal=Timings(),
    )
    await runner.run()
    await runner.drain(30)
    folding.flush()
    await target.aclose()
    total = stats.total["t"]
    return {
        "requests": total.requests,
        "tokens": state["tokens"],
        "errors": total.requests - total.ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", choices=["bare", "soakd"])
    ap.add_argument("--url", required=True, help="base URL (http://127.0.0.1:PORT)")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--timings", action="store_true")
    ap.add_argument("--rate", type=float, default=0, help="bare only: open loop at this req/s")
    ap.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    ap.add_argument("--uvloop", action="store_true")
    a = ap.parse_args()
    if not a.url.startswith(("http://127.", "http://localhost")):
        ap.error("bench clients only talk to loopback")
    fn = bare if a.mode == "bare" else soakd_hot
    ttft: array[int] = array("q")
    itl: array[int] = array("q")
    lag: array[int] = array("q")
    c0, t0 = cpu_s(), time.perf_counter()
    if a.rate and a.mode == "bare":
        coro = bare_open(
            a.url, a.requests, a.rate, a.arrival, a.tokens, a.max_seconds, ttft, itl, lag
        )
    else:
        coro = fn(a.url, a.requests, a.concurrency, a.tokens, a.max_seconds, ttft, itl)
    if a.uvloop:
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    result.update(
        cpu_s=cpu_s() - c0,
        wall_s=time.perf_counter() - t0,
        rss_mb=rss_mb(),
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    if a.out:
        a.out.write_text(json.dumps(result))
        if a.timings:
            with open(f"{a.out}.ttft", "wb") as f:
                ttft.tofile(f)
            with open(f"{a.out}.itl", "wb") as f:
                itl.tofile(f)
            if lag:
                with open(f"{a.out}.lag", "wb") as f:
                    lag.tofile(f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
