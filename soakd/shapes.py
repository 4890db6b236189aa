"""Workload, load shapes: what one target receives during one phase, one class per mode.

The config names a mode (``load.mode``: closed, constant, poisson, ramp, idle); from the
plan on, a load is one of these classes and answers for itself: whether it runs an open
loop (``is_open``), its closed-loop width (``concurrency``), its offered rate at an instant
(``rate_at``), the requests a phase of it should hold (``expected``), the sockets it may
hold at once (``fd_need``), how it is described and stored. The mode's name is read here
only (``shape_of``, ``check_load``): the runner, the plan table, the metrics, the fd limit
and the sender sizing ask the shape, never its name. The rate arithmetic (a ramp's linear
rate, its integral and inverse) lives once, in ``Curve``, which ``arrivals`` walks.

Pure; frozen values, compared by value (a resume compares plans).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from soakd.units import NS_PER_S

LATENESS_NS = NS_PER_S
"""An open loop's default ``max_lateness``: a send later than this is not made."""


@dataclass(frozen=True, slots=True)
class Curve:
    """The expected requests from a phase's start over one phase: L(t) = r0 t + a t^2, the
    integral of a rate that changes linearly from r0 (r0 + 2at). Constant and poisson have
    a = 0; a ramp's a takes it from its start rate to its end rate over the phase."""

    r0: float  # req/s at the phase start
    a: float  # half the rate's slope
    total: float  # L(duration): requests expected over the whole phase

    def at(self, t_s: float) -> float:
        """L(t): requests expected in the first ``t_s`` seconds."""
        return self.r0 * t_s + self.a * t_s * t_s

    def rate(self, t_s: float) -> float:
        """The rate at ``t_s`` seconds from the phase start."""
        return self.r0 + 2 * self.a * t_s

    def inverse(self, s: float) -> float:
        """L^-1(s) = 2s / (r0 + sqrt(r0^2 + 4as)): exact when a is 0 or negative."""
        if self.a == 0.0:
            return s / self.r0
        r0 = self.r0
        return 2 * s / (r0 + math.sqrt(max(0.0, r0 * r0 + 4 * self.a * s)))


@dataclass(frozen=True, slots=True)
class Fields:
    """Every mode's fields, flat (as the config and the stored plan hold them): each
    shape takes the ones it uses."""

    concurrency: int = 0
    rate: float = 0.0
    rate_end: float = 0.0
    max_in_flight: int = 0
    max_lateness_ns: int = LATENESS_NS


@dataclass(frozen=True, slots=True)
class LoadShape(ABC):
    """The load one target receives during one phase (resolved from config)."""

    mode: ClassVar[str]  # the config's name for it, and the stored plan's
    is_open: ClassVar[bool] = False  # sends on a schedule (arrivals), not as answers come

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        """This mode's shape from the flat fields."""
        return cls()

    @classmethod
    @abstractmethod
    def check(cls, *, concurrency: int, rate: float, rate_end: float | None) -> None:
        """ValueError when a configured load of this mode lacks what it needs."""

    @property
    def concurrency(self) -> int:
        """Closed-loop streams this load keeps going (0: none)."""
        return 0

    @property
    def fd_need(self) -> int:
        """Sockets this load may hold at once (each request in flight holds one)."""
        return 0

    @property
    def peak_rate(self) -> float:
        """The highest open-loop rate over the phase, req/s (0: not an open loop)."""
        return 0.0

    def rate_at(self, t_ns: int, duration_ns: int) -> float:
        """The offered open-loop rate ``t_ns`` into a phase ``duration_ns`` long, req/s."""
        return 0.0

    def expected(self, duration_ns: int) -> float:
        """How many sends a phase ``duration_ns`` long should hold on average (0: the
        count is not planned, it follows the answers or there is none)."""
        return 0.0

    @abstractmethod
    def describe(self) -> str: ...

    def doc(self) -> dict[str, Any]:
        """The shape as the journal stores it in the plan (every mode, the same keys)."""
        return {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "rate": 0.0,
            "rate_end": 0.0,
            "max_in_flight": 0,
        }


@dataclass(frozen=True, slots=True)
class Idle(LoadShape):
    """Nothing sent to the target in this phase."""

    mode: ClassVar[str] = "idle"

    @classmethod
    def check(cls, *, concurrency: int, rate: float, rate_end: float | None) -> None:
        """An idle phase needs nothing (the other fields are ignored)."""

    def describe(self) -> str:
        return "idle"


@dataclass(frozen=True, slots=True)
class Sweep(Idle):
    """The phase re-measures the target's knee (docs/capacity.md): the runner sends it
    nothing, a bounded capacity sweep does, and its requests are in no verdict."""

    mode: ClassVar[str] = "sweep"

    def describe(self) -> str:
        return "capacity sweep"


