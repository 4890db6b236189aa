"""Render docs/benchmarks.md from .cache/bench/results/*.json (written by bench/suite.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LABEL = {
    "bare": "bare aiohttp loop (floor)",
    "soakd-hot": "soakd hot path, in-process",
    "soakd": "`soakd run` (journal + exporter)",
    "vllm": "`vllm bench serve`",
    "aiperf": "AIPerf",
    "guidellm": "GuideLLM",
}
ORDER = ["bare", "soakd-hot", "soakd", "vllm", "aiperf", "guidellm"]


def _f(v: Any, nd: int = 2, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _spread(values: Sequence[float | None], nd: int = 2) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.{nd}f}"
    return f"{statistics.median(vals):.{nd}f} ({min(vals):.{nd}f}–{max(vals):.{nd}f})"


def versions() -> dict[str, str]:
    out = {}
    probes = {
        "soakd": (ROOT / ".venv/bin/python", "import soakd; print(soakd.__version__)"),
        "python": (ROOT / ".venv/bin/python", "import sys; print(sys.version.split()[0])"),
        "aiohttp (soakd, bare)": (
            ROOT / ".venv/bin/python",
            "import aiohttp; print(aiohttp.__version__)",
        ),
        "vllm (bench serve)": (
            ROOT / ".venv-vllm/bin/python",
            "import vllm; print(vllm.__version__)",
        ),
        "aiperf": (
            ROOT / ".cache/bench/venvs/aiperf/bin/python",
            "from importlib.metadata import version; print(version('aiperf'))",
        ),
        "guidellm": (
            ROOT / ".cache/bench/venvs/guidellm/bin/python",
            "from importlib.metadata import version; print(version('guidellm'))",
        ),
    }
    for name, (py, code) in probes.items():
        try:
            r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120)
            out[name] = r.stdout.strip().splitlines()[-1] if r.returncode == 0 else "unavailable"
        except (OSError, subprocess.TimeoutExpired, IndexError):
            out[name] = "unavailable"
    return out


def _load(results: Path, name: str) -> dict[str, Any] | None:
    p = results / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _conns(r: dict[str, Any]) -> float | None:
    c = r.get("stub", {}).get("connections")
    return c / r["answers"] if c is not None and r.get("answers") else None


def closed_tables(doc: dict[str, Any], lines: list[str], goals: list[str]) -> None:
    runs = doc["runs"]
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        c = r["case"]
        by.setdefault((c["tool"], c["concurrency"]), []).append(r)
    concs = sorted({c for _, c in by})
    # per-round ratios against bare
    ratio: dict[tuple[str, int], list[float]] = {}
    ratio_tok: dict[tuple[str, int], list[float]] = {}
    bare_round = {
        (r["case"]["concurrency"], r["case"]["rep"]): r for r in runs if r["case"]["tool"] == "bare"
    }
    for r in runs:
        c = r["case"]
        b = bare_round.get((c["concurrency"], c["rep"])) if c["tool"] != "bare" else None
        if c["tool"] in ("vllm", "aiperf", "guidellm"):  # one run: against the median bare
            bs = [x.get("cpu_ms_per_req") for x in by.get(("bare", c["concurrency"]), [])]
            bm = _med(bs)
            if bm and r.get("cpu_ms_per_req"):
                ratio.setdefault((c["tool"], c["concurrency"]), []).append(r["cpu_ms_per_req"] / bm)
            continue
        if b and b.get("cpu_ms_per_req") and r.get("cpu_ms_per_req"):
            ratio.setdefault((c["tool"], c["concurrency"]), []).append(
                r["cpu_ms_per_req"] / b["cpu_ms_per_req"]
            )
            ratio_tok.setdefault((c["tool"], c["concurrency"]), []).append(
                r["cpu_us_per_token"] / b["cpu_us_per_token"]
            )

    lines += [
        "## Overhead: client CPU per request and per token",
        "",
        "Closed loop, 16 tokens per answer, stub TTFT 50 ms and ITL 5 ms, one write per "
        "token. CPU is the client's whole process tree (every worker process), taken "
        "between 10 % and 90 % of the answers: net of start-up and of report writing. "
        "soakd and the bare loop ran in interleaved rounds; the ratio is taken within a "
        "round, then the median (min–max) over rounds. Peers ran once and are compared "
        "with the median bare run.",
        "",
    ]
    lines += [
        "| client | streams | CPU / request (ms) | CPU / token (µs) | × bare (req) | "
        "peak RSS (MB) | req/s | start-up CPU (s) | TCP connections / request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for conc in concs:
        for tool in ORDER:
            rs = by.get((tool, conc))
            if not rs:
                continue
            lines.append(
                f"| {LABEL[tool]} | {conc} | {_spread([r.get('cpu_ms_per_req') for r in rs], 3)} | "
                f"{_spread([r.get('cpu_us_per_token') for r in rs], 1)} | "
                f"{'1' if tool == 'bare' else _spread(ratio.get((tool, conc), []))} | "
                f"{_f(_med([r.get('peak_rss_mb') for r in rs]), 0)} | "
                f"{_f(_med([r.get('window_rps') for r in rs]), 0)} | "
                f"{_f(_med([r.get('startup_cpu_s') for r in rs]), 1)} | "
                f"{_f(_med([_conns(r) for r in rs]), 3)} |"
            )
    lines.append("")
    for conc in concs:
        for tool in ("soakd-hot", "soakd"):
            rq, rt = _med(ratio.get((tool, conc), [])), _med(ratio_tok.get((tool, conc), []))
            if rq is not None:
                ok = rq <= 1.3 and (rt is None or rt <= 1.3)
                goals.append(
                    f"| {LABEL[tool]}: CPU per request / per token within 1.3× of "
                    f"bare, {conc} streams | {rq:.2f}× / {_f(rt)}× | "
                    f"{'met' if ok else 'missed'} |"
                )

    lines += [
        "## Timing accuracy: reported minus truth",
        "",
        "Same runs. Truth: TTFT 50 ms, ITL 5 ms, from the moment the stub has read the "
        "request. Error = what the tool reports minus the truth, in ms, over every "
        "request after the first 10 % (connection set-up is nobody's timer error). "
        "`stub late` is how late the stub's own writes left (its error floor: it is "
        "included in every client's figure). GuideLLM stores one mean ITL per request, "
        "not every gap: its ITL row is per-request means (p99 of those is naturally "
        "tighter). soakd's journal keeps gaps in whole µs (the mid-point is used).",
        "",
    ]
    lines += [
        "| client | streams | TTFT err mean | TTFT err p99 | ITL err mean | ITL err p99 | "
        "stub late mean / p99 (first token) | stub late p99 (all tokens) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for conc in concs:
        for tool in ORDER:
            rs = by.get((tool, conc))
            if not rs:
                continue

            def m(key: str, stat: str, rs: list[dict[str, Any]] = rs) -> list[float | None]:
                return [r.get(key, {}).get(stat) for r in rs]

            late = [r.get("stub", {}).get("ttft_late", {}) for r in rs]
            late_all = [r.get("stub", {}).get("late", {}) for r in rs]
            kind = " (per-req means)" if rs[0].get("itl_kind") == "request-mean" else ""
            lines.append(
                f"| {LABEL[tool]} | {conc} | {_spread(m('ttft_err', 'mean'))} | "
                f"{_spread(m('ttft_err', 'p99'))} | {_spread(m('itl_err', 'mean'), 3)} | "
                f"{_spread(m('itl_err', 'p99'))}{kind} | "
                f"{_f(_med([x.get('mean_ms') for x in late]), 2)} / "
                f"{_f(_med([x.get('p99_ms') for x in late]), 2)} | "
                f"{_f(_med([x.get('p99_ms') for x in late_all]), 2)} |"
            )
    lines.append("")
    for tool in ("soakd-hot", "soakd"):
        runs8, bare8 = by.get((tool, 8), []), by.get(("bare", 8), [])
        if not runs8:
            continue
        mean = _med([r["ttft_err"].get("mean") for r in runs8])
        p99 = _med([r["ttft_err"].get("p99") for r in runs8])
        bp99 = _med([r["ttft_err"].get("p99") for r in bare8])
        itl99 = _med([r["itl_err"].get("p99") for r in runs8])
        goals.append(
            f"| {LABEL[tool]}: TTFT error mean under 1 ms, 8 streams | {_f(mean)} ms | "
            f"{'met' if mean is not None and mean < 1 else 'missed'} |"
        )
        goals.append(
            f"| {LABEL[tool]}: TTFT error p99 no worse than bare's (same rounds), 8 "
            f"streams | {_f(p99)} vs {_f(bp99)} ms | "
            f"{'met' if p99 is not None and bp99 is not None and p99 <= bp99 * 1.05 else 'missed'}"
            " |"
        )
        goals.append(
            f"| {LABEL[tool]}: ITL error p99 under 1 ms, 8 streams | {_f(itl99)} ms | "
            f"{'met' if itl99 is not None and itl99 < 1 else 'missed'} |"
        )


def openloop_table(doc: dict[str, Any], lines: list[str], goals: list[str]) -> None:
    lines += [
        "## Open-loop fidelity",
        "",
        "Arrivals as the stub saw them (its clock, when it had read each request): achieved "
        "rate, inter-arrival CV (Poisson should give 1.0, constant 0), largest gap. "
        "`lag` is what the tool itself records between the planned and the actual send "
        "(bare: an asyncio loop sleeping to each planned instant, the floor; soakd: "
        "`soakd_dispatch_lag_seconds`, journal `lag_ns`; GuideLLM: "
        "targeted_start → request_start; AIPerf: credit issued → request start, which is "
        "not a schedule; `vllm bench serve` records none). Stub: TTFT 50 ms, ITL 5 ms, 16 "
        "tokens.",
        "",
        "| load | tool | requests | achieved req/s | vs target | CV | max gap (ms) | "
        "lag p50 / p99 / max (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        c, a = r["case"], r.get("arrivals", {})
        lag = r.get("lag_ms")
        lag_s = f"{_f(lag['p50'])} / {_f(lag['p99'])} / {_f(lag['max'])}" if lag else "–"
        err = a.get("rate_err_pct")
        lines.append(
            f"| {c['mode']} {c['rate']:g}/s | {LABEL[c['tool']]} | {a.get('n', 0)} | "
            f"{_f(a.get('rate'), 1)} | {_f(err, 1, ' %') if err is not None else '–'} | "
            f"{_f(a.get('cv'))} | {_f(a.get('gap_max_ms'), 1)} | {lag_s} |"
        )
        if c["tool"] == "soakd" and c["mode"] == "constant" and c["rate"] == 200:
            ok = err is not None and abs(err) < 1 and a["cv"] < 0.15 and a["gap_max_ms"] < 20
            goals.append(
                f"| soakd constant 200/s: achieved within 1 %, CV under 0.15, no gap over "
                f"20 ms | {_f(err, 2)} %, CV {_f(a.get('cv'))}, max gap "
                f"{_f(a.get('gap_max_ms'), 1)} ms | "
                f"{'met' if ok else 'missed'} |"
            )
        if c["tool"] == "soakd" and c["mode"] == "poisson" and lag:
            goals.append(
                f"| soakd Poisson {c['rate']:g}/s: dispatch lag p99 under 2 ms | "
                f"{_f(lag['p99'])} ms | {'met' if lag['p99'] < 2 else 'missed'} |"
            )
    lines.append("")


def ab_table(rows: list[dict[str, Any]], lines: list[str]) -> None:
    lines += [
        "## Open-loop sleep: timerfd against asyncio.sleep (the change this work made)",
        "",
        "`soakd run` with the runner's `sleep_until_ns` (soakd/workload/timer.py: a "
        "timerfd armed at the instant) against the `asyncio.sleep` it replaced (patched "
        "back in by bench/diag_soakd.py), interleaved, 15 s each, stub TTFT 50 ms / ITL "
        "5 ms. Made by bench/ab_dispatch.py and bench/diag_soakd.py "
        "(scripts removed; in git history before 63d0eb7).",
        "",
        "| load | sleep | round | lag p50 (ms) | lag p99 (ms) | lag max (ms) | CV at the "
        "stub | max gap (ms) | load avg |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} {r['rate']:g}/s | {r['variant']} | {r['round']} | "
            f"{_f(r['lag_p50'])} | {_f(r['lag_p99'])} | {_f(r['lag_max'], 1)} | "
            f"{_f(r['cv'], 3)} | {_f(r['gap_max'], 1)} | {_f(r['load'], 1)} |"
        )
    lines.append("")


def switch_table(rows: list[dict[str, Any]], lines: list[str]) -> None:
    lines += [
        "## GIL switch interval in `soakd run`: 0.5 ms against the default 5 ms (change made)",
        "",
        "`soakd run` (journal on) with `sys.setswitchinterval(0.0005)` (soakd/cli.py, as "
        "shipped) against Python's default 0.005, interleaved, closed loop, stub TTFT 50 "
        "ms / ITL 5 ms. Made by bench/ab_switch.py (script removed; in git history before "
        "63d0eb7).",
        "",
        "| streams | switch interval | round | CPU / request (ms) | TTFT err mean | TTFT "
        "err p99 | ITL err p99 | stub late p99 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['streams']} | {r['variant']} | {r['round']} | "
            f"{_f(r['cpu_ms_per_req'], 3)} | {_f(r['ttft_err'].get('mean'))} | "
            f"{_f(r['ttft_err'].get('p99'))} | {_f(r['itl_err'].get('p99'))} | "
            f"{_f(r['stub_late_p99'])} |"
        )
    lines.append("")


MANYCORE_ORDER = [
    "bare",
    "soakd",
    "soakd-noyield",
    "soakd-arenas",
    "soakd-nogpu",
    "soakd-nice",
    "soakd-diag",
    "soakd-x1",
    "soakd-x2",
    "soakd-x3",
    "soakd-hot",
]
MANYCORE_LABEL = {
    "bare": "bare aiohttp loop",
    "soakd": "`soakd run`",
    "soakd-arenas": "`soakd run`, glibc's default arenas (before)",
    "soakd-nogpu": "`soakd run`, `gpu: {source: none}`",
    "soakd-nice": "`soakd run`, other threads at nice 19 (experiment)",
    "soakd-noyield": "`soakd run`, writer without sched_yield (before)",
    "soakd-diag": "`soakd run`, slow-callback diagnosis",
    "soakd-x1": "`soakd run`, experiment 1",
    "soakd-x2": "`soakd run`, experiment 2",
    "soakd-x3": "`soakd run`, experiment 3",
    "soakd-hot": "soakd hot path, in-process",
}


def manycore_table(doc: dict[str, Any], lines: list[str]) -> None:
    """One machine's many-core table (bench/suite.py manycore): medians (min to max) over the
    interleaved rounds, ratios taken within a round, and the issue-18 goals for `soakd run`."""
    runs, m = doc["runs"], doc["machine"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["case"]["tool"], []).append(r)
    bare = {r["case"]["rep"]: r for r in by.get("bare", [])}
    tools = [t for t in MANYCORE_ORDER if t in by]
    experiments = doc.get("experiments", {})

    def label(tool: str) -> str:
        what = experiments.get(tool)
        return f"`soakd run`, {what}" if what else MANYCORE_LABEL[tool]

    def ratio(tool: str) -> list[float]:
        out = []
        for r in by[tool]:
            b = bare.get(r["case"]["rep"])
            if b and b.get("cpu_ms_per_req") and r.get("cpu_ms_per_req"):
                out.append(r["cpu_ms_per_req"] / b["cpu_ms_per_req"])
        return out

    def col(tool: str, key: str, stat: str | None = None) -> list[float | None]:
        return [(r.get(key) or {}).get(stat) if stat else r.get(key) for r in by[tool]]

    def peak(tool: str, key: str) -> list[float | None]:
        return [r.get("at_peak", {}).get(key) for r in by[tool]]

    def by_process(tool: str) -> str:
        """soakd's CPU a request split by process (medians over rounds): its loop's thread,
        its other threads, the journal's writer, the NVML sampler (none in older results)."""
        splits = [r["cpu_ms_per_req_by"] for r in by[tool] if r.get("cpu_ms_per_req_by")]
        if tool == "bare" or not splits:
            return "–"
        keys = [
            k
            for k in ("loop", "threads", "writer", "sampler", "workers", "other")
            if any(k in s for s in splits)
        ]
        return ", ".join(f"{k} {_f(_med([s.get(k, 0.0) for s in splits]), 3)}" for k in keys)

    loads = [r["loadavg"][0] for r in runs if r.get("loadavg")]
    lines += [
        f"### {m.get('cores')} cores: {m.get('cpu', '?')}, Python {m.get('python')}, "
        f"Linux {m.get('kernel')}, {m.get('date', '?')[:16]} UTC",
        "",
        f"`{doc.get('command')}`: client on core {doc['client_core']} (`taskset -c "
        f"{doc['client_core']}`), stub {doc['stub_workers']} worker(s) on cores "
        f"{doc['stub_cpus']}, {len(by.get('bare', []))} interleaved rounds of "
        f"{runs[0]['case']['requests']} requests, 64 streams; 1-min load average "
        f"during the rounds {min(loads):.1f}–{max(loads):.1f}."
        if loads
        else "",
        "",
        "| | " + " | ".join(label(t) for t in tools) + " |",
        "|---|" + "---:|" * len(tools),
    ]
    rows: list[tuple[str, Callable[[str], str]]] = [
        ("CPU / request (ms)", lambda t: _spread(col(t, "cpu_ms_per_req"), 3)),
        ("× bare (same round)", lambda t: "1" if t == "bare" else _spread(ratio(t))),
        ("of which, by process (ms)", by_process),
        ("TTFT error mean (ms)", lambda t: _spread(col(t, "ttft_err", "mean"))),
        ("TTFT error p99 (ms)", lambda t: _spread(col(t, "ttft_err", "p99"))),
        ("ITL error p99 (ms)", lambda t: _spread(col(t, "itl_err", "p99"))),
        ("peak RSS, whole tree (MB)", lambda t: _spread(col(t, "peak_rss_mb"), 1)),
        ("peak RSS, the client's process (MB)", lambda t: _spread(col(t, "peak_rss_root_mb"), 1)),
        (
            "at peak: anon / heap / file (MB)",
            lambda t: " / ".join(
                _f(_med(peak(t, k)), 1) for k in ("smaps_anon_mb", "smaps_heap_mb", "smaps_file_mb")
            ),
        ),
        ("threads (most seen)", lambda t: _f(_med(peak(t, "threads_max")), 0)),
        ("req/s", lambda t: _f(_med(col(t, "window_rps")), 0)),
        (
            "stub late p99, first token (ms)",
            lambda t: _f(
                _med([r.get("stub", {}).get("ttft_late", {}).get("p99_ms") for r in by[t]]), 2
            ),
        ),
    ]
    for name, fn in rows:
        lines.append(f"| {name} | " + " | ".join(fn(t) for t in tools) + " |")
    lines.append("")
    if "soakd" in by and bare:
        rq = _med(ratio("soakd"))
        mean = _med(col("soakd", "ttft_err", "mean"))
        p99, bp99 = _med(col("soakd", "ttft_err", "p99")), _med(col("bare", "ttft_err", "p99"))
        rss = max((v for v in col("soakd", "peak_rss_mb") if v is not None), default=None)

        # the stub's own first-token lateness in the bare rounds: past 1 ms the machine,
        # not the client, sets the timing figures, and the timing goals cannot be judged
        floor = _med([r.get("stub", {}).get("ttft_late", {}).get("p99_ms") for r in by["bare"]])
        busy = floor is not None and floor > 1.0

        def v(ok: bool) -> str:
            return "holds" if ok else "does not hold"

        def vt(ok: bool) -> str:
            return f"not judged: the stub itself was {floor:.1f} ms late at p99" if busy else v(ok)

        own = max((v for v in col("soakd", "peak_rss_root_mb") if v is not None), default=None)
        brss = _med(col("bare", "peak_rss_mb"))
        if doc.get("goals") != "issue 28":  # a run from before: the goals it was run for
            lines += [
                "| goal (issue 18), `soakd run` | measured (median over rounds) | |",
                "|---|---|---|",
                f"| CPU per request at most 1.3× bare | {_f(rq)}× | "
                f"{v(rq is not None and rq <= 1.3)} |",
                f"| TTFT error mean under 1 ms | {_f(mean)} ms | "
                f"{vt(mean is not None and mean < 1)} |",
                f"| TTFT error p99 no worse than bare (within 5 %) | {_f(p99)} vs {_f(bp99)} ms "
                f"| {vt(p99 is not None and bp99 is not None and p99 <= bp99 * 1.05)} |",
                f"| peak RSS under 80 MB (largest round) | {_f(rss, 1)} MB | "
                f"{v(rss is not None and rss < 80)} |",
                "",
            ]
            return
        lines += [
            "| goal (issue 28), `soakd run` | soakd (median over rounds) | bare | |",
            "|---|---|---|---|",
            f"| CPU per request at most 1.2× bare (per round) | {_f(rq)}× | 1× | "
            f"{v(rq is not None and rq <= 1.2)} |",
            f"| TTFT error mean under 1 ms | {_f(mean)} ms | "
            f"{_f(_med(col('bare', 'ttft_err', 'mean')))} ms | "
            f"{vt(mean is not None and mean < 1)} |",
            f"| TTFT error p99 no worse than bare (within 5 %) | {_f(p99)} ms | {_f(bp99)} ms "
            f"| {vt(p99 is not None and bp99 is not None and p99 <= bp99 * 1.05)} |",
            f"| peak RSS under 80 MB, whole tree (largest round; soakd's own process) "
            f"| {_f(rss, 1)} MB ({_f(own, 1)} MB) | {_f(brss, 1)} MB | "
            f"{v(rss is not None and rss < 80)} |",
            "",
        ]


