"""Config room, workload: prompts, load shapes and phases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator
from tzlocal import get_localzone_name

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


class Prefix(Strict):
    """Shared prompt prefixes: a share of the requests (drawn per seq from workload.seed, the
    same on every target) opens with one of ``count`` prefixes of ``tokens`` tokens, chosen
    per seq; the prefix is part of the prompt's planned length."""

    share: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0  # of the requests
    count: Annotated[int, Field(ge=1, le=1_000_000)] = 1  # distinct prefixes
    tokens: Tokens = 256  # each prefix's length, in the target's own tokens when sized


DATASETS: Final = ("sharegpt", "mooncake", "burstgpt")
"""The sources read from a dataset file (workload.prompts.file): docs/workloads.md."""


class Prompts(Strict):
    # synthetic: seeded words, same for all; file: JSONL prompts; sharegpt (a JSON array of
    # conversations), mooncake (a JSONL trace of hash_ids), burstgpt (a CSV trace): a dataset
    # file, docs/workloads.md
    source: Literal["synthetic", "file", "sharegpt", "mooncake", "burstgpt"] = "synthetic"
    input_tokens: TokenLength = TokenLength()  # the prompts' planned lengths
    # the answers' planned lengths: each request's max_tokens, served whole where the target
    # is asked to (targets[].planned_output; docs/workloads.md); a prompt file's line with
    # its own output_tokens wins; unset: every request asks workload.max_tokens
    output_tokens: TokenLength | None = None
    # JSONL: {"prompt": "..."} or {"messages": [...]} per line, each with an optional
    # "output_tokens": its answer's planned length; or the dataset file of sharegpt,
    # mooncake, burstgpt
    file: Path | None = None
    # shared prefixes (synthetic and file sources; a mooncake trace's hash_ids share their own)
    prefix: Prefix | None = None

    @model_validator(mode="after")
    def _file_given(self) -> Prompts:
        if self.source != "synthetic" and self.file is None:
            raise ValueError(f"source is '{self.source}' but no file is given")
        if self.prefix is not None and self.source in DATASETS:
            raise ValueError(f"prefix is for the synthetic and file sources, not '{self.source}'")
        if self.prefix is not None and self.source == "synthetic":
            d = self.input_tokens
            shortest = min(d.max, max(d.min, d.mean)) if d.dist == "fixed" else d.min
            if self.prefix.tokens >= shortest:
                raise ValueError(
                    f"prefix.tokens ({self.prefix.tokens}) must be below the shortest planned "
                    f"prompt ({shortest} tokens, input_tokens): the prefix is part of it"
                )
        return self


Speed = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
_TRACE_KEYS = ("trace", "format", "speed", "loop")
_DAILY_KEYS = ("hours", "low", "high", "peak_hour", "arrival", "timezone")

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


def _share(value: object) -> float | None:
    """``"70%"`` -> 0.7; anything else None (a number, or a value the field itself rejects)."""
    if not isinstance(value, str) or not value.strip().endswith("%"):
        return None
    try:
        share = float(value.strip()[:-1]) / 100
    except ValueError:
        raise ValueError(f"bad share of the knee {value!r} (e.g. 70%)") from None
    if not 0 < share <= 10:  # up to ten times the knee, on purpose
        raise ValueError(f"a share of the knee must be above 0 % and at most 1000 %, got {value}")
    return share


