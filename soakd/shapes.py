"""Workload, load shapes: what one target receives during one phase, one class per mode.

The config names a mode (``load.mode``: closed, constant, poisson, ramp, idle, trace,
daily); from the plan on, a load is one of these classes and answers for itself: whether it
runs an open loop (``is_open``), its closed-loop width (``concurrency``), its offered rate at
an instant (``rate_at``), the requests a phase of it should hold (``expected``), the sockets
it may hold at once (``fd_need``), how it is described and stored. The mode's name is read here
only (``shape_of``, ``check_load``): the runner, the plan table, the metrics, the fd limit
and the sender sizing ask the shape, never its name. The rate arithmetic (a ramp's linear
rate, its integral and inverse; a daily cycle's) lives once, in ``curves.py``, which
``arrivals`` walks.
A trace's instants are its ``TraceTimes`` (read by workload/traces.py), scaled and looped.
``placed`` fixes what a shape owes to the calendar and to a rehearsal, once, when the plan
is built: a daily cycle's position at the phase's start, a rehearsal's time compression.

Pure; frozen values, compared by value (a resume compares plans).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from soakd.curves import DAY_S, Cumulative, Curve, Cycle, DayCurve
from soakd.units import NS_PER_S

__all__ = ["Cumulative", "Curve"]  # the shapes' curves, re-exported

LATENESS_NS = NS_PER_S
"""An open loop's default ``max_lateness``: a send later than this is not made."""


@dataclass(frozen=True, slots=True)
class Fields:
    """Every mode's fields, flat (as the config and the stored plan hold them): each
    shape takes the ones it uses."""

    concurrency: int = 0
    rate: float = 0.0
    rate_end: float = 0.0
    max_in_flight: int = 0
    max_lateness_ns: int = LATENESS_NS
    # trace
    trace: str = ""  # the file, as configured
    format: str = ""  # mooncake | burstgpt
    speed: float = 1.0
    loop: bool = True
    records: int = 0
    span_ns: int = 0
    times: TraceTimes | None = None  # the instants (None: a stored plan, described only)
    # daily
    hours: Sequence[float] = ()
    low: float = 0.0
    high: float = 0.0
    peak_hour: float = 0.0
    arrival: str = "poisson"
    timezone: str = ""
    anchor_s: float = 0.0
    scale: float = 1.0


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
    def check(cls, given: Mapping[str, Any]) -> None:
        """ValueError when a configured load of this mode (its fields ``given``, as the
        config holds them) lacks what it needs."""

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

    def placed(self, begins: datetime, scale: float) -> LoadShape:
        """This load in a phase that begins at the calendar instant ``begins``, run at
        ``scale`` (run time per configured time: below 1 in a rehearsal). Most shapes owe
        nothing to either: themselves."""
        return self

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
    def check(cls, given: Mapping[str, Any]) -> None:
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
    def check(cls, given: Mapping[str, Any]) -> None:
        if given.get("concurrency", 0) < 1:
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
    rate: float  # req/s (a ramp's start)
    max_in_flight: int = 0  # sends out at once (0 = no cap)
    max_lateness_ns: int = LATENESS_NS  # a send later than this is not made

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        return cls(rate=f.rate, max_in_flight=f.max_in_flight, max_lateness_ns=f.max_lateness_ns)

    @classmethod
    def check(cls, given: Mapping[str, Any]) -> None:
        if given.get("rate", 0.0) <= 0:
            raise ValueError(f"mode {cls.mode!r} needs rate > 0")

    @property
    def spaced(self) -> bool:
        """Instants evenly spaced in expected requests; else a Poisson process."""
        return False

    def curve(self, seconds: float) -> Cumulative:
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

    @property
    def spaced(self) -> bool:
        return True


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
    def check(cls, given: Mapping[str, Any]) -> None:
        rate_end = given.get("rate_end")
        if given.get("rate", 0.0) <= 0 and (rate_end or 0) <= 0:
            raise ValueError(f"mode {cls.mode!r} needs rate > 0")
        if rate_end is None:
            raise ValueError(f"mode {cls.mode!r} needs rate_end")

    def curve(self, seconds: float) -> Cumulative:
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