def manycore_section(results: Path) -> list[str]:
    """The "Many cores" section: every results/manycore-<N>c.json (most cores first), then the
    experiments (results/ab-*.json written by `suite.py manycore --name ab-...`), then
    bench/MANYCORE.md (what the figures say)."""
    many = sorted(results.glob("manycore-*c.json"), key=lambda p: -int(p.stem[9:-1]))
    if not many:
        return []
    lines = [
        "## Many cores: the client pinned to one core (issue 18)",
        "",
        "`make bench-manycore` (`.venv/bin/python bench/suite.py manycore`): the client "
        "pinned to one core with `taskset -c N` (the last core), the stub's workers and the "
        "sampler on the other cores, closed loop 64 streams, 16 tokens, stub TTFT 50 ms / ITL "
        "5 ms, interleaved rounds of the bare aiohttp loop and `soakd run` (journal, exporter, "
        "probes, GPU source `auto` as shipped). No peers. CPU is the client's process (every "
        "thread) between 10 % and 90 % of the answers; × bare is taken within a round; peak "
        "RSS is the largest VmRSS sampled every 100 ms. Medians over rounds, (min–max).",
        "",
    ]
    for p in many:
        manycore_table(json.loads(p.read_text()), lines)
    for p in sorted(results.glob("ab-*.json")):
        lines += [f"Experiment `{p.stem}`:", ""]
        manycore_table(json.loads(p.read_text()), lines)
    notes = ROOT / "bench" / "MANYCORE.md"
    if notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    return lines