class Load(Strict):
    """The load shape of one target in one phase. ``rate`` (open loop) or ``concurrency``
    (closed loop) may be a share of the target's knee, ``70%``: resolved before the run
    starts from ``capacity.result`` or a sweep (``capacity.measure``; docs/capacity.md)."""

    # how it sends; sweep: the phase re-measures the target's knee (docs/capacity.md)
    mode: Literal["closed", "constant", "poisson", "ramp", "idle", "trace", "daily", "sweep"] = (
        "closed"
    )
    concurrency: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 1  # closed loop
    rate: PositiveRate = 0.0  # req/s: constant, poisson, and where a ramp starts
    rate_end: PositiveRate | None = None  # req/s where a ramp ends
    # open loop: sends out at once (0: the target's max_connections); a send that finds
    # them all out is not made and is counted (soakd_sends_missed_total, in_flight_cap)
    max_in_flight: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 0
    # open loop: a send whose instant is more than this past is not made (counted, late)
    max_lateness: PositiveDuration = 1.0
    # mode trace: the trace file whose timestamps are replayed as send instants
    # (docs/workloads.md, "Arrivals from traces and from the clock"); unset: the prompt
    # file, when workload.prompts.source is mooncake or burstgpt
    trace: Path | None = None
    format: Literal["mooncake", "burstgpt"] | None = None  # the trace's; unset: .csv is burstgpt
    speed: Speed = 1.0  # mode trace: how much faster than the trace (2: twice as fast)
    loop: bool = True  # mode trace: start over, one mean gap after the last record
    # mode daily: 24 rates in req/s, one an hour from 00:00 (each at its hour's middle,
    # linear between); or low, high and peak_hour
    hours: list[PositiveRate] | None = None
    low: PositiveRate | None = None  # mode daily: req/s 12 h from the peak (a cosine)
    high: PositiveRate | None = None  # mode daily: req/s at peak_hour
    peak_hour: Annotated[float, Field(ge=0, lt=24)] | None = None  # mode daily: 14.5 is 14:30
    arrival: Literal["poisson", "constant"] = "poisson"  # mode daily: random, or evenly spaced
    timezone: str | None = None  # mode daily: an IANA name (Europe/Paris); unset: the box's

    @field_validator("timezone")
    @classmethod
    def _zone(cls, name: str | None) -> str | None:
        if name is not None:
            try:
                ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"{name!r} is not a known time zone (e.g. Europe/Paris)") from None
        return name

    # a share of the knee (rate: 70%): the share, and the knee it resolved against (unset:
    # not resolved yet); written as a percentage in rate or concurrency
    share: Annotated[float, Field(gt=0, le=10)] | None = None
    share_of: Literal["rate", "concurrency"] | None = None  # which field the share is of
    knee: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _percent(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        for key in ("rate", "concurrency"):
            share = _share(data.get(key))
            if share is not None:
                data = {k: v for k, v in data.items() if k != key} | {"share": share}
                data["share_of"] = key
        return data

    @model_validator(mode="after")
    def _shape(self) -> Load:
        if self.share is not None and self.share_of is None:
            raise ValueError("share: write it as rate: 70% or concurrency: 50%")
        if self.share_of is not None and self.knee is None:  # resolved before the plan is
            want = ("closed",) if self.share_of == "concurrency" else ("constant", "poisson")
            if self.mode not in want:
                raise ValueError(
                    f"{self.share_of}: a share of the knee needs mode {' or '.join(want)}, "
                    f"not {self.mode}"
                )
            return self
        check_load(self.mode, **self._given())
        for keys, mode in ((_TRACE_KEYS, "trace"), (_DAILY_KEYS, "daily")):
            fields = type(self).model_fields
            stray = [k for k in keys if self.mode != mode and getattr(self, k) != fields[k].default]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only for mode {mode!r}, not {self.mode!r}")
        return self

    def _given(self) -> dict[str, Any]:
        """The fields as written (unset ones None), for the mode's own check. A stray key is
        one set away from its default: a dumped config holds every key."""
        return {k: getattr(self, k) for k in type(self).model_fields if k != "mode"} | {
            k: None for k in (*_DAILY_KEYS, "rate_end") if k not in self.model_fields_set
        }

    @property
    def unresolved(self) -> bool:
        """A share of the knee not resolved yet: no shape until it is."""
        return self.share_of is not None and self.knee is None

    def of_knee(self, knee: float) -> Load:
        """This load with its share of ``knee`` resolved (a concurrency rounded, at least 1)."""
        assert self.share is not None
        assert self.share_of is not None
        value: float = self.share * knee
        if self.share_of == "concurrency":
            value = max(1, round(value))
        return Load.model_validate(self.model_dump() | {self.share_of: value, "knee": knee})

    def share_text(self) -> str | None:
        """``rate 70% of the knee 12 = 8.4 req/s`` (None: no share)."""
        if self.share_of is None or self.share is None:
            return None
        pct = f"{self.share * 100:g}%"
        if self.knee is None:
            return f"{self.share_of} {pct} of the knee (not resolved yet)"
        value = self.rate if self.share_of == "rate" else self.concurrency
        unit = " req/s" if self.share_of == "rate" else ""
        return f"{self.share_of} {pct} of the knee {self.knee:.4g}{unit} = {value:.4g}{unit}"

    def shape(self, max_connections: int = 0, **trace: Any) -> LoadShape:
        """This load as the plan holds it (its mode's class, the fields it uses). An open
        loop's in-flight cap defaults to the target's connection pool: a send past it would
        only queue inside soakd for a connection, its wait hidden in its TTFT. ``trace``: a
        trace load's file, format and instants, as the plan read them (``shapes.Fields``)."""
        if self.unresolved:
            raise ValueError(f"{self.share_text()}: resolve it first (docs/capacity.md)")
        return shape_of(
            self.mode,
            concurrency=self.concurrency,
            rate=self.rate,
            rate_end=self.rate_end or 0.0,
            max_in_flight=self.max_in_flight or max_connections,
            max_lateness_ns=round(self.max_lateness * NS_PER_S),
            speed=self.speed,
            loop=self.loop,
            hours=tuple(self.hours or ()),
            low=self.low or 0.0,
            high=self.high or 0.0,
            peak_hour=self.peak_hour or 0.0,
            arrival=self.arrival,
            timezone=self.timezone or local_zone(),
            **trace,
        )


def local_zone() -> str:
    """The box's time zone, by its IANA name (UTC when it has none)."""
    try:
        return get_localzone_name() or "UTC"
    except (LookupError, ValueError, OSError):  # no zone, or a name tzlocal cannot read
        return "UTC"


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
