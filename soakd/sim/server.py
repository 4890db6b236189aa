"""Simulator room: the OpenAI-compatible HTTP face of the simulator, shaped like vLLM.

One engine task steps the pure scheduler model (``engine.py``) in real time and
hands tokens to the request handlers; the handlers speak vLLM's wire format
byte for byte where soak tests look (SSE chunks, usage, error bodies, /health,
/metrics). Nothing per request outlives the request, so memory stays flat. What the
bytes are (parsing, error bodies, SSE frames) is ``wire.py``'s; the serving is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from aiohttp import web
from prometheus_client import generate_latest

from soakd.profiles import Profile, get_profile
from soakd.sim.engine import Engine, TokenEvent
from soakd.sim.exposition import (
    CardIdentity,
    EngineGauges,
    VllmMetrics,
    make_registry,
    render_dcgm,
)
from soakd.sim.gpu import GpuModel
from soakd.sim.wire import (
    DONE,
    SSE_CONTENT_TYPE,
    VOCAB,
    VOCAB_JSON,
    ApiError,
    Frames,
    SimRequest,
    answer_pieces,
    completion_body,
    error_body,
    error_response,
    parse,
    tokenize,
    word,
    wrong,
)

log = structlog.get_logger()

_MAX_LAG_S: Final = 0.25  # behind schedule by more than this: resync instead of bursting
_METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True, eq=False)
class _Stream:
    """One in-flight request as the engine task and its handler share it."""

    seq_id: int
    prompt_tokens: int
    arrival: float
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ready: int = 0  # tokens the engine has produced so far
    finish: str | None = None  # "stop" | "length" | "error", with (or after) the last token
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    pieces: list[str] | None = None  # a check's answer, token by token, as JSON strings
    words_from: int = -1  # what its words follow from (word()): its id, or its prompt's


class _Runtime:
    """The engine, the card, the metrics and the in-flight streams of one app."""

    def __init__(self, profile: Profile, model: str) -> None:
        self.profile = profile
        self.model = model
        self.clock = time.monotonic
        self.engine = Engine(profile)
        self.gpu = GpuModel(profile, self.clock())
        self.card = CardIdentity.for_profile(profile)
        self.registry = make_registry()
        engine = self.engine
        self.metrics = VllmMetrics(
            self.registry,
            profile,
            model,
            EngineGauges(
                running=lambda: engine.num_running,
                waiting=lambda: engine.num_waiting,
                kv_usage=lambda: engine.kv_usage,
            ),
        )
        self.created = int(time.time())
        self.started = self.clock()  # the drift faults count from here (docs/checks.md)
        self.dead = False
        self._rng = random.Random(profile.seed + 1)  # faults; the engine has its own
        self._streams: dict[int, _Stream] = {}
        self._wake = asyncio.Event()

    async def lifetime(self, _app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup context: the engine task lives exactly as long as the app."""
        self.gpu = GpuModel(self.profile, self.clock())  # the leak clock starts now
        task = asyncio.create_task(self._drive(), name="soakd-sim-engine")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # -- requests -----------------------------------------------------------------

    def refuse(self) -> web.Response | None:
        """The error vLLM would answer at arrival (dead engine, OOM, injected fault)."""
        if self.dead:
            return error_response(
                503,
                "ServiceUnavailableError",
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            )
        p = self.profile
        engine = self.engine
        batch = min(engine.num_running + engine.num_waiting + 1, p.max_num_seqs)
        now = self.clock()
        too_big = p.oom_above_running is not None and batch > p.oom_above_running
        if too_big or self.gpu.vram_exhausted(now, batch):
            self.metrics.success["error"].inc()
            log.debug("sim_oom", batch=batch)
            return error_response(500, "InternalServerError", self._oom_message(now, batch))
        if p.error_rate > 0.0 and self._rng.random() < p.error_rate:
            self.metrics.success["error"].inc()
            return error_response(500, "InternalServerError", "Internal server error")
        return None

    def _oom_message(self, now: float, batch: int) -> str:
        """torch's OutOfMemoryError text, as vLLM passes it on."""
        total = self.profile.vram_total_mib
        used = min(self.gpu.vram_used_mib(now, batch), total)
        free = total - used
        return (
            f"CUDA out of memory. Tried to allocate {max(20.0, free + 2.0):.2f} MiB. "
            f"GPU 0 has a total capacity of {total / 1024:.2f} GiB of which {free:.2f} MiB "
            f"is free. Including non-PyTorch memory, this process has {used / 1024:.2f} GiB "
            "memory in use."
        )

    def new_request_id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-{self._rng.getrandbits(128):032x}"

    def drifted(self, after_s: float | None) -> bool:
        return after_s is not None and self.clock() - self.started >= after_s

    def answer_model(self) -> tuple[str, str | None]:
        """The ``model`` and ``system_fingerprint`` the answers carry: the served one (and
        none, as vLLM), or another after the switch."""
        if self.drifted(self.profile.model_switch_after_s):
            return self.profile.drift_model, self.profile.drift_fingerprint
        return self.model, None

    def submit(self, req: SimRequest) -> _Stream:
        pieces = None
        max_tokens, ignore_eos = req.max_tokens, req.ignore_eos
        wrong_now = self.drifted(self.profile.wrong_answers_after_s)
        if req.answer is not None:  # a check: its answer, right until the drift fault
            said = answer_pieces(wrong(req.answer) if wrong_now else req.answer)
            pieces = [json.dumps(p) for p in said]
            max_tokens, ignore_eos = min(max_tokens, len(pieces)), True
        elif req.words_from is not None and wrong_now:  # temperature 0: the words reversed
            pieces = [
                VOCAB_JSON[word(req.words_from, max_tokens - 1 - i)] for i in range(max_tokens)
            ]
        seq_id = self.engine.submit(
            req.prompt_tokens, max_tokens, ignore_eos=ignore_eos, min_tokens=req.min_tokens
        )
        words_from = seq_id if req.words_from is None else req.words_from
        st = _Stream(seq_id, req.prompt_tokens, self.clock(), pieces=pieces, words_from=words_from)
        self._streams[seq_id] = st
        self.metrics.params_max_tokens.observe(req.max_tokens)
        self._wake.set()
        return st

    def release(self, st: _Stream) -> None:
        """The handler is done: forget the stream; abort it in the engine if unfinished."""
        if self._streams.pop(st.seq_id, None) is not None and st.finish is None:
            self.engine.abort(st.seq_id)
            self.metrics.success["abort"].inc()

    # -- the engine task ----------------------------------------------------------

    async def _drive(self) -> None:
        try:
            await self._run_steps()
        except Exception:
            # A bug in the model must not hang every client: fail them, as a dead
            # vLLM engine does, and answer 503 from now on.
            log.exception("sim_engine_crashed")
            self.dead = True
            for st in self._streams.values():
                if st.finish is None:
                    st.finish = "error"
                    self.metrics.success["error"].inc()
                    st.wake.set()

    async def _run_steps(self) -> None:
        engine, gpu, clock, m = self.engine, self.gpu, self.clock, self.metrics
        deadline = clock()
        while True:
            if not engine.has_work():
                gpu.set_activity(clock(), 0, busy=False)
                self._wake.clear()
                await self._wake.wait()
                deadline = clock()
            start = clock()
            step = engine.step()
            gpu.set_activity(start, engine.num_running, busy=True)
            for seq_id in step.scheduled:
                st = self._streams.get(seq_id)
                if st is not None and st.scheduled_at is None:
                    st.scheduled_at = start
            if step.preempted:
                m.preemptions.inc(len(step.preempted))
            m.iteration_tokens.observe(step.batch_tokens)
            # Sleep to an absolute deadline so that per-sleep overhead does not add
            # up; after a long stall (a blocked loop) resync rather than burst.
            deadline += step.duration_s
            now = clock()
            if deadline < now - _MAX_LAG_S:
                deadline = now
            await asyncio.sleep(max(0.0, deadline - now))
            self._deliver(step.tokens, clock())

    def _deliver(self, tokens: Sequence[TokenEvent], now: float) -> None:
        m = self.metrics
        for ev in tokens:
            st = self._streams.get(ev.seq_id)
            if st is None:
                continue  # aborted while the step ran
            if st.first_token_at is None:
                st.first_token_at = now
                m.ttft.observe(now - st.arrival)
                m.prompt_tokens.inc(st.prompt_tokens)
            else:
                m.itl.observe(now - st.last_token_at)
            st.last_token_at = now
            st.ready += 1
            if ev.finish is not None:
                st.finish = ev.finish
                self._observe_finished(st, now)
            st.wake.set()

    def _observe_finished(self, st: _Stream, now: float) -> None:
        m = self.metrics
        scheduled = st.scheduled_at if st.scheduled_at is not None else st.arrival
        first = st.first_token_at if st.first_token_at is not None else now
        m.success[st.finish or "stop"].inc()
        m.e2e.observe(now - st.arrival)
        m.queue_time.observe(scheduled - st.arrival)
        m.prefill_time.observe(first - scheduled)
        m.decode_time.observe(now - first)
        m.inference_time.observe(now - scheduled)
        m.request_prompt_tokens.observe(st.prompt_tokens)
        m.request_generation_tokens.observe(st.ready)
        if st.ready > 1:
            m.tpot.observe((now - first) / (st.ready - 1))