def endurance_table(doc: dict[str, Any], lines: list[str], goals: list[str]) -> None:
    pts = doc["points"]
    if not pts:
        return
    lines += [
        "## Endurance: `soakd run` RSS over the run",
        "",
        f"`soakd run`, closed loop 64 streams, against the stub answering at once (16 tokens "
        f"in one write), for {doc['requests']:,} requests "
        f"(target {doc['target']:,}, time budget {doc['minutes']:g} min). RSS is the "
        f"process's VmRSS, split into anonymous memory (heap) and file-backed pages "
        f"(shared libraries, SQLite's mapped pages). Journal on disk at the end: "
        f"{_f(doc.get('journal_mb'), 1)} MB.",
        "",
        "| requests | elapsed (s) | RSS (MB) | anon (MB) | file (MB) | journal queue, max "
        "since the previous row | CPU / request since the previous row (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    marks = [10_000, 50_000, 100_000, 250_000, 500_000, 750_000, 1_000_000]
    chosen, prev = [], None
    for m in marks:
        p = next((p for p in pts if p["done"] >= m), None)
        if p is not None:
            chosen.append(p)
    if pts[-1] not in chosen:
        chosen.append(pts[-1])
    for p in chosen:
        cpr = (
            (p["cpu_s"] - prev["cpu_s"]) / (p["done"] - prev["done"]) * 1e3
            if prev and p["done"] > prev["done"]
            else None
        )
        lo = prev["t"] if prev else -1
        qmax = max(
            (q.get("journal_queue_max") or 0 for q in pts if lo < q["t"] <= p["t"]), default=None
        )
        lines.append(
            f"| {p['done']:,} | {p['t']:.0f} | {p['rss_mb']:.1f} | "
            f"{_f(p.get('rss_anon_mb'), 1)} | {_f(p.get('rss_file_mb'), 1)} | "
            f"{_f(qmax, 0)} | {_f(cpr, 3)} |"
        )
        prev = p
    lines.append("")
    peak = max(p["rss_mb"] for p in pts)
    at100k = next((p for p in pts if p["done"] >= 100_000), None)
    last = pts[-1]
    goals.append(
        f"| `soakd run` RSS under 80 MB whatever the length | peak {peak:.1f} MB over "
        f"{last['done']:,} requests | {'met' if peak < 80 else 'missed'} |"
    )
    if at100k and last["done"] > at100k["done"]:
        grow = last["rss_mb"] - at100k["rss_mb"]
        verdict = "missed" if grow >= 20 else "met" if last["done"] >= 1_000_000 else "met so far"
        goals.append(
            f"| RSS growth under 20 MB from 100k to 1M | {grow:+.1f} MB from 100k to "
            f"{last['done']:,} | {verdict} |"
        )


def render(results: Path, dest: Path, notes: Path | None = None) -> None:
    closed = _load(results, "closed")
    openloop = _load(results, "openloop")
    endurance = _load(results, "endurance")
    machine: dict[str, Any] = next((d["machine"] for d in (closed, openloop, endurance) if d), {})
    v = versions()
    lines = [
        "# Benchmarks: soakd against GuideLLM, AIPerf and `vllm bench serve`",
        "",
        "Generated by `make bench` (bench/suite.py, bench/report.py) from the latest run of "
        "each section on this machine (`.cache/bench/results/*.json`); here the sections "
        "ran one after another within about two hours, the endurance runs before the GIL "
        "change (a closed loop: the open-loop sleep does not enter). Re-run to refresh.",
        "",
        "## How to reproduce",
        "",
        "```",
        "make bench            # installs the peers "
        "(bench/setup_peers.sh), runs everything (~40 min), writes this page",
        ".venv/bin/python bench/suite.py closed     # one section (closed | openloop | "
        "endurance), then the page",
        ".venv/bin/python bench/suite.py all --quick  # a smoke run in a few minutes",
        "make bench-manycore  # client pinned to one core, soakd run vs the bare loop, no peers "
        "(~3 min): the table of 'Many cores'",
        "```",
        "",
        "## Machine and versions",
        "",
        f"- CPU: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('mem_gib', '?')} GiB; Linux {machine.get('kernel', '?')}; "
        f"run {machine.get('date', '?')[:16]} UTC",
        "- " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- Stub: bench/stub.py, hand-written HTTP/1.1 on asyncio, chunked SSE with "
        "keep-alive like uvicorn/vLLM, one write per token at absolute deadlines kept "
        "with a timerfd, nice -10; it measures its own write lateness (shown below).",
        "- **Caveat:** a 2-core VM shared with other engineers' test runs while this ran "
        f"(1/5/15-min load average at the end of the last section: "
        f"{', '.join(f'{x:.1f}' for x in machine.get('loadavg_at_end', ()))}). Absolute CPU "
        "and latency figures move with that load; the comparisons are ratios within one "
        "run (soakd and the bare loop in interleaved rounds), repeated, and the stub's own "
        "lateness is shown as the floor every client inherits.",
        "",
    ]
    goals: list[str] = []
    if closed:
        closed_tables(closed, lines, goals)
        if closed.get("skipped"):
            lines += [
                "Skipped: " + "; ".join(f"{k}: {w}" for k, w in closed["skipped"].items()),
                "",
            ]
    if openloop:
        openloop_table(openloop, lines, goals)
    if endurance:
        endurance_table(endurance, lines, goals)
    sw = results / "ab_switch.json"
    if sw.exists():
        switch_table(json.loads(sw.read_text()), lines)
    ab = results / "ab_dispatch.json"
    if ab.exists():
        ab_table(json.loads(ab.read_text()), lines)
    lines += manycore_section(results)
    # written by hand from runs this renderer does not make: bench/workers.py (a many-core
    # machine), bench/make_journal.py and bench/endurance.py (hours)
    for name in ("WORKERS.md", "JOURNAL.md", "ENDURANCE.md"):
        hand = ROOT / "bench" / name
        if hand.exists():
            lines += [hand.read_text().rstrip(), ""]
    if notes and notes.exists():
        lines += [notes.read_text().rstrip(), ""]
    notes_default = ROOT / "bench" / "NOTES.md"
    if notes is None and notes_default.exists():
        lines += [notes_default.read_text().rstrip(), ""]
    if goals:
        lines[lines.index("## Machine and versions") : lines.index("## Machine and versions")] = [
            "## Goals (issue 6)",
            "",
            "| goal | measured | |",
            "|---|---|---|",
            *goals,
            "",
        ]
    dest.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    render(
        ROOT / ".cache" / "bench" / "results",
        ROOT / "docs" / "benchmarks.md",
        Path(sys.argv[1]) if len(sys.argv) > 1 else None,
    )
