"""A cheap, exact OpenAI-compatible streaming stub: the known truth for bench/.

Hand-written HTTP/1.1 on asyncio Protocols (no framework): keep-alive, chunked SSE
like uvicorn/vLLM (or close-delimited with ``--framing close``), TCP_NODELAY, one
write per token. ``/v1/chat/completions`` and ``/v1/completions``, streamed or not;
``GET /v1/models``, ``/health``.

Timing truth. Every token of a request is due at an absolute instant measured from
the moment the request's body was read: token i (0-based) at ``ttft + i * itl``.
asyncio's own timers wake through epoll with millisecond resolution (a sleep can be
up to 1 ms late), so the stub keeps its deadlines in a heap behind one Linux
``timerfd`` (ns resolution, armed at the earliest deadline): tokens leave within
tens of microseconds of their instant. Each worker measures how late every write
really was and writes it to ``--stats-dir`` on exit, so a benchmark can show the
stub's own error next to the clients'.

Token count: ``max_tokens`` (or ``max_completion_tokens``) from the request, else
``--tokens``; with ``--eos-after N`` a request stops after N tokens unless it sends
``ignore_eos: true``. Every token is the text " the" (one token for Llama/GPT BPE
tokenizers, so a client counting with a tokenizer agrees with ``usage``). ``usage``
is sent with ``stream_options.include_usage`` (as vLLM does) and always in a
non-streamed answer.

    .venv/bin/python bench/stub.py --port 8000 --ttft 0.05 --itl 0.005 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import mmap
import os
import signal

# the server: stub_server.py (its timer: stub_timers.py, its statistics: stub_stats.py)
from stub_server import Config, State, _listen, _serve
from stub_stats import merge_stats, read_counter

# the harness's readers of --counter-file and --stats-dir, importable from here as before
__all__ = ["main", "merge_stats", "read_counter"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: pick a free one (printed)")
    ap.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    ap.add_argument("--itl", type=float, default=0.005, help="seconds between tokens")
    ap.add_argument("--tokens", type=int, default=16, help="when the request has no max_tokens")
    ap.add_argument(
        "--eos-after",
        type=int,
        default=0,
        help="stop after N tokens unless the request sets ignore_eos",
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--framing", choices=["chunked", "close"], default="chunked")
    ap.add_argument("--workers", type=int, default=1, help="processes (SO_REUSEPORT)")
    ap.add_argument("--stats-dir", help="each worker writes its lateness stats here on exit")
    ap.add_argument("--counter-file", help="live (done, tokens) per worker: u64 pairs, mmapped")
    ap.add_argument(
        "--arrivals",
        action="store_true",
        help="record every request's arrival (ns) to --stats-dir on exit",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="lower (negative: raise) the stub's nice value, so it wakes on time "
        "on a busy machine; ignored when not permitted",
    )
    ap.add_argument(
        "--imprecise",
        action="store_true",
        help="use asyncio's timers (about 1 ms late) instead of timerfd",
    )
    a = ap.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        ap.error("the stub listens on loopback only")
    cfg = Config(a)
    if a.nice:
        with contextlib.suppress(OSError):
            os.nice(a.nice)
    first = _listen(a.host, a.port)
    port = first.getsockname()[1]
    if a.stats_dir:
        os.makedirs(a.stats_dir, exist_ok=True)
    socks = [first] + [_listen(a.host, port) for _ in range(a.workers - 1)]
    counter = None
    if a.counter_file:
        with open(a.counter_file, "wb") as f:
            f.write(bytes(16 * a.workers))
        with open(a.counter_file, "r+b") as rw:
            counter = mmap.mmap(rw.fileno(), 16 * a.workers)
    print(
        f"stub listening on http://{a.host}:{port} (ttft {a.ttft * 1e3:g} ms, "
        f"itl {a.itl * 1e3:g} ms, {a.workers} worker(s), {a.framing})",
        flush=True,
    )
    if a.workers == 1:
        path = os.path.join(a.stats_dir, f"worker-{os.getpid()}.json") if a.stats_dir else None
        asyncio.run(_serve(cfg, first, path, not a.imprecise, State(counter, 0, a.arrivals)))
        return
    pids = []
    for slot, sock in enumerate(socks):
        pid = os.fork()
        if pid == 0:
            for other in socks:
                if other is not sock:
                    other.close()
            path = os.path.join(a.stats_dir, f"worker-{os.getpid()}.json") if a.stats_dir else None
            try:
                asyncio.run(
                    _serve(cfg, sock, path, not a.imprecise, State(counter, slot, a.arrivals))
                )
            finally:
                os._exit(0)
        pids.append(pid)
    for sock in socks:
        sock.close()

    def forward(sig: int, _frame: object) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for pid in pids:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break


if __name__ == "__main__":
    main()
