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
    mode: Literal["closed", "constant", "poisson", "ramp", "idle", "sweep"] = "closed"
    concurrency: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 1  # closed loop
    rate: PositiveRate = 0.0  # req/s: constant, poisson, and where a ramp starts
    rate_end: PositiveRate | None = None  # req/s where a ramp ends
    # open loop: sends out at once (0: the target's max_connections); a send that finds
    # them all out is not made and is counted (soakd_sends_missed_total, in_flight_cap)
    max_in_flight: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 0
    # open loop: a send whose instant is more than this past is not made (counted, late)
    max_lateness: PositiveDuration = 1.0

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
        check_load(self.mode, concurrency=self.concurrency, rate=self.rate, rate_end=self.rate_end)
        return self

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

    def shape(self, max_connections: int = 0) -> LoadShape:
        """This load as the plan holds it (its mode's class, the fields it uses). An open
        loop's in-flight cap defaults to the target's connection pool: a send past it would
        only queue inside soakd for a connection, its wait hidden in its TTFT."""
        if self.unresolved:
            raise ValueError(f"{self.share_text()}: resolve it first (docs/capacity.md)")
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

    @property
    def longest_answer(self) -> int:
        """The most tokens one request asks for: the planned answer lengths' top when drawn
        (a prompt file's own lengths unread), else max_tokens. The sender sizing counts it."""
        d = self.prompts.output_tokens
        if d is None:
            return self.max_tokens
        return min(d.max, max(d.min, d.mean)) if d.dist == "fixed" else d.max
