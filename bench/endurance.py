"""Endurance: ``soakd run`` watched for hours, SIGKILLed and resumed on a schedule.

    .venv/bin/python bench/endurance.py --duration 2h --kill-every 30m --out /tmp/endure/2h
    .venv/bin/python bench/endurance.py --duration 5m --kill-every 2m --out /tmp/endure/try
    .venv/bin/python bench/endurance.py --render /tmp/endure/2h/samples.csv --docs docs/endurance

The run: two targets on the embedded simulator (``fast`` and ``fast-flaky``: 5 % HTTP
500s and early stops), phases cycling for the whole run (``run.loop``): a closed loop
(concurrency 4 per target, ~100 req/s each) and a Poisson open loop (100 req/s per
target), about 200 req/s in all. Every ``--kill-every`` soakd gets a SIGKILL and is
started again on the same run dir (a resume: docs/journal.md).

Every ``--sample-every`` (1 min) one row of samples.csv: soakd's RSS, open fds, threads
(/proc/PID/status), asyncio tasks (``soakd_event_loop_tasks``), CPU seconds per request
over the minute (delta CPU / delta ``soakd_requests_total``, same process only), the
``/metrics`` scrape time and size, journal.db and its WAL, the run's log files, the
simulators' RSS, the run loop's delay and the machine's 1-minute load average (the CPU
figures depend on what else the machine runs). At the end (or with ``--render``): a
markdown table (start, middle, end, slope per hour) and one SVG plot per figure.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

CONFIG = """\
run:
  name: endurance
  loop: true
  duration: {duration_s}s
  drain_timeout: 10s
targets:
  - name: fast
    simulator: fast
    model: m
  - name: flaky
    simulator: fast-flaky
    model: m
workload:
  max_tokens: 32
  prompts:
    source: synthetic
    input_tokens: {{dist: normal, mean: 200, stddev: 50, min: 16, max: 400}}
phases:
  - name: closed
    duration: 60s
    load: {{mode: closed, concurrency: 4}}
  - name: open
    duration: 120s
    load: {{mode: poisson, rate: 100}}
gpu:
  source: none
logging:
  format: json
