"""bench/suite.py running one case: bench/stub.py in its own process (Stub), the client's
process tree sampled every 100 ms, and the case's figures (run_case)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import time
from array import array
from pathlib import Path
from typing import Any

from stub_stats import merge_stats, read_counter
from suite_commands import (
    MODEL,
    PY,
    ROOT,
    TOKENS,
    WORK,
    Case,
    _env,
    command,
    free_port,
    pinned,
)
from suite_procs import (
    _status_fields,
    proc_table,
    smaps_breakdown,
    split_per,
    thread_names,
    top_mappings,
    tree_split,
    tree_usage,
)
from suite_timings import arrival_stats, error_stats, pct, timings


class Stub:
    """bench/stub.py in its own process, with a live counter and lateness stats."""

    def __init__(
        self,
        workdir: Path,
        *,
        ttft: float,
        itl: float,
        tokens: int = TOKENS,
        workers: int = 1,
        arrivals: bool = False,
        cpus: str | None = None,
    ) -> None:
        self.dir = workdir / "stub"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.counter = str(self.dir / "counter")
        args = [
            PY,
            str(ROOT / "bench" / "stub.py"),
            "--port",
            str(self.port),
            "--ttft",
            str(ttft),
            "--itl",
            str(itl),
            "--tokens",
            str(tokens),
            "--model",
            MODEL,
            "--workers",
            str(workers),
            "--stats-dir",
            str(self.dir),
            "--counter-file",
            self.counter,
            "--nice",
            "-10",
        ]
        if arrivals:
            args.append("--arrivals")
        self.proc = subprocess.Popen(pinned(args, cpus), stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening" not in line:
            raise RuntimeError(f"stub did not start: {line!r}")
        self.url = f"http://127.0.0.1:{self.port}"

    def done(self) -> tuple[int, int]:
        try:
            return read_counter(self.counter)
        except (OSError, ValueError):
            return 0, 0

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        stats = sorted(str(p) for p in self.dir.glob("worker-*.json"))
        out = merge_stats(stats) if stats else {}
        arr = array("q")
        for p in sorted(self.dir.glob("worker-*.arrivals")):
            arr.frombytes(p.read_bytes())
        if arr:
            out["arrivals_ns"] = sorted(arr)
        return out


def _client_nice() -> None:
    """Every client runs at nice -5 (the stub at -10): on a shared machine this keeps other
    people's jobs from landing in the measured latencies. The same for every tool."""
    with contextlib.suppress(OSError):
        os.nice(-5)


