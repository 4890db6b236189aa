"""Gateway breakers as state machines, on a fake clock (no IO)."""

from __future__ import annotations

from typing import Any

import pytest

from soakd.config import ErrorBreaker, VramBreaker
from soakd.gateway.breaker import Admit, ErrorRateBreakerState, State, VramBreakerState

GB = 1e9


class Log:
    def __init__(self) -> None:
        self.moves: list[tuple[str, State, State, dict[str, Any]]] = []

    def __call__(self, name: str, before: State, to: State, why: dict[str, Any]) -> None:
        self.moves.append((name, before, to, why))

    @property
    def states(self) -> list[State]:
        return [m[2] for m in self.moves]


def vram(**kw: Any) -> tuple[VramBreakerState, Log]:
    log = Log()
    return VramBreakerState(VramBreaker(**kw), log), log


def test_vram_opens_only_after_the_hold() -> None:
    b, log = vram(limit_bytes=3.9 * GB, hold=5.0)
    for t in range(5):  # above for 4 s: still closed
        b.reading(float(t), 4.0 * GB)
        assert b.state is State.CLOSED
        assert b.admit(float(t)) is Admit.YES
    b.reading(5.0, 4.0 * GB)  # the reading at 5 s held: open
    assert b.state is State.OPEN
    assert b.admit(5.0) is Admit.NO
    assert log.moves[0][3] == {"used_bytes": 4.0 * GB, "limit_bytes": 3.9 * GB, "above_for_s": 5.0}


def test_vram_dip_below_the_limit_restarts_the_hold() -> None:
    b, _ = vram(limit_bytes=3.9 * GB, hold=5.0)
    for t, used in [(0, 4.0), (3, 4.0), (4, 3.8), (5, 4.0), (9, 4.0)]:
        b.reading(float(t), used * GB)
    assert b.state is State.CLOSED  # above since 5 s only: 4 s held
    b.reading(10.0, 4.0 * GB)
    assert b.state is State.OPEN


def test_vram_half_open_after_below_the_mark_then_one_probe_closes() -> None:
    b, log = vram(limit_bytes=3.9 * GB, hold=1.0, lower_mark_bytes=3.8 * GB, close_hold=2.0)
    b.reading(0.0, 4.0 * GB)
    b.reading(1.0, 4.0 * GB)
    assert b.state is State.OPEN
    b.reading(2.0, 3.85 * GB)  # below the limit but above the mark: stays open
    b.reading(10.0, 3.85 * GB)
    assert b.state is State.OPEN
    b.reading(11.0, 3.7 * GB)
    b.reading(12.0, 3.7 * GB)
    assert b.state is State.OPEN  # 1 s below the mark of the 2 s asked
    b.reading(13.0, 3.7 * GB)
    assert b.state is State.HALF_OPEN
    assert b.admit(13.0) is Admit.PROBE
    assert b.admit(13.1) is Admit.NO  # one probe at a time
    b.probe_done(14.0, ok=True)
    assert b.state is State.CLOSED
    assert b.admit(14.0) is Admit.YES
    assert log.states == [State.OPEN, State.HALF_OPEN, State.CLOSED]


def test_vram_failed_probe_or_rising_memory_reopens() -> None:
    b, log = vram(limit_bytes=3.9 * GB, hold=0.0, close_hold=0.0)
    b.reading(0.0, 4.0 * GB)
    b.reading(1.0, 3.0 * GB)
    assert b.state is State.HALF_OPEN
    assert b.admit(1.0) is Admit.PROBE
    b.probe_done(2.0, ok=False)
    assert b.state is State.OPEN
    b.reading(3.0, 3.0 * GB)
    assert b.state is State.HALF_OPEN
    b.reading(4.0, 4.5 * GB)  # memory rises while probing: open at once
    assert b.state is State.OPEN
    assert log.states == [State.OPEN, State.HALF_OPEN, State.OPEN, State.HALF_OPEN, State.OPEN]


