"""bench/suite.py's process sampling, from /proc: the CPU and RSS of a process tree, its CPU by
role (soakd's loop, its other threads, its child processes), a process's memory by mapping,
its threads, and the machine."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


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
