"""Outcome records bench: what one outcome from a sender worker costs soakd's process, step
by step, in the tree on ``PYTHONPATH`` (so two trees can be compared, interleaved):

    PYTHONPATH=. .venv/bin/python bench/record_bench.py --tokens 16 --json out.json
    PYTHONPATH=/tmp/base .venv/bin/python bench/record_bench.py --tokens 16

- ``read``: the pool reads a worker's ``OUTCOMES`` frame into the runner's Outcomes
  (``Worker.finished``: the frame unpacked, each waiter woken), on the loop;
- ``pack``: the journal's link thread puts them in a packet (``Batch``, or ``Columns``
  before the records: ``add`` and ``encode``);
- ``decode``: the writer process rebuilds the Outcomes from the packet (off soakd's GIL).

Frames of 32 outcomes (a busy worker's), packets of 2,000 (``MAX_PACKET``); CPU time of
the calling thread per outcome, the best of ``--repeat`` passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from journal_bench import outcomes

from soakd.model import Outcome
from soakd.workers import wire
from soakd.workers.pool import Wakeups, Worker

try:
    from soakd.journal.batch import Batch as Packet
except ImportError:  # the tree before the records
    from soakd.journal.batch import Columns as Packet  # type: ignore[attr-defined,no-redef]

FRAME = 32
PACKET = 2000


def frames(pool: list[Outcome]) -> list[bytes]:
    out = []
    for at in range(0, len(pool), FRAME):
        buf = bytearray()
        for i, o in enumerate(pool[at : at + FRAME]):
            wire.pack_outcome(buf, at + i + 1, o)
        out.append(bytes(buf))
    return out


def one_pass(pool: list[Outcome], payloads: list[bytes]) -> dict[str, float]:
    async def read() -> tuple[list[Outcome], float]:
        w, wake = Worker(0), Wakeups()
        loop = asyncio.get_running_loop()
        got: list[Outcome] = []
        spent = 0.0
        for at, payload in zip(range(0, len(pool), FRAME), payloads, strict=True):
            for i, o in enumerate(pool[at : at + FRAME]):
                out = Outcome(o.target, o.phase, o.seq, o.scheduled_ns)
                w.pending[at + i + 1] = (out, loop.create_future(), False)
                got.append(out)
            t = time.thread_time()
            w.finished(payload, None, wake)
            spent += time.thread_time() - t
        return got, spent

    got, read_s = asyncio.run(read())
    pack_s = decode_s = 0.0
    for at in range(0, len(got), PACKET):
        t = time.thread_time()
        packet = Packet()
        for o in got[at : at + PACKET]:
            packet.add(o)
        data = packet.encode()
        pack_s += time.thread_time() - t
        t = time.thread_time()
        back = list(Packet.decode(data).outcomes())
        decode_s += time.thread_time() - t
        assert len(back) == len(got[at : at + PACKET])
    n = len(pool)
    return {"read": read_s / n * 1e6, "pack": pack_s / n * 1e6, "decode": decode_s / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20_000)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="append the figures (one JSON a line)")
    a = ap.parse_args()
    pool = outcomes(a.n, a.tokens)
    payloads = frames(pool)
    passes = [one_pass(pool, payloads) for _ in range(a.repeat)]
    best: dict[str, Any] = {k: round(min(p[k] for p in passes), 3) for k in passes[0]}
    best.update(tokens=a.tokens, n=a.n, packet=Packet.__name__)
    print(json.dumps(best))
    if a.json is not None:
        with a.json.open("a") as f:
            f.write(json.dumps(best) + "\n")


if __name__ == "__main__":
    main()
