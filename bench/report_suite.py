"""docs/benchmarks.md's tables of bench/suite.py's sections: overhead and timing accuracy
(closed), open-loop fidelity (openloop), RSS over a long run (endurance), and the two A/B
tables kept from earlier runs (timerfd sleep, GIL switch interval). Each appends its lines
and its goals' rows."""

from __future__ import annotations

from typing import Any

from report_format import LABEL, ORDER, _f, _med, _spread


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
