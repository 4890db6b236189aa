"""Config room, workload: prompts, load shapes and phases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from soakd.config.base import (
    MAX_CONCURRENCY,
    Duration,
    Name,
    PositiveDuration,
    PositiveRate,
    Strict,
)
from soakd.config.gateway import GatewayModes
from soakd.model import NS_PER_S
from soakd.shapes import LoadShape, check_load, shape_of

MAX_TOKENS = 1 << 20
"""The longest prompt and the longest answer a config may ask for (1,048,576 tokens): the
longest context windows served today are a million tokens. A prompt is held once per
request in flight (~6.5 bytes a synthetic token); past this, a typo (1e9) would end the
run in MemoryError instead of a config error."""

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class TokenLength(Strict):
    """A distribution of lengths in tokens: the prompts' (input_tokens) or the answers'
    (output_tokens), drawn per request seq from workload.seed."""

    dist: Literal["fixed", "uniform", "normal"] = "fixed"  # uniform: from min to max
    mean: Tokens = 256  # fixed and normal
    stddev: Annotated[float, Field(ge=0, le=MAX_TOKENS, allow_inf_nan=False)] = 0.0  # normal
    min: Tokens = 1  # every length is clamped to min..max
    max: Tokens = 4096

    @model_validator(mode="after")
    def _bounds(self) -> TokenLength:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Prompts(Strict):
    source: Literal["synthetic", "file"] = "synthetic"  # synthetic: seeded words, same for all
    input_tokens: TokenLength = TokenLength()  # the prompts' planned lengths
    # the answers' planned lengths: each request's max_tokens, served whole where the target
    # is asked to (targets[].planned_output; docs/workloads.md); a prompt file's line with
    # its own output_tokens wins; unset: every request asks workload.max_tokens
    output_tokens: TokenLength | None = None
    # JSONL: {"prompt": "..."} or {"messages": [...]} per line, each with an optional
    # "output_tokens": its answer's planned length
    file: Path | None = None

    @model_validator(mode="after")
    def _file_given(self) -> Prompts:
        if self.source == "file" and self.file is None:
            raise ValueError("source is 'file' but no file is given")
        return self


MAX_TURNS = 1000
"""The most turns a conversation may plan (a typo of 1e6 turns would be a run of one
conversation whose context no server holds)."""


class TurnCount(Strict):
    """A distribution of a conversation's turns, drawn per conversation from workload.seed."""

    dist: Literal["fixed", "uniform", "normal"] = "fixed"  # uniform: from min to max
    mean: Annotated[int, Field(ge=1, le=MAX_TURNS)] = 4  # fixed and normal
    stddev: Annotated[float, Field(ge=0, le=MAX_TURNS, allow_inf_nan=False)] = 0.0  # normal
    min: Annotated[int, Field(ge=1, le=MAX_TURNS)] = 1  # clamped to min..max
    max: Annotated[int, Field(ge=1, le=MAX_TURNS)] = MAX_TURNS

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: object) -> object:
        return {"mean": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _bounds(self) -> TurnCount:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class ThinkTime(Strict):
    """The pause between an answer and the conversation's next turn, drawn per turn."""

    dist: Literal["fixed", "uniform", "exponential"] = "fixed"
    mean: Duration = 0.0  # fixed and exponential (seconds, or "500ms", "2s")
    min: Duration = 0.0  # uniform: from min to max; every draw is clamped to min..max
    max: Duration = 3600.0

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: object) -> object:
        return {"mean": value} if isinstance(value, int | float | str) else value

    @model_validator(mode="after")
    def _bounds(self) -> ThinkTime:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"need 0 <= min ({self.min:g}s) <= max ({self.max:g}s)")
        if self.mean < 0:
            raise ValueError(f"mean must not be negative, got {self.mean:g}s")
        return self


