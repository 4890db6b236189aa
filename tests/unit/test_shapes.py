"""Load shapes: each mode's behaviour, its stored form, and the config's mode names."""

from __future__ import annotations

import pytest

from soakd.config import Load
from soakd.model import NS_PER_S
from soakd.shapes import (
    Closed,
    Constant,
    Curve,
    Idle,
    LoadShape,
    Poisson,
    Ramp,
    check_load,
    shape_of,
)

NS = NS_PER_S


def test_each_config_mode_is_a_class() -> None:
    made = {
        mode: Load.model_validate({"mode": mode, "rate": 2, "rate_end": 4}).shape(64)
        for mode in ("closed", "constant", "poisson", "ramp", "idle")
    }
    assert made == {
        "closed": Closed(1),
        "constant": Constant(rate=2, max_in_flight=64),
        "poisson": Poisson(rate=2, max_in_flight=64),
        "ramp": Ramp(rate=2, rate_end=4, max_in_flight=64),
        "idle": Idle(),
    }
    assert all(s.mode == mode for mode, s in made.items())


def test_open_and_closed_answer_for_themselves() -> None:
    closed, idle = Closed(12), Idle()
    ramp = Ramp(rate=10, rate_end=30, max_in_flight=7)
    assert (closed.is_open, closed.concurrency, closed.fd_need, closed.peak_rate) == (
        False,
        12,
        12,
        0.0,
    )
    assert (idle.is_open, idle.concurrency, idle.fd_need, idle.expected(10 * NS)) == (
        False,
        0,
        0,
        0.0,
    )
    assert (ramp.is_open, ramp.concurrency, ramp.fd_need, ramp.peak_rate) == (True, 0, 7, 30.0)
    assert Ramp(rate=30, rate_end=10).peak_rate == 30.0
    assert closed.rate_at(NS, 10 * NS) == 0.0


def test_ramp_rate_and_count_come_from_one_curve() -> None:
    ramp = Ramp(rate=10, rate_end=30)
    assert ramp.rate_at(0, 10 * NS) == 10.0
    assert ramp.rate_at(5 * NS, 10 * NS) == pytest.approx(20.0)
    assert ramp.rate_at(10 * NS, 10 * NS) == pytest.approx(30.0)
    assert ramp.rate_at(99 * NS, 10 * NS) == pytest.approx(30.0)  # clamped to the phase
    assert ramp.expected(10 * NS) == 200.0
    curve = ramp.curve(10.0)
    assert curve.at(10.0) == pytest.approx(curve.total)
    for s in (0.0, 1.0, 50.0, 199.0):
        assert curve.at(curve.inverse(s)) == pytest.approx(s)
    assert Constant(rate=4).rate_at(3 * NS, 10 * NS) == 4.0
    assert Poisson(rate=4).expected(10 * NS) == 40.0
    assert Curve(2.0, 0.0, 20.0).inverse(10.0) == 5.0


def test_described_as_before() -> None:
    assert Closed(4).describe() == "closed loop, 4 concurrent"
    assert Constant(rate=2.5).describe() == "constant 2.5 req/s"
    assert Poisson(rate=3).describe() == "poisson 3 req/s"
    assert Ramp(rate=1, rate_end=9).describe() == "ramp 1 -> 9 req/s"
    assert Idle().describe() == "idle"


@pytest.mark.parametrize(
    "shape",
    [Closed(3), Constant(rate=2.0, max_in_flight=5), Ramp(rate=1.0, rate_end=9.0), Idle()],
)
def test_stored_form_round_trips(shape: LoadShape) -> None:
    doc = shape.doc()
    assert list(doc) == ["mode", "concurrency", "rate", "rate_end", "max_in_flight"]
    assert shape_of(**doc) == shape


def test_stored_form_keeps_zeros_as_before() -> None:
    # the journal's meta holds these: their types are part of the stored bytes
    assert Closed(3).doc() == {
        "mode": "closed",
        "concurrency": 3,
        "rate": 0.0,
        "rate_end": 0.0,
        "max_in_flight": 0,
    }
    assert Poisson(rate=5.0, max_in_flight=9).doc()["rate_end"] == 0.0


@pytest.mark.parametrize(
    ("mode", "fields", "message"),
    [
        ("closed", {"concurrency": 0, "rate": 0.0, "rate_end": None}, "needs concurrency >= 1"),
        ("constant", {"concurrency": 1, "rate": 0.0, "rate_end": None}, "needs rate > 0"),
        ("ramp", {"concurrency": 1, "rate": 0.0, "rate_end": None}, "needs rate > 0"),
        ("ramp", {"concurrency": 1, "rate": 1.0, "rate_end": None}, "needs rate_end"),
    ],
)
def test_check_load_refuses_what_a_mode_lacks(
    mode: str, fields: dict[str, float | None], message: str
) -> None:
    with pytest.raises(ValueError, match=f"mode '{mode}' {message}"):
        check_load(mode, **fields)  # type: ignore[arg-type]


def test_a_ramp_from_zero_is_allowed_and_unknown_modes_are_not() -> None:
    check_load("ramp", concurrency=1, rate=0.0, rate_end=5.0)
    check_load("idle", concurrency=0, rate=0.0, rate_end=None)
    with pytest.raises(ValueError, match="unknown load mode 'bogus'"):
        shape_of("bogus")
