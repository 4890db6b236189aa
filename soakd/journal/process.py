"""Journal process room: ``python -m soakd.journal.process FD PARENT``, the journal's writer,
a process of its own (docs/architecture.md, "The journal's writer is a process of its own").

soakd sends it packets of outcome records (batch.py), samples and events on the socket ``FD``
(messages.py); it folds each packet at once and commits every ``journal.flush_interval``
(store.py), then sends each committed batch's fold back: Metrics and RunStats count what the
journal holds, and none of the writer's Python holds soakd's GIL. It imports the standard
library and the journal's own rooms only (~25 MB): no config models, no prometheus_client,
no structlog (its log events go to soakd, which logs them as its own).

It ends with soakd: ``CLOSE`` writes everything and answers ``CLOSED``; the end of the
socket (soakd is gone without a word) commits what it holds; soakd's death, even by SIGKILL,
sends it SIGTERM (``PR_SET_PDEATHSIG``: soakd/lifeline.py), which ends it at once (WAL: the
journal opens at its last commit). SIGINT is ignored: a Ctrl-C reaches the whole process
group, and the stop is soakd's to run.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from soakd.childlog import forward_to
from soakd.journal import messages as m
from soakd.journal.batch import Batch
from soakd.journal.counts import WriterCounts
from soakd.journal.schema import JournalError
from soakd.journal.store import Store
from soakd.lifeline import die_with_parent
from soakd.measure.fold import Fold

RECV = 1 << 20


class Sink:
    """The store's folds, to soakd."""

    def __init__(self, out: socket.socket) -> None:
        self.out = out

    def send(self, msg: m.Message) -> None:
        self.out.sendall(m.encode(msg))

    def fold(self, f: Fold, through: int, committed: bool) -> None:
        self.send(m.Folded(f, through, committed))

    def committed(self, through: int) -> None:
        self.send(m.Committed(through))


def add_packet(store: Store, packet: m.Packet) -> None:
    if packet.clock is not None:
        store.clock = packet.clock
    outcomes = Batch.decode(packet.records).outcomes() if packet.records else []
    store.add(
        packet.seq,
        outcomes,
        packet.samples,
        packet.events,
        packet.tally,
        counted=packet.counted,
    )


def serve(sock: socket.socket, sink: Sink) -> int:
    frames = m.frames()
    hello: m.Hello | None = None
    while hello is None:
        data = sock.recv(RECV)
        if not data:
            return 2
        for kind, payload in frames.feed(data):
            msg = m.decode(kind, payload)
            if not isinstance(msg, m.Hello):
                return 2
            hello = msg
    counts = WriterCounts()
    try:
        store = Store.open(
            Path(hello.path),
            hello.run,
            hello.journal,
            sink,
            resume=hello.resume,
            session=hello.session,
            counts=counts,
        )
    except JournalError as exc:
        sink.send(m.Failed(str(exc)))
        return 2
    sink.send(m.Ready(store.restored, store.session, store.packet_seq, os.getpid()))
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
                    msg = m.decode(kind, payload)
                    if isinstance(msg, m.Packet):
                        add_packet(store, msg)
                    elif isinstance(msg, m.Close):
                        store.final()
                        sink.send(counts.drain())
                        sink.send(m.Closed(store.unwritten))
                        return 0
            now = time.monotonic()
            if store.due(now):
                store.cycle(now)
                if stats := counts.drain():
                    sink.send(stats)
    finally:
        store.close()


def main() -> int:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    die_with_parent(parent)  # started from soakd's link thread: no preexec_fn
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sink = Sink(sock)
    forward_to(lambda level, event, fields: sink.send(m.Log(level, event, fields)))
    try:
        return serve(sock, sink)
    except (OSError, m.LinkError) as exc:  # soakd's end broke: nobody to tell
        print(f"journal writer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