def test_vram_released_probe_lets_the_next_request_probe() -> None:
    b, _ = vram(hold=0.0, close_hold=0.0)
    b.reading(0.0, 5 * GB)
    b.reading(1.0, 1 * GB)
    assert b.admit(1.0) is Admit.PROBE
    b.release_probe()
    assert b.admit(1.0) is Admit.PROBE


def test_vram_missing_readings_keep_the_state() -> None:
    b, _ = vram(hold=0.0)
    b.reading(0.0, 5 * GB)
    assert b.state is State.OPEN
    for t in range(1, 100):
        b.reading(float(t), None)
    assert b.state is State.OPEN


def test_vram_disabled_admits_and_closes() -> None:
    b, log = vram(hold=0.0)
    b.reading(0.0, 5 * GB)
    assert b.state is State.OPEN
    b.set_enabled(False, 1.0)
    assert b.state is State.CLOSED
    assert log.moves[-1][3] == {"reason": "disabled"}
    b.reading(2.0, 5 * GB)
    assert b.admit(2.0) is Admit.YES
    b.set_enabled(True, 3.0)
    b.reading(3.0, 5 * GB)
    assert b.state is State.OPEN


def test_vram_config_marks() -> None:
    assert VramBreaker().lower_mark == pytest.approx(0.97 * 3.9e9)
    assert VramBreaker(limit_bytes="4GB").limit_bytes == 4e9
    with pytest.raises(ValueError, match="lower_mark_bytes"):
        VramBreaker(limit_bytes=3e9, lower_mark_bytes=3e9)


def errors(**kw: Any) -> tuple[ErrorRateBreakerState, Log]:
    log = Log()
    cfg = ErrorBreaker(**({"threshold": 0.5, "window": 30, "min_requests": 10, "open_for": 30}
                          | kw))  # fmt: skip
    return ErrorRateBreakerState(cfg, log), log


def test_error_breaker_needs_min_requests() -> None:
    b, _ = errors()
    for i in range(9):
        b.result(float(i), failed=True)
    assert b.state is State.CLOSED  # 9 failures of 9, but fewer than min_requests
    b.result(9.0, failed=False)
    assert b.state is State.OPEN  # 9 of 10 is above 50 %


def test_error_breaker_opens_above_the_threshold_and_probes_after_open_for() -> None:
    b, log = errors(min_requests=4)
    for i, failed in enumerate([False, False, True, True]):
        b.result(float(i), failed=failed)
    assert b.state is State.CLOSED  # 2/4 = 50 %: not above
    b.result(4.0, failed=True)
    assert b.state is State.OPEN  # 3/5
    assert b.admit(10.0) is Admit.NO
    assert b.retry_after_s(10.0) == pytest.approx(24.0)
    assert b.admit(34.0) is Admit.PROBE  # open_for (30 s) passed
    assert b.state is State.HALF_OPEN
    assert b.admit(34.0) is Admit.NO
    b.probe_done(35.0, ok=False)
    assert b.state is State.OPEN
    b.tick(64.9)
    assert b.state is State.OPEN
    b.tick(65.0)
    assert b.state is State.HALF_OPEN
    assert b.admit(65.0) is Admit.PROBE
    b.probe_done(66.0, ok=True)
    assert b.state is State.CLOSED
    assert b.requests == 0  # a fresh window after closing
    assert log.states == [State.OPEN, State.HALF_OPEN, State.OPEN, State.HALF_OPEN, State.CLOSED]


def test_error_breaker_window_forgets_old_failures() -> None:
    b, _ = errors(min_requests=5)
    for i in range(4):
        b.result(float(i), failed=True)
    for i in range(5):  # 40 s later the failures are out of the 30 s window
        b.result(40.0 + i, failed=i == 0)
    assert b.state is State.CLOSED
    assert b.requests == 5
    assert b.ratio == pytest.approx(0.2)
