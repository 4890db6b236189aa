"""Past one core (issues 17, 28): `soakd run` with `run.workers` against the stub, next to
bare aiohttp loops, one per worker, on the same cores in the same run.

    .venv/bin/python bench/workers.py --out .cache/bench/results/workers  # all cases
    .venv/bin/python bench/workers.py --rounds 3 --seconds 12 --workers 8  # issue 28's table
    .venv/bin/python bench/workers.py --cases t16 --seconds 10 --workers 2

The stub (bench/stub.py, SO_REUSEPORT processes) runs on the first cores, the clients on
the rest (taskset). Cases, each a warm-up phase and a measured one:

- ``t16`` / ``t512``: closed loop, 16- and 512-token answers at TTFT 5 ms and ITL 1 ms,
  as many streams as it takes to saturate the client: streamed tokens/s and CPU per token
  of soakd's whole process tree (parent and workers) against N bare loops (one process
  each, the same streams in all). ``t16`` also runs ``workers: 1`` (today's soakd).
- ``poisson``: Poisson arrivals at ``--rate`` (5,000/s), 16-token answers: dispatch lag
  p99 and the achieved rate, from the journal.
- ``ttft``: 256 streams, TTFT 50 ms, ITL 5 ms: TTFT error (measured minus the stub's
  50 ms) of soakd against N bare loops.

soakd's figures are taken over the measured phase only (its /metrics and /proc sampled at
the phase's start and end: no start-up, no report); the bare loops run for the same
seconds and count their start-up (about 0.3 s of CPU each). ``--rounds N`` runs every case
N times, the rounds interleaved. At the end it prints issue 28's table: each figure, soakd
beside the bare loops, min / median / max over the rounds, the goal and whether the median
meets it; ``results.json`` in ``--out`` has every round.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from suite import (  # noqa: E402
    PY,
    SOAKD,
    Stub,
    _env,
    free_port,
    pinned,
    proc_table,
    split_per,
    tree_split,
    tree_usage,
)

MODEL = "tiny-llama"
WARMUP_S = 3.0


class Case(TypedDict):
    """One case of the plan: the stub's timing, the load, and which clients run it."""

    ttft: float  # the stub's, seconds
    itl: float
    tokens: int
    load: dict[str, Any]  # soakd's `load:` of the measured phase
    bare: bool  # the bare loops run it too
    w1: bool  # soakd with `workers: 1` too


def scrape_total(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
        or (name.endswith("}") and line.startswith(name))
    )


