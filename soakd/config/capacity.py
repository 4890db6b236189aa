"""Config room, capacity: how ``soakd capacity`` searches for each target's knee
(docs/capacity.md). Every key has a default, so a config without the block can be swept."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from soakd.config.base import PositiveDuration, Strict

MAX_RATE_DEFAULT = 1000.0
"""The highest open-loop rate a sweep tries when ``capacity.ceiling`` is unset (req/s)."""


class CapacityConfig(Strict):
    """The search: a geometric ramp from ``start`` by ``factor`` up to ``ceiling``, then
    bisection between the last passing and the first failing step, until they are within
    ``precision`` of each other; each step between ``min_step`` and ``max_step`` long,
    the whole sweep within ``max_time``."""

    # sweep open-loop rate or closed-loop concurrency (unset: the first phase's load mode)
    by: Literal["rate", "concurrency"] | None = None
    arrivals: Literal["constant", "poisson"] = "constant"  # an open-loop step's sends
    start: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0  # the first step's load
    factor: Annotated[float, Field(gt=1, le=10, allow_inf_nan=False)] = 2.0  # the ramp's growth
    # the highest load tried (unset: 1000 req/s, or the target's max_connections)
    ceiling: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    precision: Annotated[float, Field(gt=0, lt=1)] = 0.05  # bisection's stop: (fail-pass)/pass
    min_step: PositiveDuration = 5.0  # a step's least: then it ends once its queue is steady
    max_step: PositiveDuration = 30.0  # a step's most: a queue still rising then fails it
    # answers a step waits for before it may end early (a P99 of a dozen is their maximum)
    min_requests: Annotated[int, Field(ge=1)] = 50
    # steady: the last third's mean queue depth at most the middle third's times (1 + this),
    # or one request more
    steady_tolerance: Annotated[float, Field(ge=0, le=10)] = 0.1
    max_time: PositiveDuration = 600.0  # the whole sweep, every target
    stop_error_ratio: Annotated[float, Field(gt=0, le=1)] = 0.5  # a step past it ends a sweep
    floor: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict
    )  # target -> the lowest knee `soakd capacity --check` accepts
    # a plan's shares of the knee (rate: 70%) resolved from this soakd capacity result
    result: Path | None = None
    measure: bool = False  # no result: measure the knees before the run starts

    @model_validator(mode="after")
    def _bounds(self) -> CapacityConfig:
        if self.min_step > self.max_step:
            raise ValueError(
                f"min_step ({self.min_step:g}s) is above max_step ({self.max_step:g}s)"
            )
        if self.ceiling is not None:
            if self.start > self.ceiling:
                raise ValueError(f"start ({self.start:g}) is above ceiling ({self.ceiling:g})")
            for target, floor in self.floor.items():
                if floor > self.ceiling:
                    raise ValueError(
                        f"floor.{target}: {floor:g} is above ceiling ({self.ceiling:g}): no "
                        "sweep could pass it"
                    )
        return self

    def ceiling_for(self, by: str, max_connections: int) -> float:
        """The highest load tried for a target: ``ceiling``, else a default by kind."""
        if self.ceiling is not None:
            return self.ceiling if by == "rate" else min(self.ceiling, max_connections)
        return MAX_RATE_DEFAULT if by == "rate" else float(max_connections)
