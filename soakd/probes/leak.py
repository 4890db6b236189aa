"""Probes room, leak slopes: a pure, robust growth rate (bytes per hour) over a sliding window.

VRAM and RSS series are noisy (allocator chunks come and go, the batch changes), and a
soak runs for days, so the estimator must be robust and bounded:

- Decimation: readings are averaged into ``points`` equal time buckets across the
  window, so memory and CPU stay fixed however fast the probe samples.
- Theil-Sen: the slope is the median of the slopes between every pair of bucket
  points. Up to ~29 % of the points can be arbitrary (spikes, a stuck reading)
  without moving it much; plain least squares follows a single spike.

What a one-off step of height ``h`` does: the pairs on the same side of the step
have slope ~0 and the pairs straddling it are positive. Fewer than half of all pairs
straddle a step unless it sits in the middle of the window, so a step near either
end of the window does not move the slope at all; while it passes the middle the
slope rises to at most about ``h / window`` (the step spread over the window), then
falls back to ~0 once the step is in the older half. A staircase of repeated steps,
the usual shape of a leak through a caching allocator, reads as its average rise.
"""

from __future__ import annotations

from collections import deque

from soakd.measure.analysis import (
    theil_sen,  # the one estimator: the report's leak slope uses it too
)

HOUR_S = 3600.0


class LeakSlope:
    """Robust slope of one series over the last ``window_s`` seconds.

    ``add`` takes monotonic seconds and a value; ``slope_per_hour`` is recomputed only
    when a bucket closes (every ``window_s / points`` seconds), so calling it at every
    sample costs nothing. It is None until ``min_points`` buckets exist."""

    def __init__(self, window_s: float, points: int = 120, min_points: int = 6) -> None:
        if window_s <= 0 or points < 2:
            raise ValueError("window_s must be > 0 and points >= 2")
        self.window_s = window_s
        self.bucket_s = window_s / points
        self.min_points = max(2, min_points)
        self._points: deque[tuple[float, float]] = deque(maxlen=points)
        self._bucket: int | None = None  # index of the open bucket
        self._sum_t = 0.0
        self._sum_v = 0.0
        self._n = 0
        self._slope: float | None = None

    def add(self, t: float, value: float) -> None:
        bucket = int(t // self.bucket_s)
        if self._bucket is not None and bucket != self._bucket:
            self._close()
        self._bucket = bucket
        self._sum_t += t
        self._sum_v += value
        self._n += 1

    def slope_per_hour(self) -> float | None:
        return self._slope

    def reset(self) -> None:
        """Forget the series (a new process: its memory is a new story)."""
        self._points.clear()
        self._bucket = None
        self._sum_t = self._sum_v = 0.0
        self._n = 0
        self._slope = None

    @property
    def points(self) -> int:
        return len(self._points)

    @property
    def fill_ratio(self) -> float:
        """How much of the window the closed buckets span, 0-1: a slope fitted over a
        window only minutes full extrapolates a load step to an hourly rate, so alerts
        wait for most of it (VramLeak: 0.8)."""
        if not self._points:
            return 0.0
        span = self._points[-1][0] - self._points[0][0] + self.bucket_s
        return min(1.0, span / self.window_s)

    def _close(self) -> None:
        if self._n:
            t = self._sum_t / self._n
            self._points.append((t, self._sum_v / self._n))
            while self._points and self._points[0][0] < t - self.window_s:
                self._points.popleft()
        self._sum_t = self._sum_v = 0.0
        self._n = 0
        if len(self._points) < self.min_points:
            self._slope = None
            return
        ts = [p[0] for p in self._points]
        vs = [p[1] for p in self._points]
        slope = theil_sen(ts, vs)
        self._slope = None if slope is None else slope * HOUR_S
