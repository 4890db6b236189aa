"""Targets room, stream parser: one SSE stream's ``data`` payloads -> Outcome fields.

``sse.py`` turns bytes into events; this turns each event's JSON into token instants,
usage and faults, and moves the request's deadline (ttft, then total, then idle). Per
request, counters only: no text is kept, and an answer is cut past ``Bounds.chunks``
content chunks, so what one request holds is bounded whatever the server sends.

Every number and shape a server sends is checked here, once, for the streamed and the
non-streamed reader alike: a delta whose content is not text is a ``BAD_RESPONSE``; a
usage count that is not a plausible integer is not taken (``apply_usage``). Nothing but
``Fault`` leaves the parser, and whatever it stores in the Outcome fits the journal's
64-bit integers.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from json import loads
from typing import Any, Final

from soakd.model import ErrorKind, Outcome
from soakd.targets.errors import STREAM_ERROR, error_fields

__all__ = [
    "Bounds",
    "Fault",
    "StreamParser",
    "answer_text",
    "apply_usage",
    "choice_text",
    "idle_cut",
    "settle_usage",
]

_TEXT_KEYS: Final = ("content", "reasoning_content", "reasoning")
"""Where a chat delta (or message) carries text: reasoning models stream their reasoning
in the latter two before the answer."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one answer may hold. Past ``chunks`` content chunks the stream is cut
    (``TOO_MANY_TOKENS``); a usage count of more completion tokens than ``chunks`` plus the
    chunks streamed, or more prompt tokens than ``prompt``, is implausible (not taken)."""

    chunks: int
    prompt: int

    @classmethod
    def of(cls, factor: float, max_tokens: int, body_bytes: int) -> Bounds:
        """``factor`` x the request's max_tokens, and ``factor`` x its body's bytes for the
        prompt (a tokenizer makes at most about one token a byte, the chat template aside,
        which the body's JSON framing more than covers)."""
        return cls(math.ceil(factor * max_tokens), math.ceil(factor * max(body_bytes, 1)))


NO_BOUNDS: Final = Bounds(2**62, 2**62)
"""Bounds for callers that set none (every count still fits 64 bits)."""


class Fault(Exception):
    """A response problem found while parsing: ends the read with this kind."""

    def __init__(self, kind: ErrorKind, detail: str, *, oom: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.oom = oom


def idle_cut(out: Outcome, idle_s: float | None, total_at: float) -> bool:
    """Did the deadline that fired belong to the idle limit (not the total one)?"""
    if idle_s is None or out.last_token_ns is None:
        return False
    return out.last_token_ns / 1e9 + idle_s < total_at


class StreamParser:
    """Per-request state of one SSE stream: turns each ``data`` payload into Outcome
    fields. Lives only during ``send``; keeps counters, and the answer's text only when the
    request asked (``kept``: a conversation's turn, a check)."""

    __slots__ = (
        "armed",
        "bounds",
        "chat",
        "choices_seen",
        "cm",
        "done",
        "finished",
        "identity",
        "idle_s",
        "kept",
        "last_choice_ns",
        "out",
        "resched_at",
        "total_at",
    )

    def __init__(
        self,
        out: Outcome,
        chat: bool,
        cm: asyncio.Timeout,
        resched_at: float | None,
        idle_s: float | None = None,
        total_at: float = float("inf"),
        bounds: Bounds = NO_BOUNDS,
        keep: bool = False,
    ) -> None:
        self.out = out
        self.kept: list[str] | None = [] if keep else None  # the answer's pieces
        self.identity: tuple[str, str] | None = None  # with ``kept``: its first chunk's
        self.bounds = bounds
        self.chat = chat
        self.cm = cm
        self.resched_at = resched_at  # the total deadline, applied at the first token
        self.idle_s = idle_s  # after the first token: the deadline is min(total, last + idle)
        self.armed = 0.0  # when the idle deadline was last moved (monotonic s)
        self.total_at = total_at
        self.done = False  # saw [DONE]
        self.finished = False  # saw a finish_reason
        self.choices_seen = False
        self.last_choice_ns = 0  # when the last chunk carrying a choice arrived

    def keep_answer(self) -> None:
        """Put the text kept so far on the Outcome (whatever arrived, even of a failed
        answer); nothing when the request did not ask."""
        if self.kept is not None:
            self.out.answer = "".join(self.kept)
            self.out.identity = self.identity

    def answer_end(self, now: int) -> int:
        """Where a whole answer's E2E ends: the arrival of its last chunk that carried a
        choice (its last content, or the finish_reason after it), not the usage chunk or
        ``[DONE]`` that trail it: a busy server writes those a scheduler step later
        (docs/metrics.md). ``now`` when no choice came."""
        return self.last_choice_ns or now

    def _rearm(self, now_ns: int) -> None:
        """Move the idle deadline to ``now + idle``, capped by the total deadline.

        Moved at most ten times per idle window (a timer re-armed per token would cost
        more than the rest of the token's handling), so a silence is cut between 0.9 and
        1.0 times ``idle`` after the last chunk. perf_counter and the loop's clock are
        both CLOCK_MONOTONIC here."""
        idle = self.idle_s
        assert idle is not None
        t = now_ns / 1e9
        if t - self.armed >= idle * 0.1:
            self.armed = t
            self.cm.reschedule(min(self.total_at, t + idle))

    def event(self, payload: str, now: int) -> None:
        """Apply one event's payload received at ``now``; raises ``Fault``."""
        if self.done:
            return  # nothing after [DONE] counts
        if payload == "[DONE]":
            self.done = True
            return
        if not payload:
            return  # "data:" alone: a keep-alive some proxies send
        try:
            obj = loads(payload)
        except (ValueError, RecursionError):  # JSONDecodeError, an int of 4,300+ digits,
            raise Fault(ErrorKind.BAD_CHUNK, "chunk is not JSON") from None  # deep nesting
        if type(obj) is not dict:
            raise Fault(ErrorKind.BAD_CHUNK, "chunk is not a JSON object")
        if self.kept is not None and self.identity is None:
            self.identity = served_by(obj)
        try:
            choices = obj.get("choices")
            if choices:
                self.choices_seen = True
                self.last_choice_ns = now
                c0 = choices[0]
                if self.chat:
                    d = c0.get("delta")
                    text = d.get("content") if d else None
                    if not text or text.__class__ is not str:  # else the common case
                        text = answer_text(d, "delta") if d else None
                else:
                    text = c0.get("text")
                    if text is not None and text.__class__ is not str:
                        raise Fault(ErrorKind.BAD_RESPONSE, "choice text is not text")
                if text:
                    out = self.out
                    if out.content_chunks >= self.bounds.chunks:
                        raise Fault(
                            ErrorKind.TOO_MANY_TOKENS,
                            f"over {self.bounds.chunks} content chunks "
                            "(max_output_factor x max_tokens)",
                        )
                    last = out.last_token_ns
                    if last is None:
                        out.first_token_ns = now
                        if self.resched_at is not None:
                            self.cm.reschedule(self.resched_at)  # ttft met: now the total
                    else:
                        out.itl_ns.append(now - last)
                    if self.idle_s is not None:
                        self._rearm(now)
                    out.last_token_ns = now
                    out.content_chunks += 1
                    if self.kept is not None:
                        self.kept.append(text)
                if c0.get("finish_reason"):
                    self.finished = True
            elif obj.get("error") or obj.get("object") == "error":
                oom, detail = error_fields(payload.encode())
                raise Fault(ErrorKind.BAD_RESPONSE, f"{STREAM_ERROR} {detail}".rstrip(), oom=oom)
            usage = obj.get("usage")
            if usage:
                apply_usage(self.out, usage, self.bounds)
        except (AttributeError, LookupError, TypeError):
            raise Fault(ErrorKind.BAD_CHUNK, "chunk has an unexpected shape") from None


def answer_text(d: dict[str, Any], where: str) -> str | None:
    """The text of a chat delta or message: its content, else its reasoning. A value that
    is there and is not a string (an object, an array, a number, a bool) is
    ``Fault(BAD_RESPONSE)``: no text came, so no token is counted."""
    text = None
    for key in _TEXT_KEYS:
        value = d.get(key)
        if value is None:
            continue
        if value.__class__ is not str:
            raise Fault(ErrorKind.BAD_RESPONSE, f"{where} {key} is not text")
        text = text or value
    return text


def choice_text(c0: dict[str, Any]) -> str | None:
    """A completions choice's text, or ``Fault(BAD_RESPONSE)`` when it is not text."""
    text = c0.get("text")
    if text is not None and text.__class__ is not str:
        raise Fault(ErrorKind.BAD_RESPONSE, "choice text is not text")
    return text


def apply_usage(out: Outcome, usage: object, bounds: Bounds = NO_BOUNDS) -> None:
    """Take the server's usage when each count in it is a plausible integer; else keep
    what was counted and say why (``usage_rejected``). One bad count rejects the whole
    usage: a server wrong about one is not trusted on the other. Called again (a server
    sending usage with every chunk), the last one decides. Never raises."""
    if type(usage) is not dict:
        why, prompt, completion = "not_integer", None, None
    else:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        why = _implausible(prompt, bounds.prompt) or _implausible(
            completion, bounds.chunks + out.content_chunks
        )
    if why:
        out.usage_rejected = why
        out.usage_reported = False
        out.prompt_tokens = None
        return
    out.usage_rejected = ""
    if prompt is not None:
        out.prompt_tokens = prompt
    if completion is not None:
        out.output_tokens = completion
        out.usage_reported = True


def settle_usage(out: Outcome, stream: bool) -> None:
    """At the answer's end: the count kept is the server's usage when it was taken, else
    the content chunks counted; a stream keeps both (their difference, ``usage_delta``).

    A non-streamed answer is one chunk whatever its length: without a usage taken, its
    text's count is unknown (None), never a guess; no text is 0 tokens."""
    n = out.output_tokens
    if out.usage_reported and n is not None:
        if stream:
            out.usage_delta = n - out.content_chunks
    elif stream or not out.content_chunks:
        out.output_tokens = out.content_chunks
    else:
        out.output_tokens = None


def _implausible(count: object, limit: int) -> str:
    """Why ``count`` cannot be a token count of this answer ("" when it can, or is absent)."""
    if count is None:
        return ""
    if type(count) is not int:  # a bool is an int to isinstance, not here
        return "not_integer"
    if count < 0:
        return "negative"
    return "implausible" if count > limit else ""


IDENTITY_CHARS = 200
"""Longest ``model`` or ``system_fingerprint`` kept (a longer one is cut)."""


def served_by(obj: dict[str, Any]) -> tuple[str, str]:
    """An answer's ``model`` and ``system_fingerprint`` ("" when absent or not text)."""
    model, fingerprint = obj.get("model"), obj.get("system_fingerprint")
    return (
        model[:IDENTITY_CHARS].replace("\0", "") if isinstance(model, str) else "",
        fingerprint[:IDENTITY_CHARS].replace("\0", "") if isinstance(fingerprint, str) else "",
    )
