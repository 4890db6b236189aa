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
import contextlib
import itertools
import json
import math
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from stub import merge_stats, read_counter  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
RESULTS = CACHE / "results"
WORK = CACHE / "work"
VENVS = CACHE / "venvs"
# the project's venv; elsewhere (a machine with the deps on PYTHONPATH) this interpreter
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
SOAKD = (
    [str(ROOT / ".venv" / "bin" / "soakd")] if (ROOT / ".venv").exists() else [PY, "-m", "soakd"]
)
VLLM_PY = str(ROOT / ".venv-vllm" / "bin" / "python")
TOKENIZER_DIR = ROOT / ".cache" / "tiny-llama"
HF_CACHE = CACHE / "hf" / "hub"
MODEL = "tiny-llama"
TOKENS = 16
TTFT_S = 0.050
ITL_S = 0.005
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

TOOLS = ("bare", "soakd-hot", "soakd", "vllm", "aiperf", "guidellm")
LABEL = {
    "bare": "bare aiohttp loop",
    "soakd-hot": "soakd hot path (in-process)",
    "soakd": "soakd run (journal, exporter)",
    "vllm": "vllm bench serve",
    "aiperf": "AIPerf",
    "guidellm": "GuideLLM",
    "soakd-arenas": "soakd run, glibc default malloc arenas (before soakd/runtime.py)",
    "soakd-nogpu": "soakd run, gpu source none (no NVML)",
    "soakd-nice": "soakd run, its other threads at nice 19 (experiment)",
    "soakd-noyield": "soakd run, the journal writer never yields (before YIELD_EVERY)",
    "soakd-diag": "soakd run with bench/slowcb.py (slow loop callbacks, GC pauses)",
}
SOAKD_RUNS = (
    "soakd",
    "soakd-arenas",
    "soakd-nogpu",
    "soakd-nice",
    "soakd-noyield",
    "soakd-diag",
    "soakd-x1",
    "soakd-x2",
    "soakd-x3",
)
# experiments, set by --manycore-x1/2/3 (Python run before soakd's CLI main)
EXPERIMENTS = {"soakd-x1": "", "soakd-x2": "", "soakd-x3": ""}
# `soakd run` with bench/slowcb.py: the loop's slow callbacks and GC pauses ($SLOWCB_OUT)
DIAG = (
    f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import slowcb\n"
    "from soakd.cli import main; sys.exit(main())"
)
# `soakd run` as before the journal link's sched_yield slices (soakd/journal/link.py)
NO_YIELD = (
    "import sys, soakd.journal.link as w; w.YIELD_EVERY = 0\n"
    "from soakd.cli import main; sys.exit(main())"
)
# `soakd run` as before soakd/runtime.py: the arena cap patched out, nothing else changed
NO_ARENA_CAP = (
    "import sys, soakd.runtime as m; m.limit_arenas = lambda *a, **k: False; "
    "from soakd.cli import main; sys.exit(main())"
)
# An experiment, not soakd's code: every thread but the event loop's (journal writer,
# exporter, NVML, to_thread workers) at nice 19, so that on a shared core the loop's thread
# wins the CPU whenever it is runnable. Linux keeps a nice value per thread.
NICE_THREADS = (
    "import os, sys, threading; _b = threading.Thread._bootstrap_inner\n"
    "def _nice(self):\n"
    "    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)\n"
    "    _b(self)\n"
    "threading.Thread._bootstrap_inner = _nice\n"
    "from soakd.cli import main; sys.exit(main())"
)


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_table() -> dict[int, tuple[int, float, int]]:
    """pid -> (ppid, cpu seconds incl. reaped children, rss bytes)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2 :].split()
        ppid = int(rest[1])
        ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
        out[int(name)] = (ppid, ticks / CLK_TCK, int(rest[21]) * PAGE)
    return out


def tree_usage(root: int, table: dict[int, tuple[int, float, int]]) -> tuple[float, int, int]:
    """(cpu s, rss bytes, processes) of ``root`` and every descendant."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    cpu, rss, n, todo = 0.0, 0, 0, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            _, c, r = table[pid]
            cpu += c
            rss += r
            n += 1
        todo.extend(kids.get(pid, ()))
    return cpu, rss, n


