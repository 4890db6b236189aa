"""GPU processes room: which target a GPU process belongs to (``/proc`` on Linux),
and which mapped processes left the GPU since the last reading.

The NVML source lists the compute processes of each GPU; ``ProcessMap`` names their
target (a configured ``pid`` that is the process or an ancestor, else a ``process_name``
in its or an ancestor's command line) and says which of them vanished, and whether the
process still runs (it only released the GPU) or died.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Protocol

from soakd.gpu.readings import OTHER, ProcMem, Vanished


class MappedTarget(Protocol):
    """What the map reads of a target (a ``TargetConfig``, or the sampler's copy of it)."""

    @property
    def name(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def process_name(self) -> str | None: ...


class NvmlProcess(Protocol):
    """One entry of NVML's process list (``usedGpuMemory`` is read when present)."""

    @property
    def pid(self) -> int: ...


class ProcFs(Protocol):
    """What the process -> target mapping reads about a PID (``/proc`` on Linux)."""

    def cmdline(self, pid: int) -> str: ...
    def ppid(self, pid: int) -> int | None: ...
    def alive(self, pid: int) -> bool: ...


class LinuxProcFs:
    """``/proc``: command line (and comm), parent PID, and whether a PID still runs."""

    def cmdline(self, pid: int) -> str:
        parts = []
        for name in ("cmdline", "comm"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/{name}", "rb") as fh:
                parts.append(fh.read(4096).replace(b"\0", b" ").decode(errors="replace"))
        return " ".join(parts)

    def ppid(self, pid: int) -> int | None:
        fields = self._stat(pid)
        return int(fields[1]) if fields and len(fields) > 1 else None

    def alive(self, pid: int) -> bool:
        """Running, and not a zombie waiting to be reaped."""
        fields = self._stat(pid)
        return bool(fields) and fields[0] not in ("Z", "X")

    @staticmethod
    def _stat(pid: int) -> list[str]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                text = fh.read().decode(errors="replace")
        except OSError:
            return []
        return text.rpartition(")")[2].split()  # after "(comm)": state, ppid, ...


class ProcessMap:
    """GPU processes -> targets, per GPU; remembers the last listing to see who left."""

    def __init__(self, targets: Sequence[MappedTarget] = (), procfs: ProcFs | None = None) -> None:
        self._proc: ProcFs = procfs if procfs is not None else LinuxProcFs()
        self._targets = [t for t in targets if t.pid is not None or t.process_name]
        self._known: dict[int, dict[int, ProcMem]] = {}
        self._mapped: dict[int, str] = {}

    def update(self, i: int, procs: Iterable[NvmlProcess]) -> tuple[list[ProcMem], list[Vanished]]:
        current: dict[int, ProcMem] = {}
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            used_f = None if used is None else float(used)
            prev = current.get(pid)
            if prev is not None:  # several contexts of one process: add them up
                if used_f is not None:
                    used_f += prev.used_bytes or 0.0
                elif prev.used_bytes is not None:
                    used_f = prev.used_bytes
            current[pid] = ProcMem(pid, used_f, self.target_of(pid))
        vanished = []
        for pid, old in self._known.get(i, {}).items():
            if pid not in current:
                vanished.append(Vanished(pid, old.target, old.used_bytes, self._proc.alive(pid)))
                self._mapped.pop(pid, None)
        self._known[i] = current
        return list(current.values()), vanished

    def target_of(self, pid: int) -> str:
        """A configured pid that is the process or its ancestor, else a process_name found
        in its (or an ancestor's) command line. Matches are kept while the PID lives;
        misses are re-read, since servers rename their processes after start."""
        cached = self._mapped.get(pid)
        if cached is not None:
            return cached
        if not self._targets:
            return OTHER
        lineage = [pid]
        p: int | None = pid
        for _ in range(32):
            p = self._proc.ppid(p) if p is not None else None
            if p is None or p <= 1 or p in lineage:
                break
            lineage.append(p)
        for t in self._targets:
            if t.pid is not None and t.pid in lineage:
                self._mapped[pid] = t.name
                return t.name
        cmdlines: list[str] | None = None
        for t in self._targets:
            if not t.process_name:
                continue
            if cmdlines is None:
                cmdlines = [self._proc.cmdline(x).lower() for x in lineage]
            needle = t.process_name.lower()
            if any(needle in c for c in cmdlines):
                self._mapped[pid] = t.name
                return t.name
        return OTHER
