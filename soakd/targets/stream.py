"""Targets room, stream parser: one SSE stream's ``data`` payloads -> Outcome fields.

``sse.py`` turns bytes into events; this turns each event's JSON into token instants,
usage and faults, and moves the request's deadline (ttft, then total, then idle). Per
request, counters only: no text is kept.
"""

from __future__ import annotations

import asyncio
from json import loads
from typing import Any

from soakd.model import ErrorKind, Outcome
from soakd.targets.errors import error_fields

__all__ = ["Fault", "StreamParser", "apply_usage", "idle_cut"]


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
    fields. Lives only during ``send``; keeps counters, never text."""

    __slots__ = (
        "armed",
        "chat",
        "choices_seen",
        "cm",
        "done",
        "finished",
        "idle_s",
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
    ) -> None:
        self.out = out
        self.chat = chat
        self.cm = cm
        self.resched_at = resched_at  # the total deadline, applied at the first token
        self.idle_s = idle_s  # after the first token: the deadline is min(total, last + idle)
        self.armed = 0.0  # when the idle deadline was last moved (monotonic s)
        self.total_at = total_at
        self.done = False  # saw [DONE]
        self.finished = False  # saw a finish_reason
        self.choices_seen = False

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
        except ValueError:  # JSONDecodeError
            raise Fault(ErrorKind.BAD_CHUNK, "chunk is not JSON") from None
        if type(obj) is not dict:
            raise Fault(ErrorKind.BAD_CHUNK, "chunk is not a JSON object")
        try:
            choices = obj.get("choices")
            if choices:
                self.choices_seen = True
                c0 = choices[0]
                if self.chat:
                    d = c0.get("delta")
                    text = d and (
                        d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                    )
                else:
                    text = c0.get("text")
                if text:
                    out = self.out
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
                if c0.get("finish_reason"):
                    self.finished = True
            elif obj.get("error") or obj.get("object") == "error":
                oom, detail = error_fields(payload.encode())
                raise Fault(ErrorKind.BAD_RESPONSE, f"stream error {detail}".rstrip(), oom=oom)
            usage = obj.get("usage")
            if usage:
                apply_usage(self.out, usage)
        except (AttributeError, LookupError, TypeError):
            raise Fault(ErrorKind.BAD_CHUNK, "chunk has an unexpected shape") from None


def apply_usage(out: Outcome, usage: dict[str, Any]) -> None:
    prompt = usage.get("prompt_tokens")
    if type(prompt) is int:
        out.prompt_tokens = prompt
    completion = usage.get("completion_tokens")
    if type(completion) is int:
        out.output_tokens = completion
        out.usage_reported = True