RUNTIME: Final = web.AppKey("soakd_sim_runtime", _Runtime)
SIM_VERSION: Final = "0.32.0+soakd-sim"
"""What ``/version`` answers: vLLM's version the wire format follows (wire.py), marked."""


async def _stream_response(
    request: web.Request, rt: _Runtime, st: _Stream, req: SimRequest, frames: Frames
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
    await resp.prepare(request)
    sent = 0
    try:
        while True:
            while st.ready == sent and st.finish is None:
                st.wake.clear()
                await st.wake.wait()
            done = st.finish is not None
            ready = st.ready
            if ready > sent:
                parts = [frames.role] if sent == 0 and frames.role else []
                ok_finish = st.finish if st.finish in ("stop", "length") else None
                if ok_finish and st.pieces is not None and ready == len(st.pieces):
                    ok_finish = "stop"  # a check's answer said whole
                for i in range(sent, ready):
                    finish = ok_finish if done and i == ready - 1 else None
                    if st.pieces is not None:
                        parts.append(frames.text(st.pieces[i], finish).encode())
                    else:
                        parts.append(frames.token(word(st.words_from, i), finish).encode())
                await resp.write(b"".join(parts))
                # Counted once written, so the counter equals what clients received.
                rt.metrics.generation_tokens.inc(ready - sent)
                sent = ready
            if done:
                break
        if st.finish == "error":
            error = error_body(500, "InternalServerError", "Internal server error")
            await resp.write(f"data: {error}\n\n".encode() + DONE)
        else:
            tail = frames.usage(st.prompt_tokens, sent) if req.include_usage else b""
            await resp.write(tail + DONE)
        await resp.write_eof()
    except ConnectionResetError:
        log.debug("sim_client_gone", seq_id=st.seq_id, sent=sent)
    return resp


async def _full_response(
    rt: _Runtime, st: _Stream, req: SimRequest, request_id: str
) -> web.Response:
    while st.finish is None:
        st.wake.clear()
        await st.wake.wait()
    if st.finish == "error":
        return error_response(500, "InternalServerError", "Internal server error")
    n = st.ready
    if st.pieces is not None:
        text = "".join(json.loads(p) for p in st.pieces[:n])
    else:
        text = "".join(VOCAB[word(st.words_from, i)] for i in range(n))
    created = int(time.time())
    finish = st.finish
    model, fingerprint = rt.answer_model()
    body = completion_body(req.chat, request_id, created, model, text, finish, st.prompt_tokens, n)
    body["system_fingerprint"] = fingerprint
    rt.metrics.generation_tokens.inc(n)
    return web.json_response(body)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    try:
        req = parse(await _json(request), chat, rt.profile, rt.model)
    except ApiError as exc:
        return exc.response()
    refused = rt.refuse()
    if refused is not None:
        return refused
    request_id = rt.new_request_id(chat)
    st = rt.submit(req)
    try:
        if req.stream:
            frames = Frames(chat, request_id, int(time.time()), *rt.answer_model())
            return await _stream_response(request, rt, st, req, frames)
        return await _full_response(rt, st, req, request_id)
    finally:
        rt.release(st)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _models(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    card = {
        "id": rt.model,
        "object": "model",
        "created": rt.created,
        "owned_by": "vllm",
        "root": rt.model,
        "parent": None,
        "max_model_len": rt.profile.max_model_len,
        "permission": [],
    }
    return web.json_response({"object": "list", "data": [card]})


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's /tokenize (soakd calibrates its prompts with it): the simulator's count."""
    rt = request.app[RUNTIME]
    try:
        return web.json_response(tokenize(await _json(request), rt.profile, rt.model))
    except ApiError as exc:
        return exc.response()


async def _json(request: web.Request) -> Any:
    """The request's JSON body, or vLLM's 400 for one that does not decode."""
    try:
        return await request.json()
    except ValueError:
        raise ApiError(400, "BadRequestError", "JSON decode error") from None


async def _version(_request: web.Request) -> web.Response:
    """vLLM's ``GET /version``: the version whose wire format the simulator speaks."""
    return web.json_response({"version": SIM_VERSION})


async def _health(request: web.Request) -> web.Response:
    """Empty 200 while the engine runs, 503 once it died: as vLLM's /health."""
    return web.Response(status=503 if request.app[RUNTIME].dead else 200)


async def _metrics(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    sample = rt.gpu.sample(rt.clock(), rt.engine.num_running)
    body = generate_latest(rt.registry) + render_dcgm(sample, rt.card).encode()
    return web.Response(body=body, headers={"Content-Type": _METRICS_CONTENT_TYPE})


def make_app(profile: Profile, model: str = "soakd-sim") -> web.Application:
    """The simulator as an aiohttp app; its engine task starts and stops with the app."""
    app = web.Application(client_max_size=16 * 1024 * 1024)
    runtime = _Runtime(profile, model)
    app[RUNTIME] = runtime
    app.cleanup_ctx.append(runtime.lifetime)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    return app


@dataclass(slots=True)
class SimServer:
    """A running simulator; ``port`` is the bound one (useful with port 0)."""

    host: str
    port: int
    profile: Profile
    app: web.Application
    _runner: web.AppRunner

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def aclose(self) -> None:
        """Stop listening; in-flight streams get a second to finish, then are cut."""
        await self._runner.cleanup()


async def start_sim(host: str, port: int, profile: Profile, model: str = "soakd-sim") -> SimServer:
    """Start the simulator on ``host:port`` (0 picks a free port) and return its handle."""
    app = make_app(profile, model)
    # handler_cancellation: a client that hangs up aborts its request, as in vLLM.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
    except BaseException:
        await runner.cleanup()
        raise
    return SimServer(host=host, port=int(bound), profile=profile, app=app, _runner=runner)


async def run_sim(
    host: str,
    port: int,
    profile_name: str,
    model: str,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve the named profile until cancelled; logs the bound URL, then sets ``ready``."""
    profile = get_profile(profile_name)
    server = await start_sim(host, port, profile, model)
    try:
        log.info(
            "sim_listening",
            url=server.url,
            port=server.port,
            profile=profile.name,
            model=model,
            description=profile.description,
        )
        if ready is not None:
            ready.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # `docker stop`, Ctrl-C: a clean exit 0
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.aclose()
        log.info("sim_stopped", url=server.url)
