"""P99 E2E drift (soakd/probes/drift.py) on synthetic latencies with known answers."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from soakd.config import AlertLimits, Slo, config_from_dict
from soakd.metrics.run import Metrics, ProbeMetrics
from soakd.model import ErrorKind, Outcome, Sample
from soakd.probes import make_probes
from soakd.probes.drift import LatencyDrift

INTERVAL = 60.0
WINDOW = 3600.0


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0  # a monotonic clock starts anywhere

    def __call__(self) -> float:
        return self.t


def outcome(e2e_s: float, target: str = "t", error: ErrorKind | None = None) -> Outcome:
    return Outcome(
        target=target,
        phase="p",
        seq=0,
        scheduled_ns=1,
        sent_ns=1,
        end_ns=1 + int(e2e_s * 1e9),
        status=200 if error is None else 500,
        error=error,
    )


def drift() -> tuple[LatencyDrift, Clock, CollectorRegistry, list[Sample]]:
    reg = CollectorRegistry()
    clock = Clock()
    samples: list[Sample] = []
    d = LatencyDrift(
        ["t"],
        ProbeMetrics(reg),
        samples.append,
        interval_s=INTERVAL,
        window_s=WINDOW,
        clock=clock,
    )
    return d, clock, reg, samples


def feed(
    d: LatencyDrift,
    clock: Clock,
    minutes: int,
    p99_at: Callable[[int], float],
    n: int = 200,
    seed: int = 0,
) -> None:
    """``minutes`` intervals of ``n`` requests each; in interval ``i`` the slowest 1 % take
    ``p99_at(i)`` seconds and the rest are spread below half of it, so the P99 is known."""
    rng = random.Random(seed)
    start = (clock.t // INTERVAL + 1) * INTERVAL  # the next interval boundary
    for i in range(minutes):
        slow = p99_at(i)
        values = [slow] * (n // 100 + 1) + [
            rng.uniform(0.1, 0.5) * slow for _ in range(n - n // 100 - 1)
        ]
        rng.shuffle(values)
        for k, v in enumerate(values):
            clock.t = start + i * INTERVAL + (k + 0.5) * INTERVAL / n
            d.record(outcome(v))
    clock.t = start + minutes * INTERVAL + 0.1
    d.tick()


def value(reg: CollectorRegistry, name: str) -> float | None:
    return reg.get_sample_value(name, {"target": "t"})


def test_linear_growth_reads_as_its_slope() -> None:
    """P99 from 2.0 s rising 0.6 s per hour, sampled for one hour: 0.6 s/h."""
    d, clock, reg, samples = drift()
    feed(d, clock, 60, lambda i: 2.0 + 0.6 * i / 60)
    slope = value(reg, "soakd_e2e_p99_drift_seconds_per_hour")
    assert slope == pytest.approx(0.6, rel=0.05)
    assert d.slope_per_hour("t") == slope
    last = value(reg, "soakd_e2e_p99_interval_seconds")
    assert last == pytest.approx(2.0 + 0.6 * 59 / 60, rel=0.011)  # the digest's 1 %
    names = {s.name for s in samples}
    assert names == {"soakd_e2e_p99_drift_seconds_per_hour", "soakd_e2e_p99_interval_seconds"}


def test_falling_latency_is_a_negative_drift() -> None:
    d, clock, reg, _ = drift()
    feed(d, clock, 30, lambda i: 5.0 - 2.0 * i / 60)  # -2 s per hour, half an hour
    assert value(reg, "soakd_e2e_p99_drift_seconds_per_hour") == pytest.approx(-2.0, rel=0.05)


def test_flat_with_slow_spikes_is_no_drift() -> None:
    """Five intervals out of sixty with a P99 ten times the rest barely move it."""
    spikes = {7, 21, 33, 48, 55}
    d, clock, reg, _ = drift()
    feed(d, clock, 60, lambda i: 15.0 if i in spikes else 1.5)
    slope = value(reg, "soakd_e2e_p99_drift_seconds_per_hour")
    assert slope is not None
    assert abs(slope) < 0.02


def test_noise_around_a_slope() -> None:
    """P99 of 3 s rising 1.2 s/h with +-10 % noise per interval."""
    rng = random.Random(7)
    d, clock, reg, _ = drift()
    feed(d, clock, 60, lambda i: (3.0 + 1.2 * i / 60) * rng.uniform(0.9, 1.1))
    assert value(reg, "soakd_e2e_p99_drift_seconds_per_hour") == pytest.approx(1.2, rel=0.2)


def test_no_slope_until_enough_points_and_requests() -> None:
    d, clock, reg, _ = drift()
    feed(d, clock, 5, lambda i: 1.0 + i)  # 5 points: one short of min_points
    assert value(reg, "soakd_e2e_p99_interval_seconds") is not None
    assert value(reg, "soakd_e2e_p99_drift_seconds_per_hour") is None
    feed(d, clock, 3, lambda i: 100.0, n=10)  # too few requests: no points at all
    assert len(d.points("t")) == 5
    assert value(reg, "soakd_e2e_p99_drift_seconds_per_hour") is None
    feed(d, clock, 1, lambda i: 6.0)
    assert len(d.points("t")) == 6
    assert value(reg, "soakd_e2e_p99_drift_seconds_per_hour") is not None


def test_the_window_forgets_old_intervals() -> None:
    """A step up two hours ago is gone from a one-hour window: flat again."""
    d, clock, reg, _ = drift()
    feed(d, clock, 60, lambda i: 1.0 + i / 60)  # 1 s/h for an hour
    feed(d, clock, 120, lambda i: 2.0)  # then flat for two
    assert len(d.points("t")) <= WINDOW / INTERVAL
    slope = value(reg, "soakd_e2e_p99_drift_seconds_per_hour")
    assert slope == pytest.approx(0.0, abs=1e-9)


def test_errors_and_unknown_targets_are_ignored() -> None:
    d, clock, _reg, _ = drift()
    for _ in range(500):
        d.record(outcome(9.0, error=ErrorKind.HTTP_5XX))
        d.record(outcome(9.0, target="other"))
    clock.t += 2 * INTERVAL
    d.tick()
    assert d.points("t") == []
    assert d.points("other") == []


def test_the_drift_limit_is_exported() -> None:
    m = Metrics()
    m.set_limits(Slo(), AlertLimits())
    assert m.registry.get_sample_value("soakd_e2e_p99_drift_limit_seconds_per_hour") == 1.0
    m.set_limits(Slo(), AlertLimits(e2e_p99_drift_per_hour=0.25))
    assert m.registry.get_sample_value("soakd_e2e_p99_drift_limit_seconds_per_hour") == 0.25


def test_probes_feed_outcomes_to_the_drift() -> None:
    cfg = config_from_dict(
        {
            "targets": [{"name": "t", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
            "phases": [{"name": "p", "duration": "1m", "load": {"mode": "closed"}}],
            "probes": {"drift_interval": "10s", "drift_window": "5m"},
            "gpu": {"source": "none"},
        }
    )
    probes = make_probes(cfg, ProbeMetrics(CollectorRegistry()), {}, lambda s: None)
    assert (probes.drift.interval_s, probes.drift.window_s) == (10.0, 300.0)
    for _ in range(3):
        probes.outcome_sink.record(outcome(1.0))
    assert probes.drift._series["t"].digest.count == 3