class Conversations(Strict):
    """Multi-turn conversations (docs/workloads.md, "Multi-turn conversations"): each turn
    sends the history so far, the answers as the server gave them, so the context grows.
    The load unit is the conversation: a closed loop holds ``concurrency`` conversations at
    once, an open loop's arrivals each start one."""

    turns: TurnCount = TurnCount()  # a number, or a distribution per conversation
    user_tokens: TokenLength = TokenLength(mean=128)  # each user turn's planned length
    think_time: ThinkTime = ThinkTime()  # a number of seconds, or a distribution per turn
    # after a failed turn: end the conversation (counted, by the error), or go on with the
    # history as far as it got (the failed turn's user message and whatever answer arrived)
    on_failure: Literal["end", "continue"] = "end"


class Load(Strict):
    """The load shape of one target in one phase."""

    mode: Literal["closed", "constant", "poisson", "ramp", "idle"] = "closed"
    concurrency: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 1  # closed loop
    rate: PositiveRate = 0.0  # req/s: constant, poisson, and where a ramp starts
    rate_end: PositiveRate | None = None  # req/s where a ramp ends
    # open loop: sends out at once (0: the target's max_connections); a send that finds
    # them all out is not made and is counted (soakd_sends_missed_total, in_flight_cap)
    max_in_flight: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 0
    # open loop: a send whose instant is more than this past is not made (counted, late)
    max_lateness: PositiveDuration = 1.0

    @model_validator(mode="after")
    def _shape(self) -> Load:
        check_load(self.mode, concurrency=self.concurrency, rate=self.rate, rate_end=self.rate_end)
        return self

    def shape(self, max_connections: int = 0) -> LoadShape:
        """This load as the plan holds it (its mode's class, the fields it uses). An open
        loop's in-flight cap defaults to the target's connection pool: a send past it would
        only queue inside soakd for a connection, its wait hidden in its TTFT."""
        return shape_of(
            self.mode,
            concurrency=self.concurrency,
            rate=self.rate,
            rate_end=self.rate_end or 0.0,
            max_in_flight=self.max_in_flight or max_connections,
            max_lateness_ns=round(self.max_lateness * NS_PER_S),
        )


class PhaseConfig(Strict):
    name: Name  # unique: the report and the journal know a phase by it
    duration: Duration | None = None  # or until (one of them)
    until: str | None = None  # an ISO datetime, or a cron expression: run until it next fires
    load: Load = Load()  # every target's, unless targets overrides it
    targets: dict[str, Load] = Field(default_factory=dict)  # per-target overrides
    gateway: dict[str, GatewayModes] = Field(default_factory=dict)  # target -> its gateway

    @model_validator(mode="after")
    def _one_end(self) -> PhaseConfig:
        if (self.duration is None) == (self.until is None):
            raise ValueError("give a phase either duration or until")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"duration must be above zero, got {self.duration:g}s")
        return self


class Workload(Strict):
    prompts: Prompts = Prompts()
    max_tokens: Tokens = 512  # each request's max_tokens, unless its answer length is planned
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.7
    seed: int = 0  # the prompts' and the arrivals' seed: the same run twice sends the same
    # auto: synthetic prompts sized in a reference's tokens at start (workload.tokenizer, else
    # the first target whose /tokenize answers, else the first answers' usage); off: a word
    # a token, as planned (docs/metrics.md, "Prompt tokens")
    calibrate: Literal["auto", "off"] = "auto"
    tokenizer: Path | None = None  # a tokenizer.json to count with (pip install 'soakd[tokenizer]')
    # multi-turn conversations instead of single requests (chat targets only)
    conversations: Conversations | None = None

    @property
    def longest_answer(self) -> int:
        """The most tokens one request asks for: the planned answer lengths' top when drawn
        (a prompt file's own lengths unread), else max_tokens. The sender sizing counts it."""
        d = self.prompts.output_tokens
        if d is None:
            return self.max_tokens
        return min(d.max, max(d.min, d.mean)) if d.dist == "fixed" else d.max