# --- arrivals from traces and from the clock ---------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class TraceTimes:
    """A trace's send instants: each record's ns after the first, in file order (never
    decreasing), 8 bytes a record. Looped, the next pass starts one mean gap after the last
    record: the period is ``span + span / (records - 1)``."""

    times: array[int]
    busiest: int  # the most records in any one second of the trace

    @property
    def records(self) -> int:
        return len(self.times)

    @property
    def span_ns(self) -> int:
        return self.times[-1] if self.times else 0

    @property
    def period_ns(self) -> int:
        """One pass and one mean gap (0: a trace of one instant has none)."""
        n, span = len(self.times), self.span_ns
        return span + round(span / (n - 1)) if n > 1 and span > 0 else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace(OpenLoad):
    """A trace's timestamps replayed as send instants, ``speed`` times as fast, and looped
    to fill the phase (``loop``), each phase from the trace's start. ``rate``: the mean rate
    at that speed (records per period). Compared by the trace's name, size and span, so a
    resume notices a changed trace; the instants come from ``times``.

    A rehearsal (``scale`` below 1) keeps the rate, as every load does, and compresses the
    trace's time: it replays one record in 1/scale (record floor(k / scale) for send k), at
    its instant times scale, so a day of trace passes in a rehearsal's minutes, its bursts
    and lulls where they were."""

    mode: ClassVar[str] = "trace"
    rate: float = 0.0
    trace: str
    format: str
    speed: float = 1.0
    loop: bool = True
    records: int = 0
    span_ns: int = 0
    scale: float = 1.0  # run time per configured time (a rehearsal's is below 1)
    times: TraceTimes | None = field(default=None, compare=False, repr=False)

    WINDOW_NS: ClassVar[int] = 10 * NS_PER_S  # the live rate: sends in this window

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        t = f.times
        records, span = (t.records, t.span_ns) if t is not None else (f.records, f.span_ns)
        period = t.period_ns if t is not None else span + span // max(1, records - 1)
        return cls(
            rate=records * NS_PER_S / period * f.speed if period else 0.0,
            trace=f.trace,
            format=f.format,
            speed=f.speed,
            loop=f.loop,
            records=records,
            span_ns=span,
            scale=f.scale,
            times=t,
            max_in_flight=f.max_in_flight,
            max_lateness_ns=f.max_lateness_ns,
        )

    @classmethod
    def check(cls, given: Mapping[str, Any]) -> None:
        if given.get("speed", 1.0) <= 0:
            raise ValueError(f"mode {cls.mode!r} needs speed > 0")

    def placed(self, begins: datetime, scale: float) -> LoadShape:
        return replace(self, scale=scale)

    def count_before(self, offset_ns: int) -> int:
        """Instants before ``offset_ns`` from the phase start. Record m (pass m // records,
        record m % records) is at (pass * period + times[record]) / speed in trace time;
        send k replays record floor(k / scale) at that time times scale."""
        t = self.times
        if t is None or offset_ns <= 0:
            return 0
        x, n, period = offset_ns * self.speed / self.scale, t.records, t.period_ns
        if not self.loop or not period:
            m = bisect_left(t.times, x)
        else:
            passes = int(x // period)
            m = passes * n + bisect_left(t.times, x - passes * period)
        return m if self.scale == 1.0 else math.ceil(m * self.scale)

    def instant(self, k: int) -> int:
        """Send k's offset in ns (k below ``count_before`` of the phase's end)."""
        t = self.times
        assert t is not None  # a stored plan is described, never run
        m = k if self.scale == 1.0 else math.floor(k / self.scale)
        passes, j = divmod(m, t.records)
        return int((passes * t.period_ns + t.times[j]) / self.speed * self.scale)

    @property
    def peak_rate(self) -> float:
        return self.times.busiest * self.speed if self.times else self.rate

    def rate_at(self, t_ns: int, duration_ns: int) -> float:
        lo = max(0, min(t_ns, duration_ns) - self.WINDOW_NS // 2)
        hi = min(max(0, duration_ns), lo + self.WINDOW_NS)
        if self.times is None or hi <= lo:
            return self.rate
        return (self.count_before(hi) - self.count_before(lo)) * NS_PER_S / (hi - lo)

    def expected(self, duration_ns: int) -> float:
        if self.times is None:
            return OpenLoad.expected(self, duration_ns)
        return float(self.count_before(duration_ns))

    def describe(self) -> str:
        name = self.trace.rsplit("/", 1)[-1]
        looped = ", looped" if self.loop else ", once"
        rehearsed = f", 1 record in {1 / self.scale:,.4g}" if self.scale != 1.0 else ""
        return (
            f"trace {name} ({self.format}, {self.records:,} records over "
            f"{self.span_ns / NS_PER_S:,.6g}s) x{self.speed:g}: {self.rate:.4g} req/s"
            f"{looped}{rehearsed}"
        )

    def doc(self) -> dict[str, Any]:
        return OpenLoad.doc(self) | {
            "trace": self.trace,
            "format": self.format,
            "speed": self.speed,
            "loop": self.loop,
            "records": self.records,
            "span_ns": self.span_ns,
            "scale": self.scale,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Daily(OpenLoad):
    """A rate that follows the time of day in ``timezone``: an hour-of-day table (each
    hour's rate at its middle, linear between), or a cosine from ``low`` (12 h from the
    peak) to ``high`` (at ``peak_hour``). Poisson arrivals, or evenly spaced in expected
    requests (``arrival: constant``). ``anchor_s``: the phase start's seconds into the day,
    from the calendar when the plan is built (``placed``); ``rate``: the day's mean."""

    mode: ClassVar[str] = "daily"
    rate: float = 0.0
    hours: tuple[float, ...] = ()
    low: float = 0.0
    high: float = 0.0
    peak_hour: float = 0.0
    arrival: str = "poisson"
    timezone: str = "UTC"
    anchor_s: float = 0.0
    scale: float = 1.0  # run time per configured time (a rehearsal's is below 1)
    cycle: Cycle = field(init=False, compare=False, repr=False)

    KNOTS: ClassVar[int] = 96  # the cosine's, every 15 min: within 0.06 % of its amplitude

    def __post_init__(self) -> None:
        knots: list[tuple[float, float]]
        if self.hours:
            knots = [(h * 3600 + 1800.0, r) for h, r in enumerate(self.hours)]
        else:
            mid, amp = (self.low + self.high) / 2, (self.high - self.low) / 2
            step = DAY_S / self.KNOTS
            knots = [
                (
                    k * step,
                    mid + amp * math.cos(2 * math.pi * (k * step / 3600 - self.peak_hour) / 24),
                )
                for k in range(self.KNOTS)
            ]
        cycle = Cycle.of(knots)
        object.__setattr__(self, "cycle", cycle)
        object.__setattr__(self, "rate", cycle.total / DAY_S)

    @classmethod
    def of(cls, f: Fields) -> LoadShape:
        return cls(
            hours=tuple(f.hours),
            low=f.low,
            high=f.high,
            peak_hour=f.peak_hour,
            arrival=f.arrival,
            timezone=f.timezone or "UTC",
            anchor_s=f.anchor_s,
            scale=f.scale,
            max_in_flight=f.max_in_flight,
            max_lateness_ns=f.max_lateness_ns,
        )

    @classmethod
    def check(cls, given: Mapping[str, Any]) -> None:
        hours, low, high = given.get("hours"), given.get("low"), given.get("high")
        if (hours is None) == (low is None and high is None):
            raise ValueError(f"mode {cls.mode!r} needs either hours or low and high")
        if hours is not None:
            if len(hours) != 24:
                raise ValueError(
                    f"hours: needs 24 rates (one an hour from 00:00), got {len(hours)}"
                )
            if max(hours) <= 0:
                raise ValueError("hours: needs a rate above 0 in some hour")
            return
        if low is None or high is None or given.get("peak_hour") is None:
            raise ValueError(f"mode {cls.mode!r} needs low, high and peak_hour together")
        if not 0 <= low <= high or high <= 0:
            raise ValueError(f"needs 0 <= low <= high and high > 0, got low {low:g}, high {high:g}")

    @property
    def spaced(self) -> bool:
        return self.arrival == "constant"

    def placed(self, begins: datetime, scale: float) -> LoadShape:
        local = begins.astimezone(ZoneInfo(self.timezone))
        into = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
        return replace(self, anchor_s=float(into), scale=scale)

    def curve(self, seconds: float) -> Cumulative:
        return DayCurve.of(self.cycle, self.anchor_s, self.scale, seconds)

    @property
    def peak_rate(self) -> float:
        return max(self.cycle.rs)

    def rate_at(self, t_ns: int, duration_ns: int) -> float:
        return self.cycle.rate(
            self.anchor_s + max(0, min(t_ns, duration_ns)) / NS_PER_S / self.scale
        )

    def describe(self) -> str:
        rs = self.hours or (self.low, self.high)
        peak = (
            f"{max(range(24), key=lambda h: self.hours[h]):02d}:30"
            if self.hours
            else f"{int(self.peak_hour):02d}:{round(self.peak_hour % 1 * 60):02d}"
        )
        return (
            f"daily {self.arrival} {min(rs):g}-{max(rs):g} req/s (mean {self.rate:.4g}), "
            f"peak {peak} {self.timezone}"
        )

    def doc(self) -> dict[str, Any]:
        return OpenLoad.doc(self) | {
            "hours": list(self.hours),
            "low": self.low,
            "high": self.high,
            "peak_hour": self.peak_hour,
            "arrival": self.arrival,
            "timezone": self.timezone,
            "anchor_s": self.anchor_s,
            "scale": self.scale,
        }


def check_load(mode: str, **given: Any) -> None:
    """What a configured load of ``mode`` needs, or ValueError (the config's message);
    ``given``: the load's fields as the config holds them."""
    _kind(mode).check(given)


def shape_of(mode: str, **fields: Any) -> LoadShape:
    """The shape a mode's name stands for, from the fields it uses (``Fields``; the others
    ignored): the config's load, or a plan as the journal stored it. ValueError: an unknown
    mode."""
    return _kind(mode).of(Fields(**fields))


def _kind(mode: str) -> type[LoadShape]:
    kind = _MODES.get(mode)
    if kind is None:
        raise ValueError(f"unknown load mode {mode!r}")
    return kind


_MODES: dict[str, type[LoadShape]] = {
    kind.mode: kind for kind in (Closed, Constant, Poisson, Ramp, Idle, Trace, Daily, Sweep)
}