def measuring(port: int) -> bool:
    """The measured phase has begun (soakd_phase_active is set the moment it does)."""
    try:
        return scrape_total(port, 'soakd_phase_active{phase="measure"}') == 1
    except OSError:
        return False


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def soakd_case(
    work: Path,
    url: str,
    cpus: str,
    *,
    workers: int,
    load: dict[str, Any],
    tokens: int,
    seconds: float,
) -> dict[str, Any]:
    run_dir = work / f"soakd-w{workers}-{load['mode']}-{tokens}-{int(time.time())}"
    cfg = {
        "run": {"name": "bench", "drain_timeout": "10s", "workers": workers},
        "targets": [
            {
                "name": "stub",
                "base_url": url,
                "model": MODEL,
                "scrape": False,
                "max_connections": 4096,
            }
        ],
        "workload": {"max_tokens": tokens, "prompts": {"input_tokens": {"mean": 20}}},
        "phases": [
            {"name": "warmup", "duration": f"{WARMUP_S}s", "load": load},
            {"name": "measure", "duration": f"{seconds}s", "load": load},
        ],
    }
    path = work / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    argv = [
        *SOAKD,
        "run",
        str(path),
        "--no-live",
        "--metrics-addr",
        f"127.0.0.1:{port}",
        "--run-dir",
        str(run_dir),
    ]
    # env: PYTHONPATH is this checkout, whatever soakd the venv has installed
    proc = subprocess.Popen(
        pinned(argv, cpus), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
    )
    root = proc.pid
    try:
        deadline = time.monotonic() + 120
        while not measuring(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"soakd did not reach the measured phase ({run_dir})")
            time.sleep(0.02)
        t0 = time.monotonic()
        table = proc_table()
        cpu0, _, _ = tree_usage(root, table)
        parent0 = table[root][1]
        roles: dict[int, str] = {}
        split0 = tree_split(root, table, roles)
        peak_rss, peak_parent, n_procs = 0, 0, 0
        while time.monotonic() < t0 + seconds - 0.4:
            table = proc_table()
            _, rss, n_procs = tree_usage(root, table)
            peak_rss = max(peak_rss, rss)
            peak_parent = max(peak_parent, table.get(root, (0, 0.0, 0))[2])
            time.sleep(0.25)
        table = proc_table()
        cpu1, _, _ = tree_usage(root, table)
        split1 = tree_split(root, table, roles)
        window = time.monotonic() - t0
        cores_busy = (cpu1 - cpu0) / window  # over the sampled window
        parent_busy = (table[root][1] - parent0) / window
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    con = sqlite3.connect(run_dir / "journal.db")
    rows = con.execute(
        "SELECT lag_ns, ttft_ns, error, output_tokens FROM requests WHERE phase = 'measure'"
    ).fetchall()
    # the requests sent in the measured phase, from the journal's totals: they include the
    # rows a saturated journal could not keep (counted, not stored)
    tokens_done, requests_done = con.execute(
        "SELECT COALESCE(SUM(output_tokens), 0), COALESCE(SUM(requests), 0) FROM totals"
        " WHERE phase = 'measure'"
    ).fetchone()
    missed = (
        con.execute(
            "SELECT COALESCE(SUM(count), 0) FROM missed WHERE phase = 'measure'"
        ).fetchone()[0]
        if _has_table(con, "missed")
        else 0
    )
    con.close()
    lags = [r[0] / 1e6 for r in rows if r[0] is not None]
    ttfts = [r[1] / 1e6 for r in rows if r[1] is not None and r[2] is None]
    return {
        "tool": f"soakd w{workers}",
        "tokens_per_s": tokens_done / seconds,
        "cpu_us_per_token": cores_busy * seconds / tokens_done * 1e6 if tokens_done else None,
        "cores_busy": cores_busy,
        "parent_busy": parent_busy,
        "parent_cpu_us_per_request": parent_busy * seconds / requests_done * 1e6
        if requests_done
        else None,
        # CPU a request by process (and soakd's own by thread: its loop, the others)
        "cpu_us_per_request_by": split_per(split0, split1, requests_done * window / seconds, 1e6)
        if requests_done
        else None,
        "peak_rss_mb": peak_rss / 2**20,
        "parent_rss_mb": peak_parent / 2**20,
        "processes": n_procs,
        "sent": requests_done,
        "journal_rows": len(rows),
        "errors": sum(1 for r in rows if r[2] is not None),
        "missed": missed,
        "rate": requests_done / seconds,
        "lag_p50_ms": pct(lags, 0.5),
        "lag_p99_ms": pct(lags, 0.99),
        "ttft_ms": ttfts,
    }


def _has_table(con: sqlite3.Connection, name: str) -> bool:
    return (
        con.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        is not None
    )


