"""Restart detection: each restart counted once, from the best evidence at hand."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.metrics.run import ProbeMetrics
from soakd.model import ErrorKind, Outcome, Sample
from soakd.probes.health import TargetState


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def state(confirm_s: float = 30.0) -> tuple[TargetState, CollectorRegistry, Clock, list]:
    reg = CollectorRegistry()
    clock = Clock()
    samples: list[Sample] = []
    st = TargetState("t", ProbeMetrics(reg), samples.append, confirm_s=confirm_s, clock=clock)
    told: list[tuple[str, str, float | None]] = []
    st.listeners.append(lambda *a: told.append(a))
    return st, reg, clock, told


def restarts(reg: CollectorRegistry) -> float | None:
    return reg.get_sample_value("soakd_target_restarts_total", {"target": "t"})


def up(reg: CollectorRegistry) -> float | None:
    return reg.get_sample_value("soakd_target_up", {"target": "t"})


def outcome(error: ErrorKind | None) -> Outcome:
    return Outcome(target="t", phase="p", seq=0, scheduled_ns=0, error=error)


def test_refused_then_up_without_start_time_is_a_restart() -> None:
    st, reg, clock, told = state()
    st.health(True, "HTTP 200")
    st.record(outcome(ErrorKind.CONNECT_REFUSED))
    assert up(reg) == 0
    clock.t += 40
    st.health(False, "connection refused", hard=True)
    st.health(True, "HTTP 200")
    st.record(outcome(None))
    assert up(reg) == 1
    assert restarts(reg) == 1
    assert told == [("t", "down_then_up", 100.0)]


def test_start_up_is_not_a_restart() -> None:
    st, reg, _, _ = state()
    st.health(False, "connection refused", hard=True)  # not started yet
    st.health(True, "HTTP 200")
    assert restarts(reg) in (None, 0)


def test_timeout_then_up_is_not_a_restart() -> None:
    st, reg, _, _ = state()
    st.health(True, "HTTP 200")
    st.health(False, "timeout")
    st.health(False, "HTTP 503")
    st.health(True, "HTTP 200")
    assert up(reg) == 1
    assert restarts(reg) in (None, 0)


def test_start_time_confirms_a_down_up_once() -> None:
    st, reg, clock, told = state()
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection refused", hard=True)
    clock.t += 90  # vLLM loads for a while
    st.health(True, "HTTP 200")
    assert restarts(reg) in (None, 0)  # waits for the scrape
    st.saw_start_time(1095.0)
    st.saw_start_time(1095.0)
    st.tick()
    clock.t += 100
    st.tick()
    assert restarts(reg) == 1
    assert told == [("t", "start_time_changed", 100.0)]


def test_same_start_time_after_a_blip_is_not_a_restart() -> None:
    st, reg, _, _ = state()
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection reset", hard=True)
    st.health(True, "HTTP 200")
    with capture_logs() as logs:
        st.saw_start_time(1000.0)
    assert restarts(reg) in (None, 0)
    assert [e["event"] for e in logs] == ["target_recovered_without_restart"]


def test_scrape_first_then_health_counts_once() -> None:
    st, reg, _, _ = state()
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection refused", hard=True)
    st.saw_start_time(1200.0)  # the scrape sees the new process before the health check
    st.health(True, "HTTP 200")
    st.saw_start_time(1200.0)
    assert restarts(reg) == 1


def test_fast_restart_seen_only_by_start_time() -> None:
    st, reg, _, _ = state()
    st.health(True, "HTTP 200")
    st.saw_start_time(1000.0)
    st.saw_start_time(1003.0)  # restarted between two health checks
    assert up(reg) == 1
    assert restarts(reg) == 1


def test_silent_scrape_after_down_up_counts_after_confirm_time() -> None:
    st, reg, clock, _ = state(confirm_s=15)
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection refused", hard=True)
    st.health(True, "HTTP 200")
    clock.t += 10
    st.tick()
    assert restarts(reg) in (None, 0)
    clock.t += 10
    with capture_logs() as logs:
        st.tick()
    assert restarts(reg) == 1
    assert logs[0]["event"] == "target_restarted"
    assert logs[0]["reason"] == "down_then_up"


def test_server_without_start_time_decides_at_once() -> None:
    st, reg, _, _ = state()
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection refused", hard=True)
    st.health(True, "HTTP 200")
    st.saw_start_time(None)  # the new server does not export it
    assert restarts(reg) == 1


def test_a_graceful_stop_and_restart_is_one_restart() -> None:
    """SIGTERM: the server refuses new connections, finishes what it had in flight, is down
    for a while (vLLM loads its model again), then comes back with a new start time."""
    st, reg, clock, told = state(confirm_s=15)
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    in_flight = outcome(None)
    in_flight.sent_ns = 1  # sent long before the stop
    st.health(False, "connection refused", hard=True)
    st.record(in_flight)  # its answer comes back after the down was seen
    clock.t += 20
    st.tick()  # 20 s into the outage: nothing is counted while it is down
    assert restarts(reg) in (None, 0)
    assert up(reg) == 0
    clock.t += 60
    st.health(True, "HTTP 200")
    st.saw_start_time(1080.0)  # the new process
    st.tick()
    clock.t += 60
    st.tick()
    assert restarts(reg) == 1
    assert [reason for _, reason, _ in told] == ["start_time_changed"]


def test_an_up_that_goes_down_again_before_confirmation_is_one_outage() -> None:
    st, reg, clock, told = state(confirm_s=15)
    st.saw_start_time(1000.0)
    st.health(True, "HTTP 200")
    st.health(False, "connection refused", hard=True)
    clock.t += 5
    st.health(True, "HTTP 200")  # a blip of an answer (a proxy, a half-started server)
    st.health(False, "connection refused", hard=True)  # and down again
    clock.t += 30
    st.tick()
    assert restarts(reg) in (None, 0)
    st.health(True, "HTTP 200")
    st.saw_start_time(1040.0)
    assert restarts(reg) == 1
    assert told == [("t", "start_time_changed", 100.0)]  # down since the first refusal
