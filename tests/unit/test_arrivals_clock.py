"""Arrivals from traces and from the clock (issue 36, item 5): ``load.mode: trace`` replays a
trace's timestamps (scaled, looped, skipped exactly); ``load.mode: daily`` follows a 24 h
cycle of rates anchored to the calendar in its time zone. Both compressed by a rehearsal,
both resumed at the right point; bad input is one line at ``soakd check``, exit 2."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from soakd.cli import main
from soakd.config import config_from_dict
from soakd.journal.resume import plan_doc
from soakd.journal.stored import StoredPlan
from soakd.model import NS_PER_S as NS
from soakd.shapes import Daily, Trace, shape_of
from soakd.workload.arrivals import arrivals
from soakd.workload.plan import build_plan
from soakd.workload.traces import read_trace

HOUR = 3600 * NS
MS = NS // 1000


def mooncake(path: Path, stamps_ms: list[int]) -> Path:
    lines = (
        json.dumps({"timestamp": t, "input_length": 10, "output_length": 4, "hash_ids": [0]})
        for t in stamps_ms
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def trace_shape(path: Path, fmt: str = "mooncake", **fields: Any) -> Trace:
    shape = shape_of(
        "trace", trace=str(path), format=fmt, times=read_trace(path, fmt, "t"), **fields
    )
    assert isinstance(shape, Trace)
    return shape


# --- trace -----------------------------------------------------------------------------------


def test_a_trace_replays_its_timestamps_relative_to_the_first_scaled_by_speed(
    tmp_path: Path,
) -> None:
    epoch = 1_700_000_000_000  # ms: Mooncake's stamps are epoch-sized, past a float's ns
    stamps = [epoch + t for t in (5000, 5000, 5100, 5400, 6001)]
    once = trace_shape(mooncake(tmp_path / "t.jsonl", stamps), speed=2.0, loop=False)
    assert list(arrivals(once, 10 * NS, random.Random(0))) == [0, 0, 50 * MS, 200 * MS, 500_500_000]
    assert once.expected(10 * NS) == 5  # not looped: nothing after the trace ends
    assert once.expected(200 * MS) == 3  # the instants before 200 ms
    # the mean rate at that speed: 5 records a period (span 1.001 s and a mean gap) / 2
    assert once.rate == pytest.approx(5 / (1.001 * 5 / 4) * 2)


def test_a_looped_trace_starts_over_one_mean_gap_after_its_last_record(tmp_path: Path) -> None:
    path = mooncake(tmp_path / "t.jsonl", [0, 100, 400])  # span 400 ms, mean gap 200 ms
    looped = trace_shape(path)
    got = list(arrivals(looped, 1800 * MS, random.Random(0)))
    period = 600 * MS
    assert got == [p * period + t * MS for p in range(3) for t in (0, 100, 400)]
    assert looped.expected(1800 * MS) == len(got) == 9
    assert looped.expected(1801 * MS) == 10  # the 4th pass's first, at 1800 ms


def test_skipping_a_trace_is_exact(tmp_path: Path) -> None:
    rng = random.Random(3)
    stamps = sorted(rng.randrange(0, 60_000) for _ in range(500))
    shape = trace_shape(mooncake(tmp_path / "t.jsonl", stamps), speed=1.5)
    duration = 10 * 60 * NS
    whole = list(arrivals(shape, duration, random.Random(0)))
    assert len(whole) == shape.expected(duration)
    for cut in (1, 7 * NS, whole[700], whole[700] + 1, 5 * 60 * NS, duration - 1):
        schedule = arrivals(shape, duration, random.Random(0))
        skipped = schedule.skip_to(cut)
        rest = list(schedule)
        assert skipped == sum(1 for t in whole if t < cut)
        assert rest == [t for t in whole if t >= cut]


def test_the_live_rate_of_a_trace_follows_its_bursts(tmp_path: Path) -> None:
    # 100 records in the first second, then one a second
    stamps = [i * 10 for i in range(100)] + [1000 * s for s in range(1, 60)]
    shape = trace_shape(mooncake(tmp_path / "t.jsonl", stamps), loop=False)
    assert shape.rate_at(0, 60 * NS) == pytest.approx(10.9)  # [0, 10 s): 100 + 9 records
    assert shape.rate_at(30 * NS, 60 * NS) == pytest.approx(1.0)
    assert shape.peak_rate == 100  # the busiest second: the sender sizing's peak


def test_a_burstgpt_csv_is_read_by_its_timestamp_column_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n"
        "5.5,GPT-4,10,2,12,API log\n"
        "8,ChatGPT,1,1,2,Conversation log\n"
    )
    shape = trace_shape(path, "burstgpt", loop=False)
    assert list(arrivals(shape, 10 * NS, random.Random(0))) == [0, 500 * MS, 3 * NS]


def test_a_rehearsed_trace_keeps_its_rate_and_passes_in_the_rehearsal_s_time(
    tmp_path: Path,
) -> None:
    # two bursts 50 s apart: 50 records in [0, 1 s) and 50 in [50, 51 s)
    stamps = [i * 20 for i in range(50)] + [50_000 + i * 20 for i in range(50)]
    shape = trace_shape(mooncake(tmp_path / "t.jsonl", stamps))
    assert shape.times is not None
    period = shape.times.period_ns  # 50.98 s and a mean gap: 51.495 s
    rehearsed = shape.placed(datetime.now(UTC), 0.1)
    assert isinstance(rehearsed, Trace)
    got = list(arrivals(rehearsed, round(3 * period * 0.1), random.Random(0)))
    # one record in ten, at a tenth of its time: the same mean rate, the bursts in place
    assert shape.expected(3 * period) == 300
    assert len(got) == 30
    assert rehearsed.rate == shape.rate
    assert rehearsed.expected(round(3 * period * 0.1)) == 30
    # where in the trace each send falls, s (1 us on: an instant is truncated to the ns)
    into = [(t / 0.1 + 1000) % period / NS for t in got]
    assert sum(1 for s in into if s < 1.0) == sum(1 for s in into if 50 <= s < 51) == 15


# --- daily -----------------------------------------------------------------------------------


def placed(shape: Daily, when: datetime, scale: float = 1.0) -> Daily:
    out = shape.placed(when, scale)
    assert isinstance(out, Daily)
    return out


MIDNIGHT = datetime(2026, 6, 1, tzinfo=UTC)


def test_a_cosine_day_peaks_at_its_hour_and_bottoms_out_twelve_hours_later() -> None:
    day = placed(Daily(low=2, high=20, peak_hour=15, timezone="UTC"), MIDNIGHT)
    at = [day.rate_at(h * HOUR // 4, 72 * HOUR) for h in range(4 * 72)]
    assert max(at) == pytest.approx(20.0)
    assert min(at) == pytest.approx(2.0)
    peaks = [q / 4 for q, r in enumerate(at) if r == max(at)]
    assert peaks == [15.0, 39.0, 63.0]  # three days, three peaks, at 15:00
    assert day.rate_at(3 * HOUR, 72 * HOUR) == pytest.approx(2.0)  # 15:00 + 12 h
    assert day.expected(24 * HOUR) == pytest.approx(11 * 86400, rel=1e-9)  # the mean, 11/s
    assert day.expected(72 * HOUR) == pytest.approx(3 * 11 * 86400, rel=1e-9)


def test_an_hour_table_gives_each_hour_its_rate_at_its_middle_and_lines_between() -> None:
    hours = [float(h) for h in range(24)]  # 0 req/s at 00:30 ... 23 at 23:30
    day = placed(Daily(hours=tuple(hours), timezone="UTC"), MIDNIGHT)
    assert day.rate_at(HOUR // 2, 24 * HOUR) == pytest.approx(0.0)
    assert day.rate_at(10 * HOUR + HOUR // 2, 24 * HOUR) == pytest.approx(10.0)
    assert day.rate_at(11 * HOUR, 24 * HOUR) == pytest.approx(10.5)
    assert day.rate_at(0, 24 * HOUR) == pytest.approx(11.5)  # between 23:30 (23) and 00:30 (0)
    assert day.expected(24 * HOUR) == pytest.approx(sum(hours) * 3600)
    assert day.peak_rate == 23.0


def test_the_cycle_is_anchored_to_the_calendar_in_its_zone() -> None:
    shape = Daily(low=1, high=9, peak_hour=14, timezone="Europe/Paris")
    noon_utc = datetime(2026, 6, 1, 12, tzinfo=UTC)  # 14:00 in Paris (summer time)
    assert placed(shape, noon_utc).rate_at(0, HOUR) == pytest.approx(9.0)
    winter = datetime(2026, 1, 15, 12, tzinfo=UTC)  # 13:00 in Paris
    assert placed(shape, winter).rate_at(HOUR, 2 * HOUR) == pytest.approx(9.0)
    ny = Daily(low=1, high=9, peak_hour=14, timezone="America/New_York")
    assert placed(ny, noon_utc).rate_at(6 * HOUR, 7 * HOUR) == pytest.approx(9.0)  # 8:00 + 6 h


def test_daily_poisson_counts_follow_the_cycle() -> None:
    day = placed(Daily(low=0, high=2, peak_hour=12, timezone="UTC"), MIDNIGHT)
    got = list(arrivals(day, 24 * HOUR, random.Random(1)))
    expected = day.expected(24 * HOUR)  # 86,400
    assert abs(len(got) - expected) < 5 * math.sqrt(expected)
    by_hour = [0] * 24
    for t in got:
        by_hour[t // HOUR] += 1
    noon, night = by_hour[11] + by_hour[12], by_hour[23] + by_hour[0]
    assert noon > 20 * night  # ~7,100 against ~130


def test_daily_constant_is_evenly_spaced_in_expected_requests_and_skips_exactly() -> None:
    day = placed(Daily(low=1, high=3, peak_hour=0, arrival="constant", timezone="UTC"), MIDNIGHT)
    whole = list(arrivals(day, 24 * HOUR, random.Random(0)))
    assert len(whole) == math.ceil(day.expected(24 * HOUR))
    assert whole[0] == 0
    gaps = [b - a for a, b in pairwise(whole)]
    assert min(gaps) == pytest.approx(NS / 3, rel=1e-3)  # at midnight, the peak
    assert max(gaps) == pytest.approx(NS / 1, rel=1e-3)  # at noon
    for cut in (whole[5000], whole[5000] + 1, 13 * HOUR):
        schedule = arrivals(day, 24 * HOUR, random.Random(0))
        assert schedule.skip_to(cut) == sum(1 for t in whole if t < cut)
        assert list(schedule) == [t for t in whole if t >= cut]


def test_a_daily_poisson_schedule_skipped_goes_on_from_the_cut() -> None:
    day = placed(Daily(low=5, high=50, peak_hour=18, timezone="UTC"), MIDNIGHT)
    schedule = arrivals(day, 24 * HOUR, random.Random(2))
    skipped = schedule.skip_to(18 * HOUR)
    ahead = day.expected(18 * HOUR)
    assert abs(skipped - ahead) < 5 * math.sqrt(ahead)
    rest = list(schedule)
    assert min(rest) >= 18 * HOUR
    assert abs(len(rest) - (day.expected(24 * HOUR) - ahead)) < 5 * math.sqrt(ahead)


# --- the plan: rehearsal, resume, the stored form --------------------------------------------


def daily_config(**load: Any) -> dict[str, Any]:
    return {
        "targets": [{"name": "sim", "simulator": "fast"}],
        "phases": [
            {
                "name": "days",
                "duration": "72h",
                "load": {"mode": "daily", "low": 1, "high": 10, "peak_hour": 14, **load},
            }
        ],
    }


def test_a_rehearsed_72h_daily_plan_keeps_three_peaks_and_its_rates() -> None:
    cfg = config_from_dict(daily_config(timezone="Asia/Tokyo"))
    start = datetime(2026, 6, 1, 0, tzinfo=UTC)  # 09:00 in Tokyo
    plan = build_plan(cfg, start, rehearse_s=180)
    (phase,) = plan.phases
    day = phase.loads["sim"]
    minute = NS * 60 // 60  # a rehearsal second stands for 24 min
    rates = [day.rate_at(s * minute, phase.duration_ns) for s in range(180)]
    peaks = [s for s in range(1, 179) if rates[s - 1] < rates[s] >= rates[s + 1]]
    # configured hour 5 (14:00 in Tokyo), then 29 and 53: rehearsal seconds 12.5, 72.5, 132.5
    assert peaks in ([12, 72, 132], [13, 73, 133])
    assert max(rates) == pytest.approx(10.0, rel=1e-3)  # the rates are the configured ones
    assert day.expected(phase.duration_ns) == pytest.approx(5.5 * 180)


def test_a_resumed_plan_puts_the_cycle_where_the_first_session_had_it() -> None:
    cfg = config_from_dict(daily_config(timezone="Europe/Paris"))
    first_start = datetime(2026, 6, 1, 3, 17, tzinfo=UTC)
    first = build_plan(cfg, first_start)
    # a resume rebuilds the plan from the stored calendar start (journal: plan_start)
    again = build_plan(cfg, first_start)
    assert StoredPlan.model_validate(plan_doc(again)) == StoredPlan.model_validate(plan_doc(first))
    # 40 h into the plan: the rate is the cycle's at that wall time in Paris
    wall = (first_start + timedelta(hours=40)).astimezone(ZoneInfo("Europe/Paris"))
    hour = wall.hour + wall.minute / 60
    want = 5.5 + 4.5 * math.cos(2 * math.pi * (hour - 14) / 24)
    day = first.phases[0].loads["sim"]
    assert day.rate_at(40 * HOUR, 72 * HOUR) == pytest.approx(want, rel=2e-3)
    # a plan built at another moment is another plan: a resume would refuse it
    later = build_plan(cfg, first_start + timedelta(hours=5))
    assert StoredPlan.model_validate(plan_doc(later)) != StoredPlan.model_validate(plan_doc(first))


def test_stored_forms_describe_as_planned(tmp_path: Path) -> None:
    path = mooncake(tmp_path / "t.jsonl", [0, 500, 1000])
    shape = trace_shape(path, speed=2.0)
    doc = shape.doc()
    stored = shape_of(**doc)  # the report's reading: no instants, the same words
    assert stored == shape
    assert (
        stored.describe()
        == shape.describe()
        == ("trace t.jsonl (mooncake, 3 records over 1s) x2: 4 req/s, looped")
    )
    day = placed(Daily(low=1, high=10, peak_hour=14.5, timezone="Europe/Paris"), MIDNIGHT)
    assert shape_of(**day.doc()) == day
    assert day.describe() == "daily poisson 1-10 req/s (mean 5.5), peak 14:30 Europe/Paris"


# --- soakd check ------------------------------------------------------------------------------


def check(
    tmp_path: Path, load: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    doc = {
        "targets": [{"name": "sim", "simulator": "fast"}],
        "phases": [{"name": "p", "duration": "10m", "load": load}],
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    rc = main(["check", str(cfg)])
    out, err = capsys.readouterr()
    return rc, out, err.strip()


def test_check_prints_the_trace_and_the_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = mooncake(tmp_path / "t.jsonl", [0, 1000, 2000, 3000])
    rc, out, _ = check(tmp_path, {"mode": "trace", "trace": str(path), "speed": 2}, capsys)
    assert rc == 0
    assert "trace t.jsonl (mooncake, 4 records over 3s) x2: 2 req/s, looped" in out
    assert "~1,200" in out  # 10 min at 2 req/s
    rc, out, _ = check(
        tmp_path,
        {"mode": "daily", "hours": [1] * 12 + [5] * 12, "timezone": "UTC", "arrival": "constant"},
        capsys,
    )
    assert rc == 0
    assert "daily constant 1-5 req/s (mean 3), peak 12:30 UTC" in out


@pytest.mark.parametrize(
    ("content", "load", "message"),
    [
        (
            '{"timestamp": 0}\n{"timestamp": 500}\n\n{"timestamp": 400}\n',
            {},
            "{f}:4: field 'timestamp' goes backwards (400 ms, below line 2's 500 ms)",
        ),
        ("", {}, "{f} holds no records"),
        (
            '{"timestamp": 0}\n{"timestamp": 5\n',
            {},
            "{f}:2: not valid JSON (Expecting ',' delimiter)",
        ),
        (
            '{"timestamp": 0}\n{"input_length": 5}\n',
            {},
            "{f}:2: field 'timestamp' must be a number (ms), got nothing",
        ),
        (
            '{"timestamp": 7}\n{"timestamp": 7}\n',
            {},
            "{f}: its 2 record(s) fall at one instant: nothing to loop over "
            "(loop: false, or a trace that spans some time)",
        ),
        (
            "Timestamp,Model\n1,a\n0.5,b\n",
            {"format": "burstgpt"},
            "{f}:3: field 'Timestamp' goes backwards (0.5 s, below line 2's 1 s)",
        ),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_file_the_line_and_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    load: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / "bad.trace"
    path.write_text(content)
    rc, _, err = check(tmp_path, {"mode": "trace", "trace": str(path), **load}, capsys)
    assert rc == 2
    assert err == "soakd: error: phases[p].load.trace: " + message.format(f=path)


@pytest.mark.parametrize(
    ("load", "message"),
    [
        (
            {"low": 1, "high": 5, "peak_hour": 3, "timezone": "Mars/Olympus"},
            "phases[p].load.timezone: 'Mars/Olympus' is not a known time zone (e.g. Europe/Paris)",
        ),
        (
            {"hours": [1] * 23},
            "phases[p].load: hours: needs 24 rates (one an hour from 00:00), got 23",
        ),
        (
            {"low": 1, "high": 5},
            "phases[p].load: mode 'daily' needs low, high and peak_hour together",
        ),
        (
            {"hours": [1] * 24, "low": 1},
            "phases[p].load: mode 'daily' needs either hours or low and high",
        ),
        (
            {"low": 5, "high": 1, "peak_hour": 2},
            "phases[p].load: needs 0 <= low <= high and high > 0, got low 5, high 1",
        ),
    ],
)
def test_a_bad_daily_cycle_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], load: dict[str, Any], message: str
) -> None:
    rc, _, err = check(tmp_path, {"mode": "daily", **load}, capsys)
    assert rc == 2
    assert err == f"soakd: error: {message}"


def test_a_trace_load_needs_a_trace_and_its_keys_belong_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = check(tmp_path, {"mode": "trace"}, capsys)
    assert (rc, err) == (
        2,
        "soakd: error: phases[p].load.trace: mode 'trace' needs a trace file: load.trace, "
        "or workload.prompts.source mooncake or burstgpt with its file",
    )
    rc, _, err = check(tmp_path, {"mode": "poisson", "rate": 1, "speed": 2}, capsys)
    assert (rc, err) == (
        2,
        "soakd: error: phases[p].load: speed: only for mode 'trace', not 'poisson'",
    )


def test_the_examples_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the trace's path is the repo's
    assert main(["check", "examples/daily.yaml", "examples/trace.yaml"]) == 0
    out = capsys.readouterr().out
    assert "daily poisson 0.2-3 req/s (mean 1.6), peak 14:00 Europe/Paris" in out
    assert "trace mooncake-sample.jsonl (mooncake, 240 records over 54.469s) x2" in out