"""

FIELDS = [
    "t_s",
    "utc",
    "session",
    "pid",
    "rss_mb",
    "fds",
    "threads",
    "tasks",
    "cpu_s",
    "requests",
    "cpu_ms_per_req",
    "req_per_s",
    "scrape_ms",
    "scrape_kb",
    "journal_mb",
    "wal_mb",
    "log_kb",
    "sim_rss_mb",
    "loop_delay_ms",
    "load1",
]
FIGURES = [  # (column, title, unit): what the table and the plots show
    ("rss_mb", "soakd RSS", "MB"),
    ("fds", "open fds", ""),
    ("tasks", "asyncio tasks", ""),
    ("threads", "threads", ""),
    ("cpu_ms_per_req", "CPU per request", "ms"),
    ("req_per_s", "requests per second", "req/s"),
    ("scrape_ms", "/metrics scrape time", "ms"),
    ("scrape_kb", "/metrics size", "KB"),
    ("journal_mb", "journal.db", "MB"),
    ("wal_mb", "journal WAL", "MB"),
    ("log_kb", "log files", "KB"),
    ("sim_rss_mb", "simulators' RSS (both)", "MB"),
    ("load1", "machine load (1 min)", ""),
]
TICK = os.sysconf("SC_CLK_TCK")


def duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def scrape(url: str) -> tuple[float, int, dict[str, float]]:
    """(seconds, bytes, the few soakd figures the samples read)."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    took = time.perf_counter() - start
    figures = {"requests": 0.0}
    for line in body.decode().splitlines():
        if line.startswith("soakd_requests_total{"):
            figures["requests"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(("soakd_event_loop_tasks ", "soakd_event_loop_delay_seconds ")):
            name, value = line.split(" ", 1)
            figures[name] = float(value)
    return took, len(body), figures


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Soakd:
    """One ``soakd run`` process at a time on one run dir."""

    def __init__(self, out: Path, config: Path, port: int) -> None:
        self.out, self.config, self.port = out, config, port
        self.run_dir = out / "run"
        self.proc: subprocess.Popen[bytes] | None = None
        self.session = 0

    def start(self) -> None:
        self.session += 1
        console = (self.out / f"console-{self.session}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "soakd",
                "run",
                str(self.config),
                "--run-dir",
                str(self.run_dir),
                "--metrics-addr",
                f"127.0.0.1:{self.port}",
                "--no-live",
            ],
            stdout=console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        console.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait_ready(self, timeout_s: float = 60) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:  # ready: the run loop has ticked (its task gauge is set)
                _, _, figures = scrape(f"http://127.0.0.1:{self.port}/metrics")
            except OSError:
                figures = {}
            if figures.get("soakd_event_loop_tasks", 0) > 0:
                return True
            time.sleep(0.5)
        return False


def sample(soakd: Soakd, t0: float, last: dict[str, Any] | None) -> dict[str, Any]:
    assert soakd.proc is not None
    pid = soakd.proc.pid
    st = proc_status(pid)
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "utc": time.strftime("%H:%M:%S", time.gmtime()),
        "session": soakd.session,
        "pid": pid,
        "rss_mb": round(int(st["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(st["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "cpu_s": round(cpu_seconds(pid), 2),
    }
    took, nbytes, figures = scrape(f"http://127.0.0.1:{soakd.port}/metrics")
    row |= {
        "scrape_ms": round(took * 1e3, 1),
        "scrape_kb": round(nbytes / 1024, 1),
        "requests": int(figures["requests"]),
        "tasks": int(figures.get("soakd_event_loop_tasks", -1)),
        "loop_delay_ms": round(figures.get("soakd_event_loop_delay_seconds", 0) * 1e3, 1),
    }
    run_dir = soakd.run_dir
    row["journal_mb"] = round(size(run_dir / "journal.db") / 2**20, 1)
    row["wal_mb"] = round(size(run_dir / "journal.db-wal") / 2**20, 2)
    logs = [p for p in run_dir.iterdir() if ".log" in p.name]
    row["log_kb"] = round(sum(size(p) for p in logs) / 1024, 1)
    sims = 0
    for child in children(pid):
        with contextlib.suppress(OSError, KeyError):
            sims += int(proc_status(child)["VmRSS"].split()[0])
    row["sim_rss_mb"] = round(sims / 1024, 1)
    row["load1"] = round(os.getloadavg()[0], 2)
    row["cpu_ms_per_req"] = row["req_per_s"] = ""
    if last is not None and last["pid"] == pid:
        done = row["requests"] - last["requests"]
        span = row["t_s"] - last["t_s"]
        if done > 0:
            row["cpu_ms_per_req"] = round((row["cpu_s"] - last["cpu_s"]) / done * 1e3, 3)
        if span > 0:
            row["req_per_s"] = round(done / span, 1)
    return row


def run(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "endurance.yaml"
    config.write_text(CONFIG.format(duration_s=int(args.duration)))
    soakd = Soakd(out, config, free_port())
    samples = out / "samples.csv"
    events = (out / "events.jsonl").open("a")

    def note(kind: str, **data: Any) -> None:
        events.write(
            json.dumps(
                {
                    "utc": time.strftime("%H:%M:%S", time.gmtime()),
                    "t_s": round(time.monotonic() - t0, 1),
                    "kind": kind,
                    **data,
                }
            )
            + "\n"
        )
        events.flush()
        print(kind, data, flush=True)

    t0 = time.monotonic()
    soakd.start()
    note("started", session=soakd.session, pid=soakd.proc.pid if soakd.proc else None)
    soakd.wait_ready()
    next_kill = args.kill_every
    next_sample = 0.0
    last: dict[str, Any] | None = None
    with samples.open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        while True:
            now = time.monotonic() - t0
            if soakd.proc is not None and soakd.proc.poll() is not None:
                note("exited", rc=soakd.proc.returncode)
                break
            if now >= args.duration + args.grace:
                note("overran: SIGTERM")
                soakd.kill(signal.SIGTERM)
                break
            if now >= next_kill and now < args.duration - 30:
                soakd.kill()
                note("sigkill", session=soakd.session)
                soakd.start()
                ready_at = time.monotonic()
                ok = soakd.wait_ready()
                note(
                    "resumed",
                    session=soakd.session,
                    ready=ok,
                    ready_s=round(time.monotonic() - ready_at, 2),
                )
                next_kill += args.kill_every
                last = None
                continue
            if now >= next_sample:
                try:
                    row = sample(soakd, t0, last)
                except (OSError, ValueError, KeyError) as exc:
                    note("sample_failed", error=f"{type(exc).__name__}: {exc}")
                else:
                    writer.writerow(row)
                    f.flush()
                    last = row
                next_sample += args.sample_every
            time.sleep(0.5)
    events.close()
    return samples


def _num(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


WARM_S = 180.0
"""Samples taken in the first 3 minutes of a session (soakd starting, connections opening,
the simulators warming up) are plotted but left out of the table and the slopes."""


def slope_per_hour(points: list[tuple[int, float, float]]) -> float:
    """Least squares slope within sessions, pooled: each session's own mean is taken out,
    so a restart (RSS back to its start) is not read as a fall, nor the climb after it
    as a rise."""
    by: dict[int, list[tuple[float, float]]] = {}
    for session, x, y in points:
        by.setdefault(session, []).append((x, y))
    num = den = 0.0
    for pts in by.values():
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        num += sum((x - mx) * (y - my) for x, y in pts)
        den += sum((x - mx) ** 2 for x, _ in pts)
    return num / den * 3600 if den else math.nan


def series(rows: list[dict[str, str]], col: str) -> list[tuple[int, float, float]]:
    """(session, t_s, value) of the samples that have the figure."""
    out = []
    for r in rows:
        y = _num(r[col])
        if y is not None and y >= 0:
            out.append((int(r["session"]), float(r["t_s"]), y))
    return out


def warm(rows: list[dict[str, str]], warm_s: float = WARM_S) -> list[dict[str, str]]:
    first: dict[str, float] = {}
    for r in rows:
        first.setdefault(r["session"], float(r["t_s"]))
    return [r for r in rows if float(r["t_s"]) - first[r["session"]] >= warm_s]


COLOURS = ("#1f5fa8", "#d9822b", "#2e8b57", "#8e44ad")


def svg(xs: list[float], ys: list[float], title: str, unit: str, kills: list[float]) -> str:
    """One polyline, axes with min/max labels, dashed lines at the SIGKILLs."""
    return svg_lines(xs, [("", ys)], title, unit, kills)


def svg_lines(
    xs: list[float],
    series: list[tuple[str, list[float]]],
    title: str,
    unit: str,
    kills: list[float],
) -> str:
    """A polyline per series (labelled when there are several) on one scale."""
    w, h, left, right, top, bottom = 640, 220, 60, 15, 28, 30
    x1 = max(xs[-1], 1.0)
    every = [y for _, ys in series for y in ys]
    lo, hi = min(0.0, min(every)), max(every) * 1.1 or 1.0

    def px(x: float) -> float:
        return left + (w - left - right) * x / x1

    def py(y: float) -> float:
        return h - bottom - (h - top - bottom) * (y - lo) / (hi - lo)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13">{title}{f" ({unit})" if unit else ""}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#444"/>',
        f'<text x="{left - 4}" y="{py(hi):.0f}" text-anchor="end">{hi:.4g}</text>',
        f'<text x="{left - 4}" y="{py(lo):.0f}" text-anchor="end">{lo:.4g}</text>',
        f'<text x="{left}" y="{h - 10}">0</text>',
        f'<text x="{w - right}" y="{h - 10}" text-anchor="end">{x1 / 60:.0f} min</text>',
    ]
    parts += [
        f'<line x1="{px(k):.1f}" y1="{top}" x2="{px(k):.1f}" y2="{h - bottom}" '
        f'stroke="#c33" stroke-dasharray="4 3"/>'
        for k in kills
        if k <= x1
    ]
    for n, (label, ys) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'
        )
        if label:
            parts.append(
                f'<text x="{w - right - 150}" y="{top + 12 + 13 * n}" '
                f'fill="{colour}">{label}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def render_mem(mem: Path, docs: Path) -> None:
    """bench/endurance_mem.py's mem.csv: RSS and the allocators' split on one plot."""
    rows = list(csv.DictReader(mem.open()))
    xs = [float(r["t_s"]) for r in rows]
    series = [
        (label, [float(r[col]) for r in rows])
        for col, label in (
            ("rss_anon_mb", "RssAnon"),
            ("in_use_mb", "glibc in use"),
            ("free_mb", "glibc free (kept)"),
        )
    ]
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "mem.svg").write_text(
        svg_lines(xs, series, "never killed: RssAnon and glibc", "MB", [])
    )


def render(samples: Path, docs: Path, warm_s: float = WARM_S) -> str:
    rows = list(csv.DictReader(samples.open()))
    events = samples.with_name("events.jsonl")
    kills = []
    if events.exists():
        kills = [float(e["t_s"]) for e in map(json.loads, events.open()) if e["kind"] == "sigkill"]
    docs.mkdir(parents=True, exist_ok=True)
    lines = [
        "| figure | start | middle | end | min - max | slope per hour (within sessions) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    steady = warm(rows, warm_s)
    for col, title, unit in FIGURES:
        pts = series(rows, col)
        if not pts:
            continue
        xs, ys = [x for _, x, _ in pts], [y for _, _, y in pts]
        (docs / f"{col}.svg").write_text(svg(xs, ys, title, unit, kills))
        wpts = series(steady, col)
        if not wpts:
            continue
        wy = [y for _, _, y in wpts]
        mid = min(range(len(wpts)), key=lambda i: abs(wpts[i][1] - xs[-1] / 2))
        u = f" {unit}" if unit else ""
        lines.append(
            f"| [{title}]({docs.name}/{col}.svg) | {wy[0]:.4g}{u} | {wy[mid]:.4g}{u} | "
            f"{wy[-1]:.4g}{u} | {min(wy):.4g} - {max(wy):.4g} | {slope_per_hour(wpts):+.3g}{u} |"
        )
    table = "\n".join(lines) + "\n"
    (docs / "table.md").write_text(table)
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=duration, default=7200.0, help="e.g. 2h, 5m")
    p.add_argument("--kill-every", type=duration, default=1800.0)
    p.add_argument("--sample-every", type=duration, default=60.0)
    p.add_argument(
        "--grace",
        type=duration,
        default=300.0,
        help="after --duration plus the resumes' downtime, SIGTERM",
    )
    p.add_argument(
        "--warm",
        type=duration,
        default=WARM_S,
        help="the start of each session left out of the table (default 3m)",
    )
    p.add_argument("--out", default="/tmp/endure/run")
    p.add_argument("--docs", default=None, help="write table.md and the SVGs here")
    p.add_argument("--render", default=None, metavar="CSV", help="only render these samples")
    p.add_argument(
        "--mem",
        default=None,
        metavar="CSV",
        help="also plot bench/endurance_mem.py's mem.csv (mem.svg)",
    )
    args = p.parse_args()
    samples = Path(args.render) if args.render else run(args)
    docs = Path(args.docs) if args.docs else samples.parent / "docs"
    print(render(samples, docs, args.warm))
    if args.mem:
        render_mem(Path(args.mem), docs)


if __name__ == "__main__":
    main()
