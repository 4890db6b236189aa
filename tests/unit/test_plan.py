"""The plan: phases back to back in ns, calendar ends resolved, loops, caps, rehearsals."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from soakd.config import Config, ConfigError, config_from_dict
from soakd.shapes import Closed, Poisson, Ramp
from soakd.workload.plan import build_plan, describe_plan, plan_start

NS = 1_000_000_000
H = 3600 * NS
# a Friday afternoon
NOW = datetime(2026, 11, 27, 16, 0, 0, tzinfo=UTC)


def config(phases: list[dict[str, Any]], **run: Any) -> Config:
    return config_from_dict(
        {
            "targets": [
                {"name": "local", "base_url": "http://127.0.0.1:8000", "model": "m"},
                {"name": "cloud", "base_url": "http://127.0.0.1:9000", "model": "m"},
            ],
            "phases": phases,
            "run": run,
        }
    )


def phase(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, **kw}


def plan_error(cfg: Config, **kw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, NOW, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_durations_add_up_back_to_back() -> None:
    cfg = config([phase("warmup", duration="10m"), phase("steady", duration="71h50m")])
    plan = build_plan(cfg, NOW)
    assert [p.name for p in plan.phases] == ["warmup", "steady"]
    assert [p.index for p in plan.phases] == [0, 1]
    assert plan.phases[0].start_ns == 0
    assert plan.phases[0].end_ns == plan.phases[1].start_ns == 600 * NS
    assert plan.duration_ns == 72 * H
    assert plan.scale == 1.0
    assert plan.phase_at(0) is plan.phases[0]
    assert plan.phase_at(600 * NS) is plan.phases[1]
    assert plan.phase_at(72 * H) is None


def test_loads_per_target() -> None:
    cfg = config(
        [
            phase(
                "mixed",
                duration="1h",
                load={"mode": "poisson", "rate": 5, "concurrency": 3},
                targets={"cloud": {"mode": "ramp", "rate": 1, "rate_end": 9, "max_in_flight": 7}},
            ),
            phase("closed", duration="1h", load={"mode": "closed", "concurrency": 4}),
        ]
    )
    first, second = build_plan(cfg, NOW).phases
    assert first.loads == {
        # an open loop without max_in_flight is capped by the target's connection pool
        "local": Poisson(rate=5, max_in_flight=1024),
        "cloud": Ramp(rate=1, rate_end=9, max_in_flight=7),
    }
    assert second.loads["local"] == Closed(4)
    assert cfg.load_for(cfg.phases[1], "cloud").shape() == Closed(4)


def test_until_an_iso_datetime() -> None:
    cfg = config([phase("warmup", duration="1h"), phase("soak", until="2026-11-30T08:00:00+01:00")])
    plan = build_plan(cfg, NOW)
    # Fri 17:00 UTC -> Mon 07:00 UTC
    assert plan.phases[1].start_ns == H
    assert plan.phases[1].duration_ns == (2 * 24 + 14) * H


def test_until_a_naive_datetime_is_utc() -> None:
    cfg = config([phase("soak", until="2026-11-28T16:00:00")])
    assert build_plan(cfg, NOW).duration_ns == 24 * H
    # and a naive now is UTC too
    assert build_plan(cfg, NOW.replace(tzinfo=None)).duration_ns == 24 * H


def test_until_cron_fires_after_the_phase_start() -> None:
    # crontab's 1-5 is Monday to Friday: the next 08:00 after Friday 16:10 is Monday's
    cfg = config([phase("warmup", duration="10m"), phase("soak", until="0 8 * * 1-5")])
    soak = build_plan(cfg, NOW).phases[1]
    assert soak.duration_ns == (2 * 24 + 15) * H + 50 * 60 * NS


@pytest.mark.parametrize(
    ("expr", "hours"),
    [
        ("0 8 * * *", 16),  # Sat 08:00
        ("0 8 * * 0", 40),  # Sunday is 0 in crontab (APScheduler 3 would say Monday)
        ("0 8 * * 7", 40),  # and 7
        ("0 8 * * sun", 40),
        ("0 8 * * 6-7", 16),  # Saturday
        ("0 16 * * *", 24),  # strictly after: not the same instant
        ("0 0 1 * *", 3 * 24 + 8),  # Tue 1 Dec 00:00
    ],
)
def test_cron_forms(expr: str, hours: int) -> None:
    cfg = config([phase("soak", until=expr)])
    assert build_plan(cfg, NOW).duration_ns == hours * H


def test_start_at_sets_the_calendar() -> None:
    cfg = config([phase("soak", until="0 8 * * *")], start_at="2026-11-28T07:00:00Z")
    assert plan_start(cfg, NOW) == datetime(2026, 11, 28, 7, tzinfo=UTC)
    assert build_plan(cfg, NOW).duration_ns == H


def test_loop_repeats_until_the_run_duration() -> None:
    cfg = config(
        [phase("busy", duration="50m"), phase("quiet", duration="10m")],
        loop=True,
        duration="72h",
    )
    plan = build_plan(cfg, NOW)
    assert len(plan.phases) == 144
    assert [p.name for p in plan.phases[:4]] == ["busy", "quiet", "busy", "quiet"]
    assert [p.index for p in plan.phases] == list(range(144))
    assert plan.duration_ns == 72 * H
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(plan.phases))


def test_loop_with_cron_resolves_each_pass() -> None:
    # busy until the next full hour, then 15 minutes quiet, again and again
    cfg = config(
        [phase("busy", until="0 * * * *"), phase("quiet", duration="15m")],
        loop=True,
        duration="3h",
        start_at="2026-11-27T16:30:00Z",
    )
    plan = build_plan(cfg, NOW)
    minutes = [(p.name, p.duration_ns // (60 * NS)) for p in plan.phases]
    assert minutes == [
        ("busy", 30),
        ("quiet", 15),
        ("busy", 45),
        ("quiet", 15),
        ("busy", 45),
        ("quiet", 15),
        ("busy", 15),  # cut by run.duration
    ]


def test_duration_caps_and_shortens_the_last_phase() -> None:
    cfg = config([phase("a", duration="1h"), phase("b", duration="1h"), phase("c", duration="1h")])
    plan = build_plan(cfg, NOW, duration_cap_s=5400)
    assert [p.name for p in plan.phases] == ["a", "b"]
    assert plan.phases[-1].duration_ns == 1800 * NS
    capped = config([phase("a", duration="1h"), phase("b", duration="1h")], duration="90m")
    assert build_plan(capped, NOW).duration_ns == 5400 * NS
    # the smaller cap wins; a cap past the end changes nothing
    assert build_plan(capped, NOW, duration_cap_s=60).duration_ns == 60 * NS
    assert build_plan(cfg, NOW, duration_cap_s=86400).duration_ns == 3 * H


def test_rehearse_compresses_72h_into_5m() -> None:
    cfg = config(
        [
            phase("warmup", duration="10m", load={"mode": "closed", "concurrency": 2}),
            phase("soak", duration="71h", load={"mode": "poisson", "rate": 4}),
            phase("cooldown", duration="50m"),
        ]
    )
    real = build_plan(cfg, NOW)
    fast = build_plan(cfg, NOW, rehearse_s=300)
    assert fast.duration_ns == 300 * NS
    assert fast.scale == pytest.approx(300 / (72 * 3600))
    for r, f in zip(real.phases, fast.phases, strict=True):
        assert f.name == r.name
        assert f.start_ns == pytest.approx(r.start_ns * fast.scale, abs=1)
        assert f.end_ns == pytest.approx(r.end_ns * fast.scale, abs=1)
        assert f.loads == r.loads  # the real load, for less time
    assert fast.phases[0].duration_ns == pytest.approx(600 * NS * fast.scale, abs=1)


def test_rehearse_after_a_cap() -> None:
    cfg = config([phase("soak", duration="72h")], duration="24h")
    fast = build_plan(cfg, NOW, rehearse_s=60)
    assert fast.duration_ns == 60 * NS
    assert fast.scale == pytest.approx(60 / 86400)


def test_describe_plan() -> None:
    cfg = config(
        [
            phase("warmup", duration="10m", load={"mode": "closed", "concurrency": 4}),
            phase(
                "soak",
                duration="71h50m",
                load={"mode": "poisson", "rate": 5},
                targets={"cloud": {"mode": "idle"}},
            ),
        ]
    )
    text = describe_plan(build_plan(cfg, NOW), cfg)
    lines = text.splitlines()
    assert lines[0].split() == ["#", "phase", "start", "duration", "target", "load", "requests"]
    assert lines[1].split()[:4] == ["0", "warmup", "0s", "10m"]
    assert "closed loop, 4 concurrent" in lines[1]
    assert lines[3].split()[:4] == ["1", "soak", "10m", "2d23h50m"]
    assert "poisson 5 req/s" in lines[3]
    assert "~1,293,000" in lines[3]
    assert "total: 3d in 2 phase(s)" in text
    assert "local: ~1,293,000 open-loop requests, closed loop for 10m" in text
    assert "rehearsal" not in text


def test_describe_a_rehearsal_shows_both_times() -> None:
    cfg = config([phase("warmup", duration="12m"), phase("soak", duration="71h48m")])
    text = describe_plan(build_plan(cfg, NOW, rehearse_s=300), cfg)
    header = text.splitlines()[0]
    assert "rehearsal start" in header
    assert "rehearsal duration" in header
    soak = text.splitlines()[3].split()
    assert soak[:6] == ["1", "soak", "12m", "2d23h48m", "0.833s", "4m59s"]
    assert "rehearsal: the plan in 5m" in text


def test_describe_a_long_loop_elides_the_middle() -> None:
    cfg = config([phase("tick", duration="1m")], loop=True, duration="72h")
    text = describe_plan(build_plan(cfg, NOW), cfg, max_rows=20)
    assert "... 4300 more phases ..." in text
    assert len(text.splitlines()) < 60


# --- errors name the field -----------------------------------------------------------


def test_until_already_past() -> None:
    cfg = config([phase("burn-in", until="2026-11-27T15:00:00Z")])
    assert plan_error(cfg).startswith("phases[burn-in].until: 2026-11-27T15:00:00Z is already past")


def test_until_past_by_the_time_the_phase_begins() -> None:
    cfg = config([phase("warmup", duration="2h"), phase("burn-in", until="2026-11-27T17:00:00Z")])
    assert "phases[burn-in].until" in plan_error(cfg)


@pytest.mark.parametrize(
    ("until", "message"),
    [
        ("0 8 * * x", "phases[burn-in].until: '0 8 * * x' is not a valid cron expression"),
        ("61 8 * * *", "phases[burn-in].until: '61 8 * * *' is not a valid cron expression"),
        ("0 8 * * 8", "phases[burn-in].until: '0 8 * * 8' is not a valid cron expression"),
        ("0 8 30 2 *", "phases[burn-in].until: '0 8 30 2 *' never fires"),
        ("0 8 1 * 1", "phases[burn-in].until: '0 8 1 * 1' restricts both day of month"),
        ("tomorrow", "phases[burn-in].until: 'tomorrow' is neither an ISO datetime"),
        ("0 8 * *", "phases[burn-in].until: '0 8 * *' is neither an ISO datetime"),
    ],
)
def test_bad_until(until: str, message: str) -> None:
    assert plan_error(config([phase("burn-in", until=until)])).startswith(message)


def test_bad_start_at() -> None:
    cfg = config([phase("soak", duration="1h")], start_at="next friday")
    assert plan_error(cfg).startswith("run.start_at: 'next friday' is not an ISO datetime")


def test_fixed_until_cannot_loop() -> None:
    cfg = config(
        [phase("soak", until="2026-12-01T00:00:00Z")],
        loop=True,
        duration="72h",
    )
    assert plan_error(cfg).startswith("phases[soak].until: '2026-12-01T00:00:00Z' is a fixed")


def test_bad_caps() -> None:
    cfg = config([phase("soak", duration="1h")])
    assert plan_error(cfg, rehearse_s=0).startswith("--rehearse: must be above zero")
    assert plan_error(cfg, duration_cap_s=-1).startswith("--duration: must be above zero")
    zero = config([phase("soak", duration="1h")], duration="0s")
    assert plan_error(zero).startswith("run.duration: must be above zero")


def test_a_loop_of_tiny_phases_is_refused() -> None:
    cfg = config([phase("tick", duration="1ms")], loop=True, duration="72h")
    assert plan_error(cfg).startswith("run.loop: the plan would hold over")


def test_plan_start_defaults_to_now() -> None:
    cfg = config([phase("soak", duration="1h")])
    assert plan_start(cfg, NOW) == NOW
    assert plan_start(cfg, NOW.replace(tzinfo=None)) == NOW
    assert plan_start(cfg, NOW) + timedelta(hours=1) == NOW + timedelta(hours=1)
