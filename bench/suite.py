"""soakd against GuideLLM, AIPerf and `vllm bench serve`: overhead, timing accuracy, open-loop
fidelity and endurance, on the same machine in the same run. `make bench` runs it all and
writes docs/benchmarks.md.

    .venv/bin/python bench/suite.py all            # setup_peers.sh must have run (make bench does)
    .venv/bin/python bench/suite.py closed --quick # one section, fewer requests
    .venv/bin/python bench/suite.py report         # re-render docs/benchmarks.md from the results

Every case starts a fresh bench/stub.py (exact TTFT/ITL, timerfd-precise) and one client
process, samples the client's whole process tree from /proc every 100 ms (CPU of every
descendant, reaped ones through cutime/cstime; summed RSS) together with the stub's live
count of finished answers, and takes CPU per request over the window between 10 % and
90 % of the answers: net of start-up (imports, tokenizers, dataset generation) and of
shutdown (report writing). Timings come from each tool's own per-request output.
Results: .cache/bench/results/*.json.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
# what a case runs, the /proc sampling, one case's run: suite_commands.py, suite_procs.py,
# suite_run.py (which reads the tools' timings with suite_timings.py); this module: the sections
from suite_commands import (  # noqa: E402
    EXPERIMENTS,
    PY,
    RESULTS,
    SOAKD,
    TOOLS,
    WORK,
    Case,
    _env,
    available,
    command,
    ensure_hf_cache,
    free_port,
    pinned,
)
from suite_procs import (  # noqa: E402
    _status_fields,
    machine,
    proc_table,
    rss_anon_mb,
    smaps_breakdown,
    split_per,
    tree_split,
    tree_usage,
)
from suite_run import Stub, run_case  # noqa: E402

# what bench/workers.py and bench/endurance_mem.py import from here, as before the split
__all__ = [
    "PY",
    "SOAKD",
    "Stub",
    "_env",
    "free_port",
    "main",
    "pinned",
    "proc_table",
    "rss_anon_mb",
    "split_per",
    "tree_split",
    "tree_usage",
]


def save(name: str, doc: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))


def section_closed(a: argparse.Namespace) -> None:
    """Overhead and timing accuracy: closed loop at 8 and 64 streams, TTFT 50 ms, ITL 5 ms.
    bare / soakd-hot / soakd are interleaved and repeated (ratios within a round)."""
    ensure_hf_cache()
    runs: list[dict[str, Any]] = []
    skipped = {t: why for t in TOOLS if (why := available(t))}
    for conc, n in ((8, a.requests_8), (64, a.requests_64)):
        for rep in range(a.reps):
            runs.extend(
                run_case(Case(tool, "closed", concurrency=conc, requests=n, rep=rep))
                for tool in ("bare", "soakd-hot", "soakd")
            )
        for tool in ("vllm", "aiperf", "guidellm"):
            if tool in skipped or tool not in a.tools:
                continue
            runs.append(run_case(Case(tool, "closed", concurrency=conc, requests=n)))
    save("closed", {"runs": runs, "skipped": skipped, "machine": machine()})


def section_openloop(a: argparse.Namespace) -> None:
    ensure_hf_cache()
    skipped = {t: why for t in TOOLS if (why := available(t))}
    runs = []
    seconds = a.openloop_seconds
    for mode, rate in (("poisson", 50), ("poisson", 200), ("poisson", 1000), ("constant", 200)):
        for tool in ("bare", "soakd", "vllm", "aiperf", "guidellm"):
            if tool in skipped or tool not in a.tools or (tool == "vllm" and mode == "constant"):
                continue
            n = int(rate * seconds)
            runs.append(
                run_case(Case(tool, mode, rate=rate, requests=n, timeout_s=seconds * 4 + 60))
            )
    save("openloop", {"runs": runs, "skipped": skipped, "machine": machine()})


def section_manycore(a: argparse.Namespace) -> None:
    """Overhead with the client pinned to one core (issue 18, part 5): `taskset -c N` for the
    client, the stub's workers on the other cores (and this sampler too), 64 streams, stub
    TTFT 50 ms / ITL 5 ms, interleaved rounds of the bare loop and `soakd run` (plus the
    variants in --manycore-tools). No peers. Writes results/manycore-<cores>c.{json,md}."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("manycore needs at least 2 cores (client on one, stub on the rest)")
    client = a.client_core if a.client_core is not None else cpus[-1]
    others = [c for c in cpus if c != client]
    stub_cpus = ",".join(map(str, others))
    workers = max(1, min(a.stub_workers, len(others)))
    os.sched_setaffinity(0, others)  # the sampler stays off the client's core
    extra = {
        "client_cpus": str(client),
        "stub_cpus": stub_cpus,
        "stub_workers": workers,
        "peek": True,
    }
    print(
        f"  client on core {client} (taskset -c {client}), stub: {workers} worker(s) on "
        f"cores {stub_cpus}; {len(cpus)} cores; load {os.getloadavg()}",
        flush=True,
    )
    runs = [
        run_case(
            Case(tool, "closed", concurrency=64, requests=a.requests_64, rep=rep, extra=dict(extra))
        )
        for rep in range(a.reps)
        for tool in a.manycore_tools
    ]
    doc = {
        "runs": runs,
        "machine": machine(),
        "client_core": client,
        "stub_cpus": stub_cpus,
        "stub_workers": workers,
        "command": "python bench/suite.py " + " ".join(sys.argv[1:]),
        "goals": "issue 28",
        "experiments": {
            t: EXPERIMENTS[t].replace("\n", "; ") for t in a.manycore_tools if EXPERIMENTS.get(t)
        },
    }
    name = a.name or f"manycore-{len(cpus)}c"
    save(name, doc)
    from report import manycore_table

    lines: list[str] = []
    manycore_table(doc, lines)
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        for ext in ("json", "md"):
            shutil.copy(RESULTS / f"{name}.{ext}", a.out / f"{name}.{ext}")