@dataclass(frozen=True, slots=True)
class Closed(LoadShape):
    """A fixed number of streams, each sending its next request when its answer is in."""

    mode: ClassVar[str] = "closed"
    streams: int  # the config's concurrency

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        return cls(f.concurrency)

    @classmethod
    def check(cls, *, concurrency: int, rate: float, rate_end: float | None) -> None:
        if concurrency < 1:
            raise ValueError(f"mode {cls.mode!r} needs concurrency >= 1")

    @property
    def concurrency(self) -> int:
        return self.streams

    @property
    def fd_need(self) -> int:
        return self.streams

    def describe(self) -> str:
        return f"closed loop, {self.streams} concurrent"


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenLoad(LoadShape, ABC):
    """Sends at planned instants, whatever the answers do (arrivals.py)."""

    is_open: ClassVar[bool] = True
    spaced: ClassVar[bool] = False  # evenly spaced instants; else a Poisson process
    rate: float  # req/s (a ramp's start)
    max_in_flight: int = 0  # sends out at once (0 = no cap)
    max_lateness_ns: int = LATENESS_NS  # a send later than this is not made

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        return cls(rate=f.rate, max_in_flight=f.max_in_flight, max_lateness_ns=f.max_lateness_ns)

    @classmethod
    def check(cls, *, concurrency: int, rate: float, rate_end: float | None) -> None:
        if rate <= 0:
            raise ValueError(f"mode {cls.mode!r} needs rate > 0")

    def curve(self, seconds: float) -> Curve:
        """The expected requests over a phase ``seconds`` long."""
        r0 = max(0.0, self.rate)
        return Curve(r0, 0.0, r0 * seconds)

    @property
    def fd_need(self) -> int:
        return self.max_in_flight

    @property
    def peak_rate(self) -> float:
        return self.rate

    def rate_at(self, t_ns: int, duration_ns: int) -> float:
        seconds = max(0, duration_ns) / NS_PER_S
        return self.curve(seconds).rate(min(seconds, max(0, t_ns) / NS_PER_S))

    def expected(self, duration_ns: int) -> float:
        return self.curve(max(0, duration_ns) / NS_PER_S).total

    def describe(self) -> str:
        return f"{self.mode} {self.rate:g} req/s"

    def doc(self) -> dict[str, Any]:
        return LoadShape.doc(self) | {"rate": self.rate, "max_in_flight": self.max_in_flight}


@dataclass(frozen=True, slots=True, kw_only=True)
class Constant(OpenLoad):
    """Evenly spaced sends, the first at the phase start."""

    mode: ClassVar[str] = "constant"
    spaced: ClassVar[bool] = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Poisson(OpenLoad):
    """Exponential gaps (a homogeneous Poisson process), the first after one gap."""

    mode: ClassVar[str] = "poisson"


@dataclass(frozen=True, slots=True, kw_only=True)
class Ramp(OpenLoad):
    """A Poisson process whose rate changes linearly from ``rate`` to ``rate_end`` over the
    phase. Random like ``poisson`` on purpose: a ramp looks for the rate where the server
    gives out, and real traffic bursts."""

    mode: ClassVar[str] = "ramp"
    rate_end: float  # req/s at the phase end

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        return cls(
            rate=f.rate,
            rate_end=f.rate_end,
            max_in_flight=f.max_in_flight,
            max_lateness_ns=f.max_lateness_ns,
        )

    @classmethod
    def check(cls, *, concurrency: int, rate: float, rate_end: float | None) -> None:
        if rate <= 0 and (rate_end or 0) <= 0:
            raise ValueError(f"mode {cls.mode!r} needs rate > 0")
        if rate_end is None:
            raise ValueError(f"mode {cls.mode!r} needs rate_end")

    def curve(self, seconds: float) -> Curve:
        r0, r1 = max(0.0, self.rate), max(0.0, self.rate_end)
        a = (r1 - r0) / (2 * seconds) if seconds > 0 else 0.0
        return Curve(r0, a, (r0 + r1) / 2 * seconds)

    @property
    def peak_rate(self) -> float:
        return max(self.rate, self.rate_end)

    def describe(self) -> str:
        return f"ramp {self.rate:g} -> {self.rate_end:g} req/s"

    def doc(self) -> dict[str, Any]:
        return OpenLoad.doc(self) | {"rate_end": self.rate_end}


def check_load(mode: str, *, concurrency: int, rate: float, rate_end: float | None) -> None:
    """What a configured load of ``mode`` needs, or ValueError (the config's message)."""
    _kind(mode).check(concurrency=concurrency, rate=rate, rate_end=rate_end)


def shape_of(
    mode: str,
    *,
    concurrency: int = 0,
    rate: float = 0.0,
    rate_end: float = 0.0,
    max_in_flight: int = 0,
    max_lateness_ns: int = LATENESS_NS,
) -> LoadShape:
    """The shape a mode's name stands for, from the fields it uses (the others ignored):
    the config's load, or a plan as the journal stored it. ValueError: an unknown mode."""
    return _kind(mode).of(Fields(concurrency, rate, rate_end, max_in_flight, max_lateness_ns))


def _kind(mode: str) -> type[LoadShape]:
    kind = _MODES.get(mode)
    if kind is None:
        raise ValueError(f"unknown load mode {mode!r}")
    return kind


_MODES: dict[str, type[LoadShape]] = {
    kind.mode: kind for kind in (Closed, Constant, Poisson, Ramp, Idle, Sweep)
}
