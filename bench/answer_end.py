"""Where a streamed answer ends, and what each chunk costs: soakd against the reference
client (`vllm bench serve`'s own request function) on one vLLM server, in one run.

Three measurements, each printed as it is taken and written to --out as JSON:

1. ``trail``: raw reads of N streamed answers (aiohttp, nothing parsed on the way): how long
   the usage chunk and ``[DONE]`` trail the answer's last chunk carrying a choice. That gap
   was inside soakd's E2E until the answer's end was taken at that chunk (docs/metrics.md).
2. ``gap``: client minus server, TTFT and E2E. Rounds alternate soakd's client
   (``soakd.targets.open_target``) and the reference function
   (``vllm.benchmarks.lib.endpoint_request_func.async_request_openai_chat_completions``,
   loaded from .venv-vllm by path) at the same concurrency, prompt and answer length;
   the server's mean over the round is its histograms' sum/count delta
   (``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``).
3. ``chunks``: CPU per chunk of each client's read loop on the bytes recorded in 1 (one
   network read per SSE event, as the server wrote them): soakd's decoder and parser as
   they are now, soakd's as they were at --before (a git revision), and the reference's
   loop body; interleaved rounds, ratios within a round.

    .venv/bin/python bench/answer_end.py --out .cache/bench/answer-end.json
    .venv/bin/python bench/answer_end.py --base-url http://127.0.0.1:8000 --model m

Needs .venv-vllm (scripts/setup-vllm.sh) for the reference function and, without
--base-url, for the vLLM CPU server it starts (tests/vllm_server.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# SOAKD_TREE: another soakd (an older one, for --before-tree's client) is imported instead
sys.path.insert(0, os.environ.get("SOAKD_TREE") or str(ROOT))

import aiohttp  # noqa: E402

from soakd.config import TargetConfig, Timeouts  # noqa: E402
from soakd.model import Outcome, RequestSpec  # noqa: E402
from soakd.targets import open_target  # noqa: E402
from soakd.targets.sse import SSEDecoder  # noqa: E402
from soakd.targets.stream import StreamParser  # noqa: E402

VLLM_SITE = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages"), None)
REF_FILE = "vllm/benchmarks/lib/endpoint_request_func.py"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hum",
]


def prompt(words: int, salt: int) -> str:
    """Distinct prompts (no prefix-cache hits between requests) of ``words`` words."""
    return f"{salt} " + " ".join(WORDS[(salt + i) % len(WORDS)] for i in range(words))


# --- the reference client, loaded from vLLM's own file -------------------------------------


def load_reference() -> types.ModuleType:
    """vLLM's request functions, from its file (not through ``vllm/__init__``): from
    .venv-vllm, else from the vLLM this interpreter finds (a GPU machine's); its imports
    (aiohttp, regex, tqdm) come from soakd's venv first."""
    site = VLLM_SITE
    if site is None or not (site / REF_FILE).exists():
        found = importlib.util.find_spec("vllm")  # finds the package, imports nothing
        if found is None or found.origin is None:
            raise SystemExit("no vLLM to take the reference from (run scripts/setup-vllm.sh)")
        site = Path(found.origin).parents[1]
    sys.path.append(str(site))
    spec = importlib.util.spec_from_file_location("vllm_ref_request", site / REF_FILE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- 1. how long the trailers trail the answer ----------------------------------------------


async def record(
    url: str, model: str, n: int, conc: int, words: int, tokens: int
) -> dict[str, Any]:
    """``n`` answers, ``conc`` at a time, read raw: the first one's network reads as they
    came, and for each the trail of the usage chunk and [DONE] after its last chunk
    carrying a choice (each read stamped once, on arrival)."""
    reads: list[bytes] = []
    usage_ms: list[float] = []
    done_ms: list[float] = []
    seqs = iter(range(n))

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt(words, 10_000 + i)}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        answer = usage = done = 0.0
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            async for raw in resp.content.iter_any():
                now = time.perf_counter()
                if i == 0:
                    reads.append(raw)
                for event in raw.split(b"\n\n"):
                    if not event.startswith(b"data: "):
                        continue
                    data = event[6:]
                    if data == b"[DONE]":
                        done = now
                    elif b'"usage"' in data and b'"choices":[]' in data:
                        usage = now
                    elif b'"choices"' in data:
                        answer = now
        if answer and usage:
            usage_ms.append((usage - answer) * 1e3)
        if answer and done:
            done_ms.append((done - answer) * 1e3)

    async with aiohttp.ClientSession() as session:

        async def stream() -> None:
            for i in seqs:
                await one(session, i)

        await asyncio.gather(*(stream() for _ in range(conc)))
    return {
        "answers": n,
        "concurrency": conc,
        "reads_recorded": len(reads),
        "usage_after_answer_ms": summary(usage_ms),
        "done_after_answer_ms": summary(done_ms),
        "reads": [r.decode() for r in reads],
    }


# --- 2. client minus server -----------------------------------------------------------------

HISTS = {"ttft": "vllm:time_to_first_token_seconds", "e2e": "vllm:e2e_request_latency_seconds"}


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for key, name in HISTS.items():
            for part in ("sum", "count"):
                if line.startswith(f"{name}_{part}"):
                    out[f"{key}_{part}"] = out.get(f"{key}_{part}", 0.0) + float(line.split()[-1])
    return out


async def soakd_round(url: str, model: str, conc: int, n: int, words: int, tokens: int) -> Any:
    cfg = TargetConfig(
        name="v",
        base_url=url,
        model=model,
        extra_body={"ignore_eos": True},
        timeouts=Timeouts(ttft=120.0, total=300.0),
    )
    target = await open_target(cfg)
    outs: list[Outcome] = []
    seqs = iter(range(n))

    async def stream() -> None:
        for seq in seqs:
            spec = RequestSpec("v", "p", seq, prompt(words, seq), words, tokens, 0.0, 0)
            outs.append(await target.send(spec))

    try:
        await asyncio.gather(*(stream() for _ in range(conc)))
    finally:
        await target.aclose()
    ok = [o for o in outs if o.outcome == "ok" and o.first_token_ns is not None]
    return (
        [(o.first_token_ns - o.sent_ns) / 1e9 for o in ok],  # type: ignore[operator]
        [(o.end_ns - o.sent_ns) / 1e9 for o in ok],
        len(outs) - len(ok),
    )


async def reference_round(
    ref: types.ModuleType, url: str, model: str, conc: int, n: int, words: int, tokens: int
) -> Any:
    outs: list[Any] = []
    seqs = iter(range(n))
    async with aiohttp.ClientSession(timeout=ref.AIOHTTP_TIMEOUT) as session:

        async def stream() -> None:
            for seq in seqs:
                inp = ref.RequestFuncInput(
                    prompt=prompt(words, seq),
                    api_url=f"{url}/v1/chat/completions",
                    prompt_len=words,
                    output_len=tokens,
                    model=model,
                    ignore_eos=True,
                )
                outs.append(await ref.async_request_openai_chat_completions(inp, session))

        await asyncio.gather(*(stream() for _ in range(conc)))
    ok = [o for o in outs if o.success]
    return [o.ttft for o in ok], [o.latency for o in ok], len(outs) - len(ok)


async def tree_round(tree: str, url: str, model: str, a: argparse.Namespace) -> Any:
    """soakd's round, run by the soakd in ``tree`` (a subprocess importing it)."""
    argv = [sys.executable, __file__, "--one-round", "--base-url", url, "--model", model]
    argv += ["--concurrency", str(a.concurrency), "--requests", str(a.requests)]
    argv += ["--words", str(a.words), "--tokens", str(a.tokens)]
    env = {**os.environ, "SOAKD_TREE": tree}
    done = await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def gap(ref: types.ModuleType, url: str, model: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    clients: dict[str, Callable[..., Any]] = {
        "soakd": lambda: soakd_round(url, model, a.concurrency, a.requests, a.words, a.tokens),
        "reference": lambda: reference_round(
            ref, url, model, a.concurrency, a.requests, a.words, a.tokens
        ),
    }
    if a.before_tree:  # an older soakd, whole, as a third client
        clients["soakd-before"] = lambda: tree_round(a.before_tree, url, model, a)
    # a warm-up of each, then alternating rounds
    for name in clients:
        asyncio.run(clients[name]())
    for rep in range(a.rounds):
        for name in list(clients) if rep % 2 == 0 else reversed(list(clients)):
            before = scrape(url)
            ttft, e2e, failed = asyncio.run(clients[name]())
            after = scrape(url)
            d = {k: after[k] - before.get(k, 0.0) for k in after}
            server_ttft = d["ttft_sum"] / d["ttft_count"]
            server_e2e = d["e2e_sum"] / d["e2e_count"]
            row = {
                "client": name,
                "round": rep,
                "answers": len(e2e),
                "failed": failed,
                "server_answers": d["e2e_count"],
                "ttft_client_ms": statistics.fmean(ttft) * 1e3,
                "ttft_server_ms": server_ttft * 1e3,
                "e2e_client_ms": statistics.fmean(e2e) * 1e3,
                "e2e_server_ms": server_e2e * 1e3,
            }
            row["ttft_gap_ms"] = row["ttft_client_ms"] - row["ttft_server_ms"]
            row["e2e_gap_ms"] = row["e2e_client_ms"] - row["e2e_server_ms"]
            print(
                f"  {name:9} round {rep}: {row['answers']} answers "
                f"(server {row['server_answers']:.0f}), TTFT client - server "
                f"{row['ttft_gap_ms']:+.2f} ms, E2E client - server {row['e2e_gap_ms']:+.2f} ms",
                flush=True,
            )
            rounds.append(row)
    return rounds


# --- 3. CPU per chunk -------------------------------------------------------------------------


def soakd_loop(parser_cls: type, decoder_cls: type) -> Callable[[list[bytes]], None]:
    """soakd's read loop body (soakd/targets/openai.py ``_read_stream``) on given reads."""
    perf_ns = time.perf_counter_ns

    def run(reads: list[bytes]) -> None:
        out = Outcome("v", "p", 0, 0)
        p = parser_cls(out, True, _NoTimeout(), None, 30.0, float("inf"))
        feed, event = decoder_cls().feed, p.event
        for raw in reads:
            now = perf_ns()
            if out.first_byte_ns is None:
                out.first_byte_ns = now
            for data in feed(raw):
                event(data, now)
            if p.done:
                out.end_ns = now
                break

    return run


def reference_loop(ref: types.ModuleType) -> Callable[[list[bytes]], None]:
    """The reference function's loop body, statement for statement, on given reads."""
    loads, perf = json.loads, time.perf_counter

    def run(reads: list[bytes]) -> None:
        handler = ref.StreamedResponseHandler()
        st = most_recent = perf()
        first = False
        itl: list[float] = []
        text = ""
        for chunk_bytes in reads:
            chunk_bytes = chunk_bytes.strip()
            if not chunk_bytes:
                continue
            for message in handler.add_chunk(chunk_bytes):
                if message.startswith(":"):
                    continue
                chunk = message.removeprefix("data: ")
                if chunk != "[DONE]":
                    timestamp = perf()
                    data = loads(chunk)
                    if choices := data.get("choices"):
                        content = choices[0]["delta"].get("content")
                        if not first:
                            first = True
                            _ = timestamp - st
                        else:
                            itl.append(timestamp - most_recent)
                        text += content or ""
                        most_recent = timestamp
                    elif usage := data.get("usage"):
                        _ = usage.get("completion_tokens")

    return run


class _NoTimeout:
    def reschedule(self, when: float | None) -> None:
        pass


@contextlib.contextmanager
def soakd_at(rev: str) -> Iterator[tuple[type, type] | None]:
    """soakd's StreamParser and SSEDecoder as they were at git revision ``rev`` (None
    without git, or with ``rev`` empty)."""
    with tempfile.TemporaryDirectory() as tmp:
        mods = []
        for name in ("sse", "stream"):
            shown = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:soakd/targets/{name}.py"],
                capture_output=True,
                text=True,
                check=False,
            )
            if not rev or shown.returncode != 0:
                yield None
                return
            src = shown.stdout
            path = Path(tmp) / f"before_{name}.py"
            path.write_text(src)
            spec = importlib.util.spec_from_file_location(f"before_{name}", path)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up
            spec.loader.exec_module(module)
            mods.append(module)
        yield mods[1].StreamParser, mods[0].SSEDecoder


def chunk_cost(ref: types.ModuleType, reads: list[bytes], a: argparse.Namespace) -> dict[str, Any]:
    chunks = sum(r.count(b"\n\n") for r in reads)
    loops = {"soakd": soakd_loop(StreamParser, SSEDecoder), "reference": reference_loop(ref)}
    with soakd_at(a.before) as before_parts:
        if before_parts is not None:
            loops[f"soakd@{a.before}"] = soakd_loop(*before_parts)
        ns: dict[str, list[float]] = {k: [] for k in loops}
        reps = max(1, a.chunk_events // max(chunks, 1))
        for _ in range(a.chunk_rounds):
            for name, loop in loops.items():
                t0 = time.process_time_ns()
                for _ in range(reps):
                    loop(reads)
                ns[name].append((time.process_time_ns() - t0) / (reps * chunks))
    ratios = [s / r for s, r in zip(ns["soakd"], ns["reference"], strict=True)]
    before = [s / b for s, b in zip(ns["soakd"], ns.get(f"soakd@{a.before}", []), strict=False)]
    result = {
        "events_per_answer": chunks,
        "ns_per_chunk": {k: summary(v) for k, v in ns.items()},
        "soakd_over_reference": summary(ratios),
        "soakd_over_before": summary(before),
    }
    for name, v in ns.items():
        print(f"  {name:18} {statistics.median(v):7.0f} ns a chunk (median of {len(v)} rounds)")
    print(
        f"  soakd / reference: {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f})",
        flush=True,
    )
    if before:
        print(f"  soakd now / before: {statistics.median(before):.2f}x", flush=True)
    return result


def clients_of(rounds: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["client"] for r in rounds))


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    s = sorted(values)
    return {
        "n": len(s),
        "mean": statistics.fmean(s),
        "p50": s[len(s) // 2],
        "p99": s[min(len(s) - 1, int(len(s) * 0.99))],
        "min": s[0],
        "max": s[-1],
    }


@contextlib.contextmanager
def server(a: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if a.base_url:
        yield a.base_url.rstrip("/"), a.model
        return
    from tests.vllm_server import start_vllm

    with start_vllm(max_model_len=a.max_model_len, omp_threads=a.omp_threads) as srv:
        yield srv.base_url, srv.model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="a running server (default: start vLLM CPU)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48, help="per round")
    ap.add_argument("--rounds", type=int, default=4, help="per client")
    ap.add_argument("--words", type=int, default=60, help="prompt words")
    ap.add_argument("--tokens", type=int, default=64, help="answer tokens (ignore_eos)")
    ap.add_argument("--trail-answers", type=int, default=40)
    ap.add_argument("--chunk-rounds", type=int, default=7)
    ap.add_argument("--chunk-events", type=int, default=200_000, help="per round and loop")
    ap.add_argument("--before", default="be9c5f6", help="git revision of soakd's 'before'")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--omp-threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--before-tree", help="a directory holding an older soakd/: a third client")
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one_round:  # the subprocess of --before-tree: one soakd round, as JSON
        ttft, e2e, failed = asyncio.run(
            soakd_round(a.base_url, a.model, a.concurrency, a.requests, a.words, a.tokens)
        )
        print(json.dumps([ttft, e2e, failed]))
        return
    ref = load_reference()
    doc: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}}
    with server(a) as (url, model):
        print(f"server {url}, model {model}")
        print(f"1. trail: usage and [DONE] after the answer's last choice, {a.concurrency} streams")
        trail = asyncio.run(record(url, model, a.trail_answers, a.concurrency, a.words, a.tokens))
        for key in ("usage_after_answer_ms", "done_after_answer_ms"):
            s = trail[key]
            if s:
                print(f"  {key}: p50 {s['p50']:.3f} ms, p99 {s['p99']:.3f}, max {s['max']:.3f}")
        doc["trail"] = {k: v for k, v in trail.items() if k != "reads"}
        print(f"2. gap: client minus server, {a.concurrency} streams, {a.tokens}-token answers")
        rounds = gap(ref, url, model, a) if a.rounds else []
        doc["gap"] = rounds
        for name in clients_of(rounds):
            mine = [r for r in rounds if r["client"] == name]
            doc[f"{name}_median"] = {
                k: statistics.median(r[k] for r in mine) for k in ("ttft_gap_ms", "e2e_gap_ms")
            }
            print(f"  {name} median: {doc[f'{name}_median']}")
    print("3. CPU per chunk of the read loop, on the recorded reads")
    reads = [r.encode() for r in trail["reads"]]
    doc["chunks"] = chunk_cost(ref, reads, a)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
