"""bench/suite.py's timing readers: each tool's per-request TTFT, ITL and dispatch lag, read
from its own output (soakd's journal, the clients' arrays, vLLM's, AIPerf's and GuideLLM's
result files), and the statistics over them: error against the stub's truth, arrivals."""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import statistics
from array import array
from pathlib import Path
from typing import Any

from suite_commands import SOAKD_RUNS, Case


def _arr(path: Path) -> list[int]:
    a = array("q")
    if path.exists():
        a.frombytes(path.read_bytes())
    return list(a)


def timings(case: Case, out: Path) -> dict[str, Any]:
    """{'ttft': [ns...], 'itl': [ns...], 'itl_kind': 'gap'|'request-mean', 'lag': [ns]|None,
    'reported': {...}} in the order the tool lists requests."""
    t: dict[str, Any] = {"ttft": [], "itl": [], "itl_kind": "gap", "lag": None, "reported": {}}
    if case.tool in ("bare", "soakd-hot"):
        t["ttft"] = _arr(out / "client.json.ttft")
        t["itl"] = _arr(out / "client.json.itl")
        if (out / "client.json.lag").exists():
            t["lag"] = _arr(out / "client.json.lag")
    elif case.tool in SOAKD_RUNS:
        db = out / "run" / "journal.db"
        if db.exists():
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            rows = con.execute(
                "SELECT ttft_ns, itl, lag_ns FROM requests WHERE error IS NULL ORDER BY id"
            ).fetchall()
            con.close()
            lag = []
            for ttft, blob, lag_ns in rows:
                if ttft is not None:
                    t["ttft"].append(ttft)
                if blob:
                    a = array("I")
                    a.frombytes(blob)
                    t["itl"].extend(g * 1000 + 500 for g in a)  # stored floor(us): mid-point
                if lag_ns is not None:
                    lag.append(lag_ns)
            t["lag"] = lag
        summary = out / "run" / "summary.json"
        if summary.exists():
            t["reported"] = json.loads(summary.read_text())["targets"].get("stub", {})
    elif case.tool == "vllm":
        p = out / "vllm.json"
        if p.exists():
            d = json.loads(p.read_text())
            t["ttft"] = [int(x * 1e9) for x in d.get("ttfts", []) if x]
            t["itl"] = [int(x * 1e9) for req in d.get("itls", []) for x in req]
            t["reported"] = {
                k: d.get(k)
                for k in (
                    "mean_ttft_ms",
                    "p99_ttft_ms",
                    "mean_itl_ms",
                    "p99_itl_ms",
                    "completed",
                    "failed",
                    "request_throughput",
                )
            }
    elif case.tool == "aiperf":
        p = out / "aiperf" / "profile_export.jsonl"
        if p.exists():
            lag = []
            for line in p.read_text().splitlines():
                rec = json.loads(line)
                m = rec.get("metrics", {})
                if "time_to_first_token" in m:
                    t["ttft"].append(int(m["time_to_first_token"]["value"] * 1e6))
                icl = m.get("inter_chunk_latency", {}).get("value")
                if icl:
                    t["itl"].extend(int(x * 1e6) for x in icl)
                md = rec.get("metadata", {})
                if "credit_issued_ns" in md and "request_start_ns" in md:
                    lag.append(md["request_start_ns"] - md["credit_issued_ns"])
            t["lag"] = lag
            t["lag_kind"] = "credit issued -> request start"
    elif case.tool == "guidellm":
        p = out / "guidellm.json"
        if p.exists():
            d = json.loads(p.read_text())
            lag = []
            t["itl_kind"] = "request-mean"
            for b in d.get("benchmarks", []):
                for r in b.get("requests", {}).get("successful", []):
                    tm = r.get("info", {}).get("timings", {})
                    start, first = tm.get("request_start"), tm.get("first_token_iteration")
                    last, k = tm.get("last_token_iteration"), tm.get("token_iterations") or 0
                    if start and first:
                        t["ttft"].append(int((first - start) * 1e9))
                    if first and last and k > 1:
                        t["itl"].append(int((last - first) / (k - 1) * 1e9))
                    if tm.get("targeted_start") and start:
                        lag.append(int((start - tm["targeted_start"]) * 1e9))
            t["lag"] = lag
            t["lag_kind"] = "targeted start -> request start"
    return t


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def error_stats(values_ns: list[int], truth_s: float, skip: float = 0.1) -> dict[str, Any]:
    """Reported minus truth, in ms, over the requests after the first ``skip`` fraction
    (connection set-up and warm-up are the same for everyone and not a timer error)."""
    vals = values_ns[int(len(values_ns) * skip) :]
    if not vals:
        return {"n": 0}
    err = [v / 1e6 - truth_s * 1e3 for v in vals]
    return {
        "n": len(err),
        "mean": statistics.fmean(err),
        "p50": pct(err, 0.5),
        "p99": pct(err, 0.99),
        "max": max(err),
    }


def arrival_stats(arr: list[int], target: float, mode: str) -> dict[str, Any]:
    if len(arr) < 3:
        return {"n": len(arr)}
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(arr)]
    span = (arr[-1] - arr[0]) / 1e9
    mean = statistics.fmean(gaps)
    return {
        "n": len(arr),
        "rate": (len(arr) - 1) / span,
        "target": target,
        "rate_err_pct": ((len(arr) - 1) / span / target - 1) * 100 if target else None,
        "cv": statistics.pstdev(gaps) / mean if mean else None,
        "gap_max_ms": max(gaps),
        "gap_p99_ms": pct(gaps, 0.99),
        "mode": mode,
    }
