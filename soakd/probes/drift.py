"""Probes room, latency drift: how fast the client-side P99 end-to-end latency moves.

A soak that slows down by a few percent an hour (a growing prefix cache, fragmentation,
a queue that never quite drains) is invisible in any one window's P99. So each target's
successful requests go into a ``Digest`` per ``drift_interval`` (default 60 s); when an
interval closes, its P99 becomes one point, and the drift is the Theil-Sen slope
(soakd.probes.leak's estimator) of the points of the last ``drift_window`` (default 1 h),
in seconds per hour. One slow interval (a GC pause, a neighbour's burst) barely moves it.

Intervals with fewer than ``min_requests`` successful requests give no point: their
P99 is only their slowest request. The slope appears once ``min_points`` points exist.
Memory is a digest and ``window / interval`` points per target.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from soakd.measure.analysis import Digest, theil_sen
from soakd.metrics import names as mn
from soakd.metrics.run import ProbeMetrics
from soakd.model import Finished, Sample
from soakd.probes._ticks import sleep_until_next
from soakd.probes.leak import HOUR_S

MIN_REQUESTS = 20
MIN_POINTS = 6
QUANTILE = 0.99


@dataclass(slots=True)
class _Series:
    digest: Digest = field(default_factory=Digest)
    interval: int | None = None  # index of the open interval
    points: deque[tuple[float, float]] = field(default_factory=deque)  # (t, p99 seconds)
    slope: float | None = None  # seconds per hour


class LatencyDrift:
    """P99 E2E per interval and its drift, per target. An OutcomeSink; ``tick`` (or
    ``run``) closes intervals in which no request finished."""

    def __init__(
        self,
        targets: Iterable[str],
        metrics: ProbeMetrics,
        emit: Callable[[Sample], None],
        *,
        interval_s: float,
        window_s: float,
        min_requests: int = MIN_REQUESTS,
        min_points: int = MIN_POINTS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0 or window_s < 2 * interval_s:
            raise ValueError("interval_s must be > 0 and window_s at least twice it")
        self.interval_s = interval_s
        self.window_s = window_s
        self.min_requests = max(1, min_requests)
        self.min_points = max(2, min_points)
        self._series = {t: _Series() for t in targets}
        self._metrics = metrics
        self._emit = emit
        self._clock = clock
        self._wall = wall

    def record(self, outcome: Finished) -> None:
        if outcome.error is not None:
            return
        series = self._series.get(outcome.target)
        if series is None:
            return
        index = int(self._clock() // self.interval_s)
        if series.interval != index:
            self._close(outcome.target, series, index)
        series.digest.add(outcome.e2e_ns)

    def tick(self) -> None:
        """Close every interval that has ended."""
        index = int(self._clock() // self.interval_s)
        for target, series in self._series.items():
            if series.interval is not None and series.interval != index:
                self._close(target, series, index)

    def slope_per_hour(self, target: str) -> float | None:
        """The drift of ``target``'s P99 E2E in seconds per hour; None until known."""
        series = self._series.get(target)
        return series.slope if series is not None else None

    def points(self, target: str) -> list[tuple[float, float]]:
        """``(interval midpoint, P99 seconds)`` within the window, oldest first."""
        series = self._series.get(target)
        return list(series.points) if series is not None else []

    async def run(self) -> None:
        """``tick`` several times an interval until cancelled."""
        every = min(1.0, self.interval_s / 4)
        next_t = time.monotonic()
        while True:
            self.tick()
            next_t = await sleep_until_next(next_t, every)

    def _close(self, target: str, series: _Series, new_index: int) -> None:
        closed, digest = series.interval, series.digest
        series.interval = new_index
        series.digest = Digest()
        if closed is None or digest.count < self.min_requests:
            return
        p99_ns = digest.quantile(QUANTILE)
        if p99_ns is None:  # pragma: no cover - count >= 1
            return
        p99 = p99_ns / 1e9
        t = (closed + 0.5) * self.interval_s
        series.points.append((t, p99))
        while series.points and series.points[0][0] <= t - self.window_s:
            series.points.popleft()
        wall = self._wall()
        labels = (("target", target),)
        self._metrics.e2e_p99_interval.labels(target).set(p99)
        self._emit(Sample(wall, mn.E2E_P99_INTERVAL_SECONDS, p99, labels))
        if len(series.points) < self.min_points:
            return
        slope = theil_sen([p[0] for p in series.points], [p[1] for p in series.points])
        if slope is None:  # pragma: no cover - distinct interval times
            return
        series.slope = slope * HOUR_S
        self._metrics.e2e_p99_drift.labels(target).set(series.slope)
        self._emit(Sample(wall, mn.E2E_P99_DRIFT_SECONDS_PER_HOUR, series.slope, labels))
