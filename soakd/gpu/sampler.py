"""NVML sampler room: ``python -m soakd.gpu.sampler``, the process soakd reads NVML through.

NVML's own thread, the XID waiter and every driver call run here, not in the process whose
event loop times tokens (``workers: 1``) or plans every send: a driver call holding the GIL,
or a core taken by NVML's thread, delays no timestamp, and NVML's ~28 MB (libnvidia-ml,
libcuda, the driver's thread) are not in that process. It imports only the standard
library, ``soakd.gpu`` and pynvml.

JSON lines. On stdin, from soakd: first ``{"targets": [{name, pid, process_name}],
"required": bool}``, then ``read`` once per reading. On stdout, to soakd: ``{"open": bool}``
once NVML opened (or did not: the reason is logged), then ``{"readings": [...] | null}``
per ``read``, and at any time ``{"xid": [gpu, code]}`` and ``{"log": [level, event,
fields]}`` (soakd logs it as its own). At the end of stdin (soakd closed it, or exited,
even by SIGKILL) NVML is shut down and the process exits. SIGINT is ignored: a Ctrl-C
reaches the whole process group, and the stop is soakd's to run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import dataclass
from typing import Any

from soakd.childlog import ChildLog, forward_to
from soakd.gpu.nvml import NvmlSource
from soakd.gpu.readings import error_text

log = ChildLog()


@dataclass(frozen=True, slots=True)
class Target:
    """A target as the process map reads it (``soakd.gpu.procfs.MappedTarget``)."""

    name: str
    pid: int | None = None
    process_name: str | None = None


def emit(doc: dict[str, Any]) -> None:
    """One line to soakd (only ever from the loop's thread)."""
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


async def serve() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    first = await reader.readline()
    if not first:
        return 2
    hello = json.loads(first)
    source = NvmlSource(
        [Target(**t) for t in hello["targets"]], required=bool(hello.get("required"))
    )
    opened = await source.open(lambda gpu, code: emit({"xid": [gpu, code]}))
    emit({"open": opened})
    if not opened:
        return 0
    try:
        while line := await reader.readline():
            if line.strip() != b"read":
                continue
            try:
                readings = await source.read()
            except Exception as exc:  # a driver surprise must not end the sampler
                log.warning("gpu_read_failed", source="nvml", reason=error_text(exc))
                readings = None
            emit({"readings": None if readings is None else [r.to_doc() for r in readings]})
    finally:
        await source.aclose()
    return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forward_to(lambda level, event, fields: emit({"log": [level, event, fields]}))
    return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
