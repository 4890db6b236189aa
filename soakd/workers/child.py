"""Workers room, the sender: ``python -m soakd.workers.child FD``, one per worker.

It builds, sends and times. The parent plans every request (which, when, which seq,
conversation and turn) and hands it over on the socket ``FD``; the worker builds its text
from the workload the HELLO gave it (soakd/workload/build.py), opens its own connection
pool per target, sends each request at its instant, fills the Outcome on its own monotonic clock
and hands the finished ones back in batches (soakd/workers/wire.py). It keeps nothing: no
journal, no registry, no plan.

SIGINT and SIGTERM are ignored: a Ctrl-C reaches the whole process group, and systemd
signals every process of the unit, but the stop is the parent's to run (it drains the
workers through the socket). The parent's end of the socket closing (it exited, even by
SIGKILL) ends the worker: what it still had in flight is cut, and nobody is left to
count it (the parent's journal already holds what was handed back).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
from functools import partial
from typing import Any

import structlog

from soakd import runtime
from soakd.config import TargetConfig, Workload
from soakd.logs import setup_logging
from soakd.model import ErrorKind, MissReason, Outcome, RequestSpec
from soakd.targets.openai import OpenAITarget, open_target
from soakd.types import NotSent
from soakd.workers import wire
from soakd.workload.build import Builder
from soakd.workload.timer import sleep_until_ns

log = structlog.get_logger()
now_ns = time.perf_counter_ns

OUTCOME_WAIT_NS = 2_000_000
"""How long a finished open-loop request may wait to be handed back with others."""


class Sender:
    """One worker's state: its targets, its requests in flight, its outgoing batch."""

    def __init__(self, targets: list[OpenAITarget], writer: asyncio.StreamWriter) -> None:
        self.targets = targets
        self.names = [t.name for t in targets]
        self.writer = writer
        self.shift = 0  # parent clock - this clock (from the parent's clock check)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.outbox = wire.Outbox()

    def start(self, payload: bytes) -> None:
        loop = asyncio.get_running_loop()
        for rid, tidx, spec in wire.unpack_specs(payload, self.names, self.shift):
            task = self.tasks[rid] = loop.create_task(self._one(rid, self.targets[tidx], spec))
            task.add_done_callback(partial(self._done, rid))

    def cancel(self, payload: bytes) -> None:
        for rid in wire.unpack_ids(payload):
            task = self.tasks.get(rid)
            if task is not None:
                task.cancel()

    async def _one(self, rid: int, target: OpenAITarget, spec: RequestSpec) -> None:
        out = Outcome.planned(spec)
        try:
            if spec.scheduled_ns > now_ns():  # handed over ahead of its instant
                await sleep_until_ns(spec.scheduled_ns)
            await target.send(spec, out)
        except NotSent as exc:  # this worker got to it too late: the parent counts it
            wire.pack_not_sent(self.outbox.buf(wire.OUTCOMES), rid, exc.reason)
            return
        except asyncio.CancelledError:
            if not out.sent_ns:  # cut while it waited for its instant: it never went out
                wire.pack_not_sent(self.outbox.buf(wire.OUTCOMES), rid, MissReason.LATE)
                return
            # the parent's drain deadline (or its exit): keep what arrived, say it was cut
            out.error = ErrorKind.CANCELLED
            out.end_ns = out.end_ns or now_ns()
        # a closed-loop stream waits for this outcome to send its next request; an
        # open-loop one is paced by the parent's schedule: it may travel with others
        wait = OUTCOME_WAIT_NS if spec.deadline_ns else 0
        wire.pack_outcome(self.outbox.buf(wire.OUTCOMES, wait), rid, out)

    def _done(self, rid: int, task: asyncio.Task[None]) -> None:
        self.tasks.pop(rid, None)
        if task.cancelled():  # cut before its first step: it never went out
            wire.pack_not_sent(self.outbox.buf(wire.OUTCOMES), rid, MissReason.LATE)

    async def finish(self) -> None:
        """Cut what is still in flight, hand it back, close the targets."""
        for task in list(self.tasks.values()):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        with contextlib.suppress(OSError):
            self.outbox.write_to(self.writer)
            await self.writer.drain()
        for target in self.targets:
            await target.aclose()


async def serve(sock: socket.socket) -> int:
    reader, writer = await asyncio.open_connection(sock=sock)
    first = await wire.read_frame(reader)
    if first is None or first[0] != wire.HELLO:
        return 2
    hello: dict[str, Any] = json.loads(first[1])
    structlog.contextvars.bind_contextvars(worker=hello["index"])
    cfgs = [TargetConfig.model_validate(t) for t in hello["targets"]]
    # this worker builds its requests' text itself, as soakd's own process would
    builder = Builder(
        Workload.model_validate(hello["workload"]),
        [wire.read_calibration(c) for c in hello["calibrations"]],
    )
    targets = [
        await open_target(
            cfg,
            run_id=hello["run_id"],
            on_learn=partial(_tell_closes, writer, i),
            builder=builder,
        )
        for i, cfg in enumerate(cfgs)
    ]
    sender = Sender(targets, writer)
    writer.write(wire.json_frame(wire.READY, {"pid": os.getpid()}))
    gc.freeze()  # start-up's objects live all run: full collections skip them
    flusher = asyncio.create_task(sender.outbox.flush_forever(writer))
    try:
        while (got := await wire.read_frame(reader)) is not None:
            kind, payload = got
            if kind == wire.SEND:
                sender.start(payload)
            elif kind == wire.CANCEL:
                sender.cancel(payload)
            elif kind == wire.PING:
                t0, _ = wire.unpack_clock(payload)
                writer.write(wire.frame(wire.PONG, wire.pack_clock(t0, now_ns())))
            elif kind == wire.CLOCK:
                sender.shift, _ = wire.unpack_clock(payload)
            elif kind == wire.CALIBRATE:
                builder.calibrate(wire.read_calibration(json.loads(payload)))
    except (OSError, wire.WireError) as exc:
        log.warning("worker_link_lost", error=f"{type(exc).__name__}: {exc}")
    finally:
        flusher.cancel()
        await sender.finish()
    return 0


def _tell_closes(writer: asyncio.StreamWriter, target: int, status: int, closes: bool) -> None:
    """What this worker's pool learned about a target's closes after answers, to the parent."""
    if not writer.is_closing():
        writer.write(wire.frame(wire.CLOSES, wire.pack_closes(target, status, closes)))


def main() -> int:
    runtime.prepare_process()  # as `soakd run` does, before any thread allocates
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd = int(sys.argv[1])
    setup_logging(os.environ.get("SOAKD_WORKER_LOG_LEVEL", "info"), "json")
    sock = socket.socket(fileno=fd)
    return asyncio.run(serve(sock))


if __name__ == "__main__":
    sys.exit(main())
