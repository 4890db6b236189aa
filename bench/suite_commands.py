"""What each case of bench/suite.py runs: the paths, the tools and their variants (the
soakd patches), a case (Case), each tool's command line (command), its environment and
whether the tool is installed (available).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
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
# `soakd run` as before the journal writer's sched_yield slices (soakd/journal/writer.py)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