def run_case(case: Case) -> dict[str, Any]:
    out = WORK / case.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    stub = Stub(
        out,
        ttft=case.ttft,
        itl=case.itl,
        tokens=case.tokens,
        arrivals=case.mode != "closed",
        workers=case.extra.get("stub_workers", 1),
        cpus=case.extra.get("stub_cpus"),
    )
    samples: list[tuple[float, float, int, int, float]] = []  # t, cpu, rss, done, stub cpu
    splits: list[dict[str, float]] = []  # the client's CPU by role, at each sample
    roles: dict[int, str] = {}
    rc: int | None = None
    at_peak: dict[str, Any] = {}  # the client's /proc status and smaps split at its peak RSS
    try:
        argv, stop_rule = command(case, stub.url, out)
        argv = pinned(argv, case.extra.get("client_cpus"))
        log = open(out / "tool.log", "wb")  # noqa: SIM115
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=out,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_client_nice,
        )
        stopped = False
        last_peek, peak, threads_max, root_peak = 0.0, 0, 0, 0
        while True:
            rc = proc.poll()
            now = time.monotonic()
            table = proc_table()
            cpu, rss, _ = tree_usage(proc.pid, table)
            root_peak = max(root_peak, table.get(proc.pid, (0, 0.0, 0))[2])
            scpu, _, _ = tree_usage(stub.proc.pid, table)
            done, _ = stub.done()
            if rc is None:
                samples.append((now - t0, cpu, rss, done, scpu))
                splits.append(tree_split(proc.pid, table, roles))
                if case.extra.get("peek") and now - last_peek >= 1.0:
                    last_peek = now
                    st = _status_fields(proc.pid)
                    threads_max = max(threads_max, int(st.get("threads", 0)))
                    if rss > peak:
                        peak = rss
                        at_peak = {
                            **st,
                            **{
                                f"smaps_{k}_mb" if k != "anon_maps" else k: v
                                for k, v in smaps_breakdown(proc.pid).items()
                            },
                            "top_maps": top_mappings(proc.pid),
                            "thread_names": thread_names(proc.pid),
                        }
            if rc is not None:
                break
            if stop_rule == "sigterm" and not stopped and done >= case.requests:
                proc.send_signal(signal.SIGTERM)
                stopped = True
            if now - t0 > case.timeout_s + 60:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = -9
                break
            time.sleep(0.1)
        wall = time.monotonic() - t0
        log.close()
    finally:
        stub_stats = stub.stop()
    done_total, tok_total = stub_stats.get("requests", 0), stub_stats.get("tokens", 0)
    res: dict[str, Any] = {
        "case": case.__dict__ | {"name": case.name},
        "rc": rc,
        "wall_s": wall,
        "stub": {k: v for k, v in stub_stats.items() if k != "arrivals_ns"},
        "answers": done_total,
        "tokens": tok_total,
    }
    if samples:
        final = max(s[3] for s in samples)
        lo_i = next((i for i, s in enumerate(samples) if s[3] >= 0.1 * final), -1)
        hi_i = next((i for i, s in enumerate(samples) if s[3] >= 0.9 * final), -1)
        lo = samples[lo_i] if lo_i >= 0 else None
        hi = samples[hi_i] if hi_i >= 0 else None
        if lo and hi and hi[3] > lo[3]:
            d_req = hi[3] - lo[3]
            res["cpu_ms_per_req"] = (hi[1] - lo[1]) / d_req * 1e3
            res["cpu_ms_per_req_by"] = split_per(splits[lo_i], splits[hi_i], d_req, 1e3)
            res["cpu_us_per_token"] = (hi[1] - lo[1]) / (d_req * case.tokens) * 1e6
            res["stub_cpu_ms_per_req"] = (hi[4] - lo[4]) / d_req * 1e3
            res["window_req"] = d_req
            res["window_rps"] = d_req / (hi[0] - lo[0]) if hi[0] > lo[0] else None
            res["window_cpu_util"] = (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else None
        first = next((s for s in samples if s[3] > 0), None)
        res["startup_cpu_s"] = first[1] if first else None
        res["total_cpu_s"] = samples[-1][1]
        res["peak_rss_mb"] = max(s[2] for s in samples) / 2**20  # the whole process tree
        res["peak_rss_root_mb"] = root_peak / 2**20  # the client's own process
    t = timings(case, out)
    res["ttft_err"] = error_stats(t["ttft"], case.ttft)
    res["itl_err"] = error_stats(t["itl"], case.itl)
    res["itl_kind"] = t["itl_kind"]
    res["reported"] = t["reported"]
    if at_peak:
        res["at_peak"] = at_peak | {"threads_max": threads_max}
    if case.extra:
        res["loadavg"] = os.getloadavg()
    if t.get("lag"):
        lag_ms = [x / 1e6 for x in t["lag"]]
        res["lag_ms"] = {
            "n": len(lag_ms),
            "mean": statistics.fmean(lag_ms),
            "p50": pct(lag_ms, 0.5),
            "p99": pct(lag_ms, 0.99),
            "max": max(lag_ms),
            "kind": t.get("lag_kind", "scheduled -> sent"),
        }
    if case.mode != "closed":
        res["arrivals"] = arrival_stats(stub_stats.get("arrivals_ns", []), case.rate, case.mode)
    if rc not in (0, None):
        tail = (out / "tool.log").read_bytes()[-1500:].decode(errors="replace")
        res["log_tail"] = tail
    summary = {
        k: (round(v, 4) if isinstance(v, float) else v)
        for k, v in res.items()
        if k
        in (
            "rc",
            "answers",
            "cpu_ms_per_req",
            "cpu_us_per_token",
            "peak_rss_mb",
            "window_rps",
            "stub_cpu_ms_per_req",
        )
    }
    print(
        f"  {case.name}: {summary} ttft_err={_short(res['ttft_err'])} "
        f"itl_err={_short(res['itl_err'])}"
        + (f" arrivals={_short(res['arrivals'])}" if "arrivals" in res else "")
        + (f" lag={_short(res['lag_ms'])}" if "lag_ms" in res else "")
        + (f" cpu_ms_per_req_by={res['cpu_ms_per_req_by']}" if "cpu_ms_per_req_by" in res else ""),
        flush=True,
    )
    return res


def _short(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (round(v, 3) if isinstance(v, float) else v)
        for k, v in d.items()
        if k not in ("kind", "mode", "target")
    }