def section_endurance(a: argparse.Namespace) -> None:
    """`soakd run`, closed loop 64, against a stub that answers at once (16 tokens in one
    write): as many requests as fit in the time budget, RSS and CPU sampled along the way."""
    out = WORK / "endurance"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    stub = Stub(out, ttft=0, itl=0)
    case = Case(
        "soakd",
        "closed",
        concurrency=64,
        requests=a.endurance_requests,
        timeout_s=a.endurance_minutes * 60,
    )
    argv, _ = command(case, stub.url, out)
    metrics_url = "http://" + argv[argv.index("--metrics-addr") + 1] + "/metrics"
    log = open(out / "tool.log", "wb")  # noqa: SIM115
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=out, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    points: list[dict[str, Any]] = []
    queue_max = 0.0
    last_scrape = 0.0
    marks = sorted({10_000, 100_000, 250_000, 500_000, 1_000_000, a.endurance_requests})
    last = 0.0
    stopped = False
    try:
        while proc.poll() is None:
            now = time.monotonic() - t0
            done, _ = stub.done()
            if now - last_scrape >= 0.5:
                last_scrape = now
                depth = _scrape(metrics_url, "soakd_journal_queue_depth")
                if depth is not None:
                    queue_max = max(queue_max, depth)
            if now - last >= 2.0 or (marks and done >= marks[0]):
                last = now
                cpu, rss, _ = tree_usage(proc.pid, proc_table())
                st = _status_fields(proc.pid)
                sm = {f"smaps_{k}": v for k, v in smaps_breakdown(proc.pid).items()}
                points.append(
                    {
                        "t": now,
                        "done": done,
                        "cpu_s": cpu,
                        "rss_mb": rss / 2**20,
                        "journal_queue_max": queue_max,
                        **st,
                        **sm,
                    }
                )
                queue_max = 0.0
                while marks and done >= marks[0]:
                    marks.pop(0)
            if not stopped and (done >= a.endurance_requests or now > a.endurance_minutes * 60):
                proc.send_signal(signal.SIGTERM)
                stopped = True
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.wait(60)
        log.close()
        stub.stop()
    db = out / "run" / "journal.db"
    doc = {
        "points": points,
        "requests": points[-1]["done"] if points else 0,
        "minutes": a.endurance_minutes,
        "target": a.endurance_requests,
        "journal_mb": db.stat().st_size / 2**20 if db.exists() else None,
        "machine": machine(),
    }
    save("endurance", doc)
    for p in points[:: max(1, len(points) // 20)]:
        print(
            f"  t={p['t']:.0f}s done={p['done']} rss={p['rss_mb']:.1f}MB "
            f"anon={p.get('rss_anon_mb')} file={p.get('rss_file_mb')} "
            f"journal queue max={p.get('journal_queue_max')}"
        )


def _scrape(url: str, name: str) -> float | None:
    """One unlabelled sample from a Prometheus text page (None when unreachable)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "section", choices=["all", "closed", "openloop", "endurance", "manycore", "report"]
    )
    ap.add_argument("--quick", action="store_true", help="fewer requests, one repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests-8", type=int, default=1500)
    ap.add_argument("--requests-64", type=int, default=6000)
    ap.add_argument("--openloop-seconds", type=float, default=20)
    ap.add_argument("--endurance-requests", type=int, default=1_000_000)
    ap.add_argument("--endurance-minutes", type=float, default=15)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--client-core", type=int, help="manycore: the client's core (default: last)")
    ap.add_argument("--stub-workers", type=int, default=4, help="manycore: stub processes")
    ap.add_argument(
        "--manycore-tools",
        default="bare,soakd,soakd-arenas",
        help="manycore: what each round runs (bare, soakd, soakd-arenas, soakd-nogpu, soakd-hot)",
    )
    ap.add_argument("--out", type=Path, help="manycore: also copy the results here")
    for x in ("x1", "x2", "x3"):
        ap.add_argument(f"--manycore-{x}", default="", help=f"manycore: soakd-{x}'s patch code")
    ap.add_argument("--name", help="manycore: results file name (default manycore-<cores>c)")
    a = ap.parse_args()
    a.tools = a.tools.split(",")
    a.manycore_tools = a.manycore_tools.split(",")
    for x in ("x1", "x2", "x3"):
        EXPERIMENTS[f"soakd-{x}"] = getattr(a, f"manycore_{x}").replace(";;", "\n")
    if a.quick:
        a.reps, a.requests_8, a.requests_64, a.openloop_seconds = 1, 400, 1500, 5
        a.endurance_requests, a.endurance_minutes = 50_000, 2
    if a.section in ("all", "closed"):
        print("closed loop: overhead and timing accuracy", flush=True)
        section_closed(a)
    if a.section in ("all", "openloop"):
        print("open loop fidelity", flush=True)
        section_openloop(a)
    if a.section in ("all", "endurance"):
        print("endurance", flush=True)
        section_endurance(a)
    if a.section == "manycore":  # not part of "all": a page of its own machine, no peers
        print("many cores: client pinned to one core", flush=True)
        section_manycore(a)
        return
    from report import render

    render(RESULTS, ROOT / "docs" / "benchmarks.md")
    print("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
