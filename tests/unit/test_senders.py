"""``run.workers: auto`` (the default): as many sender processes as the plan's peak needs,
1 for a light plan (as soakd always sent), at most the cores less one; a number is kept."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from soakd.config import config_from_dict
from soakd.model import Plan
from soakd.workers.senders import senders_for
from soakd.workload.plan import build_plan


def plan_of(*loads: dict[str, Any], targets: int = 1) -> Plan:
    cfg = config_from_dict(
        {
            "targets": [
                {"name": f"t{i}", "base_url": f"http://127.0.0.1:{i + 1}"} for i in range(targets)
            ],
            "phases": [
                {"name": f"p{i}", "duration": "1m", "load": load} for i, load in enumerate(loads)
            ],
        }
    )
    return build_plan(cfg, datetime(2026, 1, 1, tzinfo=UTC))


@pytest.fixture
def cores16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(16)))


def test_a_light_plan_sends_from_this_process(cores16: None) -> None:
    """A soak of an edge box (tens of requests a second, a few streams): no worker, and
    the line says why."""
    n, why = senders_for("auto", plan_of({"mode": "poisson", "rate": 20}), max_tokens=256)
    assert n == 1
    assert "peaks at 20 req/s" in why
    assert why.endswith("so this process sends")
    plan = plan_of({"mode": "closed", "concurrency": 64})
    assert senders_for("auto", plan, max_tokens=512)[0] == 1


def test_the_busiest_phase_decides(cores16: None) -> None:
    plan = plan_of(
        {"mode": "constant", "rate": 10},
        {"mode": "poisson", "rate": 5000},  # 5000 / 600 req/s a sender: 9
        {"mode": "closed", "concurrency": 8},
    )
    n, why = senders_for("auto", plan, max_tokens=16)  # 80k tokens/s: 8 by tokens
    assert n == 9
    assert "5,000 req/s" in why
    # long answers: the tokens decide (500 req/s x 512 tokens = 256k tokens/s: 26 wanted)
    n, why = senders_for("auto", plan_of({"mode": "poisson", "rate": 500}), max_tokens=512)
    assert n == 15
    assert "26 wanted, 15 on 16 cores" in why
    # a ramp at its top, closed loops by their streams, targets summed
    assert senders_for("auto", plan_of({"mode": "ramp", "rate": 1, "rate_end": 1300}), 1)[0] == 3
    two = plan_of({"mode": "closed", "concurrency": 256}, targets=2)
    assert senders_for("auto", two, 16)[0] == 8


def test_one_core_or_a_number_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0})
    heavy = plan_of({"mode": "poisson", "rate": 5000})
    assert senders_for("auto", heavy, 16)[0] == 1  # one core: the parent sends
    assert senders_for(1, heavy, 16) == (1, "run.workers: 1")  # as soakd always sent
    assert senders_for(4, plan_of({"mode": "poisson", "rate": 1}), 16) == (4, "run.workers: 4")