# A soakd process's role, by what its command line runs (soakd's own process: "loop" for its
# main thread, "threads" for the others: the journal's link thread, the exporter...)
ROLES = (
    ("soakd.journal.process", "writer"),
    ("soakd.gpu.sampler", "sampler"),
    ("soakd.workers.child", "workers"),
)


def _role(pid: int, cache: dict[int, str]) -> str:
    role = cache.get(pid)
    if role is None:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmd = ""
        role = cache[pid] = next((r for key, r in ROLES if key in cmd), "other")
    return role


def _own_cpu(pid: int, tid: int | None = None) -> float:
    """A process's own CPU seconds (not its reaped children's), or one thread's."""
    try:
        raw = Path(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0.0
    rest = raw[raw.rfind(b")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def tree_split(
    root: int, table: dict[int, tuple[int, float, int]], cache: dict[int, str]
) -> dict[str, float]:
    """CPU seconds of ``root``'s tree by role: soakd's own process as "loop" (its main
    thread) and "threads" (the rest), its children by ``ROLES``."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    loop = _own_cpu(root, root)
    out["loop"] = loop
    out["threads"] = max(0.0, _own_cpu(root) - loop)
    todo = list(kids.get(root, ()))
    while todo:
        pid = todo.pop()
        role = _role(pid, cache)
        out[role] = out.get(role, 0.0) + table[pid][1]
        todo.extend(kids.get(pid, ()))
    return out


def split_per(
    lo: dict[str, float], hi: dict[str, float], per: float, scale: float
) -> dict[str, float]:
    """``hi - lo`` by role, each divided by ``per`` and times ``scale`` (a role gone by ``hi``
    is dropped: its CPU went to its parent's reaped-children count)."""
    return {k: round((v - lo.get(k, 0.0)) / per * scale, 4) for k, v in hi.items()}


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


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    """argv under ``taskset -c cpus`` (the process and every thread and child it starts)."""
    if not cpus:
        return argv
    if shutil.which("taskset") is None:
        raise SystemExit("taskset (util-linux) is needed to pin the client")
    return ["taskset", "-c", cpus, *argv]


@dataclass
class Case:
    tool: str
    mode: str  # "closed" | "poisson" | "constant"
    concurrency: int = 0
    rate: float = 0.0
    requests: int = 1000
    ttft: float = TTFT_S
    itl: float = ITL_S
    tokens: int = TOKENS
    timeout_s: float = 240.0
    rep: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        load = f"c{self.concurrency}" if self.mode == "closed" else f"{self.mode}{self.rate:g}"
        return f"{self.tool}-{load}-r{self.rep}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_CACHE=str(HF_CACHE),
        TOKENIZERS_PARALLELISM="false",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env.pop(k, None)
    return env


def ensure_hf_cache() -> None:
    """AIPerf (offline) resolves a tokenizer only as a hub repo id: lay .cache/tiny-llama out
    as the cached snapshot of a repo named local/tiny-llama."""
    rev = "0" * 40
    repo = HF_CACHE / "models--local--tiny-llama"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    for f in TOKENIZER_DIR.iterdir():
        link = snap / f.name
        if not link.exists():
            link.symlink_to(f)


def _client_nice() -> None:
    """Every client runs at nice -5 (the stub at -10): on a shared machine this keeps other
    people's jobs from landing in the measured latencies. The same for every tool."""
    with contextlib.suppress(OSError):
        os.nice(-5)


def soakd_config(case: Case, url: str, path: Path) -> None:
    # soakd-nogpu: no GPU source (the default, auto, opens NVML where a driver answers)
    gpu = "gpu: {source: none}\n" if case.tool == "soakd-nogpu" else ""
    if case.mode == "closed":
        load = f"{{mode: closed, concurrency: {case.concurrency}}}"
        duration = case.timeout_s
    else:
        load = f"{{mode: {case.mode}, rate: {case.rate:g}}}"
        duration = case.requests / case.rate
    path.write_text(f"""run: {{name: bench, drain_timeout: 10s}}
targets:
  - name: stub
    base_url: {url}
    model: {MODEL}
workload:
  max_tokens: {case.tokens}
  temperature: 0
  prompts: {{source: synthetic, input_tokens: {{mean: 20, stddev: 0, min: 20, max: 20}}}}
phases:
  - name: main
    duration: {duration:g}s
    load: {load}
{gpu}""")


def command(case: Case, url: str, out: Path) -> tuple[list[str], str | None]:
    """argv and the stop rule (None: the tool stops itself after case.requests)."""
    n, c = str(case.requests), str(case.concurrency)
    if case.tool in ("bare", "soakd-hot"):
        mode = "bare" if case.tool == "bare" else "soakd"
        argv = [
            PY,
            str(ROOT / "bench" / "clients.py"),
            mode,
            "--url",
            url,
            "--concurrency",
            c,
            "--requests",
            n,
            "--tokens",
            str(case.tokens),
            "--out",
            str(out / "client.json"),
            "--timings",
            "--max-seconds",
            str(case.timeout_s),
        ]
        if case.extra.get("uvloop"):
            argv.append("--uvloop")
        if case.mode != "closed":
            argv += ["--rate", f"{case.rate:g}", "--arrival", case.mode]
        return argv, None
    if case.tool in SOAKD_RUNS:
        cfg = out / "soak.yaml"
        soakd_config(case, url, cfg)
        patch = {
            "soakd-arenas": NO_ARENA_CAP,
            "soakd-nice": NICE_THREADS,
            "soakd-noyield": NO_YIELD,
            "soakd-diag": DIAG,
            **{
                k: f"import sys\n{v}\nfrom soakd.cli import main; sys.exit(main())"
                for k, v in EXPERIMENTS.items()
            },
        }.get(case.tool)
        soakd = [PY, "-c", patch] if patch else SOAKD
        argv = [
            *soakd,
            "run",
            str(cfg),
            "--no-live",
            "--run-dir",
            str(out / "run"),
            "--metrics-addr",
            f"127.0.0.1:{free_port()}",
        ]
        return argv, "sigterm" if case.mode == "closed" else None
    if case.tool == "vllm":
        argv = [
            VLLM_PY,
            str(ROOT / "bench" / "vllm_bench_serve.py"),
            "--backend",
            "openai-chat",
            "--base-url",
            url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            MODEL,
            "--tokenizer",
            str(TOKENIZER_DIR),
            "--dataset-name",
            "random",
            "--random-input-len",
            "20",
            "--random-output-len",
            str(case.tokens),
            "--num-prompts",
            n,
            "--ignore-eos",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(out),
            "--result-filename",
            "vllm.json",
            "--disable-tqdm",
            "--ready-check-timeout-sec",
            "0",
        ]
        if case.mode == "closed":
            argv += ["--max-concurrency", c, "--request-rate", "inf"]
        else:
            argv += ["--request-rate", f"{case.rate:g}", "--burstiness", "1"]
        return argv, None
    if case.tool == "aiperf":
        argv = [
            str(VENVS / "aiperf" / "bin" / "aiperf"),
            "profile",
            "--model",
            MODEL,
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--request-count",
            n,
            "--prompt-input-tokens-mean",
            "20",
            "--output-tokens-mean",
            str(case.tokens),
            "--extra-inputs",
            "ignore_eos:true",
            "--tokenizer",
            "local/tiny-llama",
            "--artifact-dir",
            str(out / "aiperf"),
            "--ui",
            "none",
        ]
        if case.mode == "closed":
            argv += ["--concurrency", c]
        else:
            argv += ["--request-rate", f"{case.rate:g}", "--arrival-pattern", case.mode]
        return argv, None
    if case.tool == "guidellm":
        profile = (
            f"kind=concurrent,streams={c}"
            if case.mode == "closed"
            else f"kind={case.mode},rate={case.rate:g}"
        )
        argv = [
            str(VENVS / "guidellm" / "bin" / "guidellm"),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model={MODEL}",
            "--profile",
            profile,
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=20,output_tokens={case.tokens}",
            "--tokenizer",
            f"kind=hf_auto,model={TOKENIZER_DIR}",
            "--output",
            f"kind=json,path={out / 'guidellm.json'}",
            "--disable-console-interactive",
        ]
        return argv, None
    raise ValueError(case.tool)


# --- per-tool timings ---------------------------------------------------------------------------


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


# --- running one case ---------------------------------------------------------------------------


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
    at_peak: dict[str, float] = {}  # the client's /proc status and smaps split at its peak RSS
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


def available(tool: str) -> str | None:
    """None when the tool can run, else why not."""
    if tool == "vllm":
        return None if Path(VLLM_PY).exists() else ".venv-vllm missing (make setup-vllm)"
    if tool in ("aiperf", "guidellm"):
        status = VENVS / f"{tool}.status"
        exe = VENVS / tool / "bin" / tool
        if exe.exists():
            return None
        return status.read_text().strip() if status.exists() else "not installed (setup_peers.sh)"
    return None


# --- sections -----------------------------------------------------------------------------------


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
        "experiments": {t: EXPERIMENTS[t].replace("\n", "; ") for t in a.manycore_tools
                        if EXPERIMENTS.get(t)},
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


def smaps_breakdown(pid: int) -> dict[str, float]:
    """Rss (MB) of a process by mapping kind: brk heap, anonymous mmaps (pymalloc arenas,
    glibc thread arenas, big blocks), file-backed (libraries, SQLite), stacks."""
    out = {"heap": 0.0, "anon": 0.0, "file": 0.0, "stack": 0.0, "anon_maps": 0.0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 6)
                if len(first) >= 5 and "-" in first[0] and not first[0].endswith(":"):
                    name = first[5].strip() if len(first) > 5 else ""
                    if name == "[heap]":
                        kind = "heap"
                    elif name.startswith("[stack"):
                        kind = "stack"
                    elif name.startswith("/"):
                        kind = "file"
                    else:
                        kind = "anon"
                        out["anon_maps"] += 1
                elif line.startswith("Rss:"):
                    out[kind] += int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


ARENA_ALIGN = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heap starts aligned


def top_mappings(pid: int, n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` largest mappings by Rss (MB), summed by name; anonymous ones split into
    '[thread arenas]' (glibc heaps of threads other than the main one: 64 MiB-aligned) and
    '[anon]' (pymalloc arenas, big blocks, stacks)."""
    rss: dict[str, float] = {}
    name = ""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 5)
                if len(first) >= 5 and "-" in first[0] and not first[0].endswith(":"):
                    name = first[5].strip() if len(first) > 5 else ""
                    if not name:
                        start = int(first[0].split("-")[0], 16)
                        name = "[thread arenas]" if start % ARENA_ALIGN == 0 else "[anon]"
                elif line.startswith("Rss:"):
                    rss[name] = rss.get(name, 0.0) + int(line.split()[1]) / 1024
    except OSError:
        return []
    return sorted(((k, round(v, 1)) for k, v in rss.items()), key=lambda kv: -kv[1])[:n]


def thread_names(pid: int) -> dict[str, int]:
    """How many threads of each name (/proc/PID/task/*/comm) the process has."""
    out: dict[str, int] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            out[name] = out.get(name, 0) + 1
    except OSError:
        pass
    return out


def rss_anon_mb() -> float:
    """This process's RssAnon in MB (NaN where /proc has none)."""
    return _status_fields(os.getpid()).get("rss_anon_mb", float("nan"))


def _status_fields(pid: int) -> dict[str, float]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("RssAnon", "RssFile", "RssShmem", "VmRSS", "VmHWM"):
                    out[k.lower().replace("rss", "rss_") + "_mb"] = int(v.split()[0]) / 1024
                elif k == "Threads":
                    out["threads"] = int(v)
    except OSError:
        pass
    return out


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PHYS_PAGES") * PAGE / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(mem, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_end": os.getloadavg(),
        "date": datetime.now(UTC).isoformat(),
    }


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
