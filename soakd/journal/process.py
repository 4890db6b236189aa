"""Journal process room: ``python -m soakd.journal.process FD PARENT``, the journal's writer,
a process of its own (docs/architecture.md, "The journal's writer is a process of its own").

soakd sends it packets of outcome records (batch.py), samples and events on the socket ``FD``
(link.py); it folds each packet at once and commits every ``journal.flush_interval``
(store.py), then sends each committed batch's fold back: Metrics and RunStats count what the
journal holds, and none of the writer's Python holds soakd's GIL. It imports the standard
library and the journal's own rooms only (~25 MB): no config models, no prometheus_client,
no structlog (its log events go to soakd, which logs them as its own).

It ends with soakd: ``CLOSE`` writes everything and answers ``CLOSED``; the end of the
socket (soakd is gone without a word) commits what it holds; soakd's death, even by SIGKILL,
sends it SIGTERM (``PR_SET_PDEATHSIG``), which ends it at once (WAL: the journal opens at
its last commit). SIGINT is ignored: a Ctrl-C reaches the whole process group, and the stop
is soakd's to run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakd.childlog import forward_to
from soakd.journal import link
from soakd.journal.batch import Batch
from soakd.journal.counts import WriterCounts
from soakd.journal.progress import ClockState
from soakd.journal.records import EventKind, EventRow
from soakd.journal.schema import JournalError
from soakd.journal.store import RunInfo, Store, WriterConfig
from soakd.measure.fold import Fold
from soakd.model import Sample

PR_SET_PDEATHSIG = 1
RECV = 1 << 20


@dataclass(frozen=True)
class Resume:
    """What a resumed run continues from (``progress.Resumed``)."""

    offset_ns: int
    next_seq: dict[str, int]
    last_wall: float


class Sink:
    """The store's folds, to soakd."""

    def __init__(self, out: socket.socket) -> None:
        self.out = out

    def send(self, kind: int, doc: dict[str, Any]) -> None:
        self.out.sendall(link.json_frame(kind, doc))

    def fold(self, f: Fold, through: int, committed: bool) -> None:
        self.send(link.FOLD, {"through": through, "committed": committed, "fold": f.to_doc()})

    def committed(self, through: int) -> None:
        self.send(link.COMMITTED, {"through": through})


def die_with(parent: int) -> None:
    """SIGTERM when soakd dies; gone already (before this was set): exit now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(0)


def add_packet(store: Store, payload: bytes) -> None:
    header, records = link.unpack_packet(payload)
    if header.get("clock") is not None:
        store.clock = ClockState.from_doc(header["clock"])
    samples = [
        Sample(wall, name, value, tuple((str(k), str(v)) for k, v in labels))
        for wall, name, value, labels in header.get("samples", ())
    ]
    events: list[EventRow] = [(w, o, EventKind(k), d) for w, o, k, d in header.get("events", ())]
    tally = Fold.from_doc(header["tally"]) if header.get("tally") else None
    outcomes = Batch.decode(records).outcomes() if records else []
    store.add(
        int(header["seq"]),
        outcomes,
        samples,
        events,
        tally,
        counted=bool(header.get("counted")),
    )


def serve(sock: socket.socket, sink: Sink) -> int:
    frames = link.frames()
    hello: dict[str, Any] | None = None
    while hello is None:
        data = sock.recv(RECV)
        if not data:
            return 2
        for kind, payload in frames.feed(data):
            if kind != link.HELLO:
                return 2
            hello = json.loads(payload)
    counts = WriterCounts()
    resume = Resume(**hello["resume"]) if hello.get("resume") else None
    store = Store(
        Path(hello["path"]),
        RunInfo.from_doc(hello["run"]),
        WriterConfig.of(hello["journal"]),
        sink,
        resume=resume,
        session=int(hello.get("session") or 0),
        counts=counts,
    )
    try:
        restored = store.open()
    except JournalError as exc:
        sink.send(link.FAILED, {"error": str(exc)})
        return 2
    sink.send(
        link.READY,
        {
            "restored": restored.to_doc(),
            "session": store.session,
            "packet_seq": store.packet_seq,
            "pid": os.getpid(),
        },
    )
    interval = store.cfg.flush_interval
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], interval / 4)
            if ready:
                data = sock.recv(RECV)
                if not data:  # soakd is gone without a word: keep what came
                    store.cycle(force=True)
                    return 0
                for kind, payload in frames.feed(data):
                    if kind == link.PACKET:
                        add_packet(store, payload)
                    elif kind == link.CLOSE:
                        store.final()
                        sink.send(link.STATS, counts.drain())
                        sink.send(link.CLOSED, {"unwritten": store.unwritten})
                        return 0
            now = time.monotonic()
            if store.due(now):
                store.cycle(now)
                if stats := counts.drain():
                    sink.send(link.STATS, stats)
    finally:
        store.close()


def main() -> int:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sink = Sink(sock)
    forward_to(lambda level, event, fields: sink.send(link.LOG, {"log": [level, event, fields]}))
    try:
        return serve(sock, sink)
    except (OSError, link.LinkError) as exc:  # soakd's end broke: nobody to tell
        print(f"journal writer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
