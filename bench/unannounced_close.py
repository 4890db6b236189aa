"""A server that closes every connection after its answer without saying so: what it read
against what soakd counted, and the cost of soakd's learning on a keep-alive server.

The server runs in its own process (raw asyncio): it answers each request with a short
SSE stream (``Content-Length``, no ``Connection: close``) and then closes the socket, at
once or ``--linger-ms`` later (a server that tidies up first: the next request on a
reused connection then crosses the close nearly every time, not only now and then).
soakd runs in this process against it, closed loop, ``--workers`` sender processes, and
the script prints the requests the server read beside soakd's outcomes by kind.
``--simulator`` runs the same loop against the embedded simulator instead (keep-alive)
and prints requests/s.

    .venv/bin/python bench/unannounced_close.py --concurrency 2 --seconds 12
    .venv/bin/python bench/unannounced_close.py --concurrency 64 --workers 2 --linger-ms 10
    .venv/bin/python bench/unannounced_close.py --simulator --concurrency 16 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def serve(linger_s: float) -> None:
    """The closing server: prints ``{"port": N}``, then the count it read on SIGTERM."""
    read = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal read
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            read += 1
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Content-Length: %d\r\n\r\n" % len(STREAM) + STREAM
            )
            await writer.drain()
            if linger_s:
                await asyncio.sleep(linger_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()  # no Connection: close was said

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        print(json.dumps({"read": read}), flush=True)

    asyncio.run(main())


async def soak(base_url: str, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from soakd.run.app import RunOptions, Soak
    from soakd.config import config_from_dict

    target: dict[str, Any] = {
        "name": "t",
        "model": "m",
        "scrape": False,
        "timeouts": {"connect": "2s", "ttft": "3s", "total": "5s"},
    }
    if base_url:
        target["base_url"] = base_url
    else:
        target["simulator"] = "fast"
    cfg = config_from_dict(
        {
            "run": {"name": "close", "drain_timeout": "5s", "workers": args.workers},
            "targets": [target],
            "workload": {"max_tokens": 4},
            "gpu": {"source": "none"},
            "logging": {"level": "warning"},
            "phases": [
                {
                    "name": "p",
                    "duration": f"{args.seconds}s",
                    "load": {"mode": "closed", "concurrency": args.concurrency},
                }
            ],
        }
    )
    app = Soak(cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False))
    result = await app.run()
    text = generate_latest(app.metrics.registry).decode()
    out: dict[str, float] = {"elapsed_s": result.elapsed_s}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "soakd_requests_total":
                key = s.labels["outcome"]
                out[key] = out.get(key, 0) + s.value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--linger-ms", type=float, default=0.0, help="close this long after")
    ap.add_argument("--simulator", action="store_true", help="against the simulator")
    args = ap.parse_args()
    if args.serve:
        serve(args.linger_ms / 1e3)
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.simulator:  # soakd starts it (simulator: fast)
            got = asyncio.run(soak("", args, Path(tmp) / "run"))
            print(json.dumps({"rps": round(got.get("ok", 0) / args.seconds, 1), "by_kind": got}))
            return
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--linger-ms", str(args.linger_ms)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        try:
            got = asyncio.run(soak(f"http://127.0.0.1:{port}", args, Path(tmp) / "run"))
        finally:
            proc.send_signal(signal.SIGTERM)
            tail = proc.stdout.read()
            proc.wait(10)
    counted = sum(v for k, v in got.items() if k != "elapsed_s")
    row: dict[str, Any] = {
        "concurrency": args.concurrency,
        "workers": args.workers,
        "linger_ms": args.linger_ms,
        "soakd_outcomes": int(counted),
        "by_kind": {k: int(v) for k, v in got.items() if k != "elapsed_s"},
        "server_read": json.loads(tail.strip().splitlines()[-1])["read"],
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