def bare_case(
    work: Path,
    url: str,
    cpus: str,
    *,
    procs: int,
    streams: int,
    tokens: int,
    seconds: float,
) -> dict[str, Any]:
    outs = [work / f"bare-{tokens}-{streams}-{i}-{int(time.time())}.json" for i in range(procs)]
    children = [
        subprocess.Popen(
            pinned(
                [
                    PY,
                    str(ROOT / "bench" / "clients.py"),
                    "bare",
                    "--url",
                    url,
                    "--concurrency",
                    str(max(1, streams // procs)),
                    "--tokens",
                    str(tokens),
                    "--requests",
                    str(10**9),
                    "--max-seconds",
                    str(seconds + WARMUP_S),
                    "--out",
                    str(out),
                    "--timings",
                ],
                cpus,
            ),
            stdout=subprocess.DEVNULL,
        )
        for out in outs
    ]
    for child in children:
        child.wait(seconds + 120)
    docs = [json.loads(out.read_text()) for out in outs]
    ttft = array("q")
    for out in outs:
        ttft.frombytes(Path(f"{out}.ttft").read_bytes())
    skip = len(ttft) // 10  # the first answers include the connections' set-up
    tokens_done = sum(d["tokens"] for d in docs)
    wall = max(d["wall_s"] for d in docs)
    cpu = sum(d["cpu_s"] for d in docs)
    return {
        "tool": f"bare x{procs}",
        "tokens_per_s": tokens_done / wall,
        "cpu_us_per_token": cpu / tokens_done * 1e6 if tokens_done else None,
        "cores_busy": cpu / wall,
        "peak_rss_mb": sum(d["peak_rss_mb"] for d in docs),
        "errors": sum(d["errors"] for d in docs),
        "ttft_ms": [v / 1e6 for v in ttft[skip:]],
    }


def ttft_error(values_ms: list[float], truth_ms: float) -> dict[str, float]:
    errs = [v - truth_ms for v in values_ms]
    return {"mean": statistics.fmean(errs), "p50": pct(errs, 0.5), "p99": pct(errs, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench" / "results" / "workers")
    ap.add_argument("--cases", default="t16,t512,poisson,ttft")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--stub-cores", type=int, default=0, help="default: 3/8 of the cores")
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--streams", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=1, help="every case this many times")
    a = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    n_stub = a.stub_cores or max(1, len(cores) * 3 // 8)
    stub_cpus = ",".join(map(str, cores[:n_stub]))
    client_cpus = ",".join(map(str, cores[n_stub:]))
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work"
    work.mkdir(exist_ok=True)
    results: dict[str, Any] = {
        "cores": len(cores),
        "stub_cores": n_stub,
        "workers": a.workers,
        "seconds": a.seconds,
        "rounds": a.rounds,
        "rate": a.rate,
        "command": " ".join(sys.argv),
        "load": [],
        "cases": {},
    }
    closed = {"mode": "closed", "concurrency": a.streams}
    plan = {
        "t16": Case(ttft=0.005, itl=0.001, tokens=16, load=closed, bare=True, w1=True),
        "t512": Case(ttft=0.005, itl=0.001, tokens=512, load=closed, bare=True, w1=False),
        "poisson": Case(
            ttft=0.010,
            itl=0.001,
            tokens=16,
            bare=False,
            w1=False,
            load={"mode": "poisson", "rate": a.rate},
        ),
        "ttft": Case(
            ttft=0.050,
            itl=0.005,
            tokens=16,
            bare=True,
            w1=True,
            load={"mode": "closed", "concurrency": 256},
        ),
    }
    for rnd, name in ((r, n) for r in range(a.rounds) for n in a.cases.split(",")):
        case = plan[name]
        results["load"].append(os.getloadavg()[0])
        stub = Stub(
            work,
            ttft=case["ttft"],
            itl=case["itl"],
            tokens=case["tokens"],
            workers=n_stub,
            cpus=stub_cpus,
        )
        rows: list[dict[str, Any]] = []
        try:
            runs = [a.workers] + ([1] if case["w1"] else [])
            rows.extend(
                soakd_case(
                    work,
                    stub.url,
                    client_cpus,
                    workers=w,
                    load=case["load"],
                    tokens=case["tokens"],
                    seconds=a.seconds,
                )
                for w in runs
            )
            if case["bare"]:
                streams = case["load"]["concurrency"]
                rows.append(
                    bare_case(
                        work,
                        stub.url,
                        client_cpus,
                        procs=a.workers,
                        streams=streams,
                        tokens=case["tokens"],
                        seconds=a.seconds,
                    )
                )
        finally:
            stub.stop()
        for row in rows:
            ttfts = row.pop("ttft_ms")
            if ttfts:
                row["ttft_error_ms"] = ttft_error(ttfts, case["ttft"] * 1e3)
            row["round"] = rnd
        results["cases"].setdefault(name, []).extend(rows)
        print(f"\n## {name}, round {rnd + 1} of {a.rounds}", flush=True)
        for row in rows:
            print(
                json.dumps(
                    {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
                )
            )
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n" + "\n".join(issue_table(results)))


def _rows(results: dict[str, Any], case: str, tool: str) -> list[dict[str, Any]]:
    return [r for r in results["cases"].get(case, []) if r["tool"] == tool]


def _spread(values: Sequence[float | None], fmt: str = "{:,.0f}") -> str:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return "-"
    if len(vals) == 1:
        return fmt.format(vals[0])
    mid = statistics.median(vals)
    return f"{fmt.format(mid)} ({fmt.format(vals[0])}-{fmt.format(vals[-1])})"


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _ratios(soakd: list[dict[str, Any]], bare: list[dict[str, Any]], key: str) -> list[float]:
    """soakd's figure over the bare loops', round by round."""
    by_round = {b["round"]: b for b in bare}
    out = []
    for r in soakd:
        b = by_round.get(r["round"])
        if b and r.get(key) and b.get(key):
            out.append(r[key] / b[key])
    return out


def issue_table(results: dict[str, Any]) -> list[str]:
    """Issue 28's table: each figure from this run, soakd beside the bare loops; medians over
    the rounds with (min-max); the goal, and whether the median meets it."""
    w = results["workers"]
    sk, bare = f"soakd w{w}", f"bare x{w}"
    lines = [
        f"### Issue 28's figures: {results['cores']} cores, {w} workers, "
        f"{results['rounds']} round(s) of {results['seconds']:g} s, load average "
        f"{min(results['load'], default=0):.1f}-{max(results['load'], default=0):.1f}",
        "",
        f"`{results.get('command', '')}`",
        "",
        "| figure | soakd | bare | goal | median meets it |",
        "|---|---:|---:|---|---|",
    ]

    def row(label: str, ours: str, theirs: str, goal: str, ok: bool | None) -> None:
        verdict = "-" if ok is None else ("yes" if ok else "**no**")
        lines.append(f"| {label} | {ours} | {theirs} | {goal} | {verdict} |")

    t16, b16 = _rows(results, "t16", sk), _rows(results, "t16", bare)
    if t16:
        tps = _median([r["tokens_per_s"] for r in t16])
        row(
            f"16-token answers, {w} workers: tokens/s",
            _spread([r["tokens_per_s"] for r in t16]),
            _spread([r["tokens_per_s"] for r in b16]),
            ">= 250,000",
            tps is not None and tps >= 250_000,
        )
        ratio = _ratios(t16, b16, "cpu_us_per_token")
        row(
            "CPU per token, 16-token answers (x bare, per round)",
            _spread([r["cpu_us_per_token"] for r in t16], "{:.1f} us")
            + " ("
            + _spread(ratio, "{:.2f}x")
            + ")",
            _spread([r["cpu_us_per_token"] for r in b16], "{:.1f} us"),
            "<= 1.3x",
            bool(ratio) and statistics.median(ratio) <= 1.3,
        )
        kept = [r["journal_rows"] / r["sent"] * 100 for r in t16 if r["sent"]]
        rate = _median([r["rate"] for r in t16])
        row(
            "rows journaled of requests sent, 16-token answers",
            _spread(kept, "{:.1f} %") + f" at {_spread([r['rate'] for r in t16])} req/s",
            "",
            "100 % up to 15k req/s",
            None if rate is None or rate > 15_000 else min(kept) == 100.0,
        )
        per = _median([r["parent_cpu_us_per_request"] for r in t16])
        row(
            "parent CPU: cores, us a request (16-token answers)",
            _spread([r["parent_busy"] for r in t16], "{:.2f}")
            + ", "
            + _spread([r["parent_cpu_us_per_request"] for r in t16], "{:.0f} us"),
            "",
            "< 0.6 cores at 10k req/s (< 60 us a request)",
            per is not None and per < 60,
        )
        tree = _ratios(t16, b16, "peak_rss_mb")
        parent = _median([r["parent_rss_mb"] for r in t16])
        row(
            f"RSS, {w} workers: whole tree / parent (MB)",
            _spread([r["peak_rss_mb"] for r in t16])
            + " / "
            + _spread([r["parent_rss_mb"] for r in t16])
            + " ("
            + _spread(tree, "{:.2f}x")
            + ")",
            _spread([r["peak_rss_mb"] for r in b16]),
            "tree <= 1.2x bare, parent < 100 MB",
            bool(tree) and statistics.median(tree) <= 1.2 and parent is not None and parent < 100,
        )
    t512, b512 = _rows(results, "t512", sk), _rows(results, "t512", bare)
    if t512:
        ratio = _ratios(t512, b512, "cpu_us_per_token")
        row(
            "512-token answers: tokens/s (CPU per token x bare)",
            _spread([r["tokens_per_s"] for r in t512]) + " (" + _spread(ratio, "{:.2f}x") + ")",
            _spread([r["tokens_per_s"] for r in b512]),
            "CPU per token <= 1.3x bare",
            bool(ratio) and statistics.median(ratio) <= 1.3,
        )
    poisson = _rows(results, "poisson", sk)
    if poisson:
        target = results.get("rate", 5000.0)
        rates_ok = all(abs(r["rate"] - target) <= 0.01 * target for r in poisson)
        lag_ok = all(r["lag_p99_ms"] < 2 for r in poisson)
        row(
            f"Poisson {target:,.0f} req/s: rate, lag p99 (every round)",
            _spread([r["rate"] for r in poisson], "{:,.1f}")
            + "/s, "
            + ", ".join(f"{r['lag_p99_ms']:.2f}" for r in poisson)
            + " ms",
            "",
            "rate within 1 %, lag p99 < 2 ms in every run",
            rates_ok and lag_ok,
        )
    ttft, bttft = _rows(results, "ttft", sk), _rows(results, "ttft", bare)
    if ttft:
        ours = _median([r["ttft_error_ms"]["p99"] for r in ttft])
        theirs = _median([r["ttft_error_ms"]["p99"] for r in bttft])
        row(
            "TTFT error at 256 streams, p99 (ms)",
            _spread([r["ttft_error_ms"]["p99"] for r in ttft], "{:.2f}"),
            _spread([r["ttft_error_ms"]["p99"] for r in bttft], "{:.2f}"),
            "<= bare",
            None if ours is None or theirs is None else ours <= theirs,
        )
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
