"""SLO verdicts, goodput and cost on synthetic journals: every expected number is counted
here from the requests the test wrote, not read back from soakd."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from soakd.cli import main
from soakd.config import (
    AlertLimits,
    Compare,
    ConfigError,
    Hardware,
    Slo,
    TargetCost,
    TokenPrice,
    config_from_dict,
)
from soakd.measure.cost import MONTH_S, cost_line
from soakd.measure.goodput import GoodputWindow, Tally, classify, error_counts
from soakd.measure.verdicts import compare, judge
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from soakd.report import Row, build_report, render_html, render_json, render_markdown
from tests.journal_fixtures import MS, FakeClock, S, config, open_test_journal

HOUR = 3600.0
THREE_PHASES = [
    {"name": "warm", "duration": "30m", "load": {"mode": "closed", "concurrency": 2}},
    {"name": "hot", "duration": "30m", "load": {"mode": "poisson", "rate": 5}},
    {"name": "cool", "duration": "30m", "load": {"mode": "poisson", "rate": 1}},
]


def req(
    clock: FakeClock,
    target: str,
    phase: str,
    seq: int,
    end_s: float,
    *,
    ttft_ms: int = 50,
    e2e_ms: int = 300,
    tokens: int = 10,
    error: ErrorKind | None = None,
    sent: bool = True,
) -> Outcome:
    end = clock.origin_ns + int(end_s * S)
    o = Outcome(target, phase, seq, end - e2e_ms * MS)
    o.sent_ns = end - e2e_ms * MS if sent else 0
    o.wall_start = time.time()
    o.end_ns = end
    if error is None:
        o.status = 200
        o.first_token_ns = o.sent_ns + ttft_ms * MS
        o.output_tokens = tokens
        o.prompt_tokens = 20
    else:
        o.error = error
        o.status = {ErrorKind.HTTP_5XX: 503, ErrorKind.HTTP_429: 429}.get(error, 0)
    return o


def write_run(run_dir: Path, outcomes_of: Any, clock: FakeClock, **cfg: Any) -> Path:
    j = open_test_journal(run_dir, config(**cfg), clock)
    for o in outcomes_of(clock):
        j.record(o)
    j.close(completed=True)
    return run_dir


# --- goodput and verdicts on a synthetic journal ----------------------------------------------

SLO_RUN = {
    "slo": {"ttft_p99": "1s", "error_ratio": 0.15, "server_error_ratio": 0.05, "oom_events": 0},
    "targets": [
        {"name": "alpha", "base_url": "http://127.0.0.1:1", "cost": {"per_hour": 2.0}},
        {"name": "beta", "base_url": "http://127.0.0.1:2", "slo": {"ttft_p99": "100ms"}},
    ],
    "phases": THREE_PHASES,
}


def mixed(clock: FakeClock) -> list[Outcome]:
    """alpha: 40 fast in warm; in hot 30 fast, 1 over the TTFT SLO, 3 x 5xx, 2 TTFT
    timeouts, 5 x 429, 2 cut by soakd at the drain (one of them before it went out).
    beta: 40 at 150 ms TTFT. Phase cool: nothing."""
    out: list[Outcome] = []
    seq = iter(range(10_000))
    out += [req(clock, "alpha", "warm", next(seq), 10 + i) for i in range(40)]
    out += [req(clock, "alpha", "hot", next(seq), 1900 + i) for i in range(30)]
    out.append(req(clock, "alpha", "hot", next(seq), 1950, ttft_ms=2000, e2e_ms=2500))
    out += [
        req(clock, "alpha", "hot", next(seq), 2000 + i, error=ErrorKind.HTTP_5XX) for i in range(3)
    ]
    out += [
        req(clock, "alpha", "hot", next(seq), 2100 + i, error=ErrorKind.TIMEOUT_TTFT)
        for i in range(2)
    ]
    out += [
        req(clock, "alpha", "hot", next(seq), 2200 + i, error=ErrorKind.HTTP_429) for i in range(5)
    ]
    out += [
        req(clock, "alpha", "hot", next(seq), 3500 + i, error=ErrorKind.CANCELLED, sent=i == 0)
        for i in range(2)
    ]
    out += [req(clock, "beta", "warm", next(seq), 20 + i, ttft_ms=150) for i in range(40)]
    return out


@pytest.fixture(scope="module")
def slo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(
        tmp_path_factory.mktemp("slo"), mixed, FakeClock(offset_s=HOUR + 60), **SLO_RUN
    )


def test_goodput_counts_failures_timeouts_and_refusals_against(slo_run: Path) -> None:
    rep = build_report(slo_run)
    alpha = rep.overall["alpha"]
    # judged: 71 ok + 3 5xx + 2 timeouts + 5 429s; the 2 cancelled are nobody's failure;
    # one success is over the TTFT SLO
    sent, good = 71 + 3 + 2 + 5, 70
    assert alpha.goodput == pytest.approx(good / sent)
    assert alpha.goodput_rps == pytest.approx(good / alpha.active_s)
    # the error ratio: every failure, 429 refusals too; the 5xx ratio: the 5xx alone
    assert (alpha.errors, alpha.server_errors, alpha.not_judged) == (10, 3, 2)
    assert alpha.error_ratio == pytest.approx(10 / sent)
    assert alpha.server_error_ratio == pytest.approx(3 / sent)
    assert alpha.rps == pytest.approx(71 / alpha.active_s)  # throughput: successes only
    assert rep.by_phase["warm"]["alpha"].goodput == 1.0
    assert rep.by_phase["hot"]["alpha"].goodput == pytest.approx(30 / (31 + 3 + 2 + 5))
    # beta's own (tighter) TTFT SLO: every request succeeded, none within it
    assert rep.overall["beta"].success_rate == 1.0
    assert rep.overall["beta"].goodput == 0.0


def test_verdicts_per_target_and_criterion(slo_run: Path) -> None:
    rep = build_report(slo_run)
    alpha, beta = rep.verdicts["alpha"], rep.verdicts["beta"]
    assert alpha.passed is True
    assert {c.name: c.passed for c in alpha.criteria} == {
        "ttft_p99": True,
        "error_ratio": True,
        "server_error_ratio": True,
        "oom_events": True,
    }
    assert beta.passed is False
    [failed] = beta.failed
    assert failed.name == "ttft_p99"
    assert failed.limit == pytest.approx(0.1)
    assert failed.measured == pytest.approx(0.150, rel=0.02)  # digests: within ~1 %
    assert rep.passed is False
    doc = json.loads(render_json(rep))
    crit = {c["name"]: c for c in doc["verdicts"]["beta"]["criteria"]}
    assert crit["ttft_p99"]["passed"] is False
    assert crit["ttft_p99"]["measured"] == pytest.approx(0.150, rel=0.02)
    assert doc["passed"] is False
    md = render_markdown(rep)
    assert "## Verdict: FAIL" in md
    assert "| beta | ttft_p99 | 150 ms | 100 ms | FAIL |" in md.replace("151 ms", "150 ms")
    assert "Verdict: FAIL" in render_html(rep)


def test_an_empty_phase_gets_no_verdict(slo_run: Path) -> None:
    rep = build_report(slo_run)
    assert "cool" in rep.phases
    for target in ("alpha", "beta"):
        v = rep.phase_verdicts["cool"][target]
        assert v.sent == 0
        assert v.goodput is None
        assert v.passed is None  # nothing to judge, so no pass and no fail
        assert rep.by_phase["cool"][target].goodput is None
    assert rep.phase_verdicts["warm"]["alpha"].passed is True
    assert rep.phase_verdicts["warm"]["beta"].passed is False
    assert "### Verdicts in phase cool" in render_markdown(rep)


def test_check_exit_codes(
    slo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(slo_run), "--check"]) == 1
    out = capsys.readouterr().out
    assert "beta: FAIL" in out
    assert "ttft_p99 150 ms (limit 100 ms)" in out.replace("151 ms", "150 ms")
    assert "alpha: PASS" in out

    def only_fast(clock: FakeClock) -> list[Outcome]:
        return [req(clock, t, "warm", i, 10 + i) for t in ("alpha", "beta") for i in range(30)]

    passing = write_run(tmp_path / "pass", only_fast, FakeClock(offset_s=HOUR + 1), **SLO_RUN)
    assert main(["report", str(passing), "--check"]) == 0
    assert "Verdict: PASS" in capsys.readouterr().out
    unjudged = write_run(tmp_path / "none", only_fast, FakeClock(offset_s=HOUR + 1))
    with pytest.raises(SystemExit) as exc:
        main(["report", str(unjudged), "--check"])
    assert exc.value.code == 2
    assert "nothing to check" in capsys.readouterr().err


# --- dead runs: no verdict can pass them ------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "slo"),
    [
        (ErrorKind.HTTP_AUTH, {"error_ratio": 0.003}),  # a wrong key: 401 on every request
        (ErrorKind.HTTP_4XX, {"server_error_ratio": 0.003}),  # a wrong model name: 404s
        (ErrorKind.CONNECT_REFUSED, {"oom_events": 0}),  # nothing listening
        (ErrorKind.CONNECT_REFUSED, None),  # and no slo block at all
    ],
)
def test_a_run_with_no_success_fails_every_verdict(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    failure: ErrorKind,
    slo: dict[str, Any] | None,
) -> None:
    def dead(clock: FakeClock) -> list[Outcome]:
        return [req(clock, "alpha", "warm", i, 10 + i, error=failure) for i in range(40)]

    cfg = {"slo": slo} if slo else {}
    run = write_run(tmp_path, dead, FakeClock(offset_s=HOUR + 1), **cfg)
    rep = build_report(run)
    alpha = rep.overall["alpha"]
    assert (alpha.requests, alpha.ok, alpha.errors) == (40, 0, 40)
    assert alpha.error_ratio == 1.0
    assert alpha.server_error_ratio == 0.0
    assert alpha.rps == 0.0  # throughput counts successes
    assert alpha.attempt_rps == pytest.approx(40 / alpha.active_s)
    verdict = rep.verdicts["alpha"]
    assert verdict.passed is False
    assert verdict.criteria[0].name == "successes"
    assert rep.phase_verdicts["warm"]["alpha"].passed is False
    assert rep.passed is False
    if slo and "error_ratio" in slo:
        assert {c.name: c.passed for c in verdict.criteria}["error_ratio"] is False
    assert main(["report", str(run), "--check"]) == 1
    out = capsys.readouterr().out
    assert "alpha: FAIL" in out
    assert "successes 0 (limit at least 1, no request succeeded)" in out
    md = render_markdown(rep)
    assert "| alpha | successes | 0 | at least 1 | FAIL |" in md
    assert "| throughput (ok req/s) | 0 |" in md


def test_no_table_shows_errors_beside_an_error_ratio_of_zero(tmp_path: Path) -> None:
    """The guard's sheds and soakd's own cuts are not errors: counted apart, in no ratio."""

    def shed(clock: FakeClock) -> list[Outcome]:
        out = [req(clock, "alpha", "warm", i, 10 + i) for i in range(30)]
        out += [
            req(clock, "alpha", "warm", 100 + i, 50 + i, error=ErrorKind.SHED_VRAM_BREAKER)
            for i in range(6)
        ]
        out += [req(clock, "alpha", "warm", 200 + i, 90, error=ErrorKind.CANCELLED) for i in (0, 1)]
        return out

    rep = build_report(write_run(tmp_path, shed, FakeClock(offset_s=HOUR + 1)))
    alpha = rep.overall["alpha"]
    assert (alpha.requests, alpha.ok, alpha.errors, alpha.shed, alpha.not_judged) == (
        38,
        30,
        0,
        6,
        2,
    )
    assert alpha.error_ratio == 0.0
    md = render_markdown(rep)
    assert "| errors | 0 |" in md
    assert "| error ratio | 0 % |" in md
    assert "| shed by the guard | 6 |" in md
    assert "| cut by soakd (not judged) | 2 |" in md
    assert rep.passed is None  # no slo, and it answered: nothing to judge


# --- honest comparisons -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure", [ErrorKind.HTTP_5XX, ErrorKind.HTTP_429, ErrorKind.SHED_QUEUE_FULL]
)
def test_a_target_with_25_percent_success_is_never_best_on_latency(
    tmp_path: Path, failure: ErrorKind
) -> None:
    """alpha answers 25 % of its requests, fast; beta all of them, slower. A 429 of the
    server fails too; the guard's own shedding is not in the error ratio: alpha passes
    the error criterion then, and is still not best on latency."""

    def shed(clock: FakeClock) -> list[Outcome]:
        out = []
        for i in range(200):
            error = None if i % 4 == 0 else failure
            out.append(req(clock, "alpha", "warm", i, 10 + i, ttft_ms=10, e2e_ms=50, error=error))
            out.append(req(clock, "beta", "warm", i, 10 + i, ttft_ms=200, e2e_ms=900))
        return out

    run = write_run(tmp_path, shed, FakeClock(offset_s=HOUR + 1), slo={"error_ratio": 0.01})
    rep = build_report(run)
    assert rep.overall["alpha"].success_rate == 0.25
    assert rep.verdicts["alpha"].criteria[0].passed is (failure is ErrorKind.SHED_QUEUE_FULL)
    latency_rows = [k for k in rep.best if "." in k or k == "jitter"]
    assert all("alpha" not in rep.best[k] for k in latency_rows), rep.best
    assert "alpha" not in rep.best.get("rps", [])
    assert rep.best["goodput"] == ["beta"]
    md = render_markdown(rep)
    ttft_line = next(line for line in md.splitlines() if line.startswith("| TTFT p50 |"))
    assert "✓" not in ttft_line  # no contest left: nobody is marked


# --- compare ----------------------------------------------------------------------------------


def row(name: str, ttft_ms: float, tps: float, errors: int = 0) -> Row:
    r = Row(name, None, active_s=100.0, requests=1000, ok=1000 - errors, success_rate=1.0)
    r.errors, r.error_ratio = errors, errors / 1000
    r.latency_ms = {"ttft": {"p50": ttft_ms / 2, "p99": ttft_ms}, "e2e": {"p99": 1000.0}}
    r.output_tps = tps
    return r


def test_compare_candidate_against_baseline() -> None:
    rows = {"base": row("base", 100.0, 50.0), "cand": row("cand", 108.0, 46.0, errors=2)}
    tallies = {
        "base": Tally(sent=1000, ok=1000, good=1000),
        "cand": Tally(sent=1000, ok=998, good=990, errors=2),
    }
    verdicts = {t: judge(t, None, Slo(), rows[t], tallies[t]) for t in rows}
    spec = Compare.model_validate(
        {
            "baseline": "base",
            "candidate": "cand",
            "max_regression": {"ttft_p99": "10%", "output_tps": "5%", "error_ratio": 0.001},
        }
    )
    result = compare(spec, rows, verdicts)
    by_key = {d.key: d for d in result.deltas}
    assert by_key["ttft_p99"].relative == pytest.approx(0.08)
    assert by_key["ttft_p99"].passed is True
    assert by_key["output_tps"].regression == pytest.approx(0.08)  # 4 tok/s fewer of 50
    assert by_key["output_tps"].passed is False
    assert by_key["error_ratio"].delta == pytest.approx(0.002)
    assert by_key["error_ratio"].passed is False
    assert result.passed is False
    spec = spec.model_copy(update={"max_regression": {"ttft_p99": ("relative", 0.1)}})
    assert compare(spec, rows, verdicts).passed is True


def test_compare_in_the_report_and_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def two(clock: FakeClock) -> list[Outcome]:
        return [
            req(clock, t, "warm", i, 10 + i, ttft_ms=ms)
            for t, ms in (("alpha", 100), ("beta", 130))
            for i in range(50)
        ]

    run = write_run(
        tmp_path,
        two,
        FakeClock(offset_s=HOUR + 1),
        compare={"baseline": "alpha", "candidate": "beta", "max_regression": {"ttft_p99": "10%"}},
    )
    doc = json.loads(render_json(build_report(run)))
    [delta] = doc["comparison"]["deltas"]
    assert delta["key"] == "ttft_p99"
    assert delta["relative"] == pytest.approx(0.30, abs=0.03)
    assert delta["passed"] is False
    assert doc["passed"] is False
    assert main(["report", str(run), "--check"]) == 1
    out = capsys.readouterr().out
    # a regression as a change against the allowed one, both in percent
    assert re.search(
        r"compare beta against alpha: FAIL: ttft_p99 \+3\d\.\d % \(allowed \+10 %\)", out
    )
    md = render_markdown(build_report(run))
    assert re.search(r"\| ttft_p99 \| 1\d\d ms \| 1\d\d ms \| \+3\d\.\d % \| \+10 % \| FAIL \|", md)


# --- cost -------------------------------------------------------------------------------------


def test_cost_lines() -> None:
    local = cost_line(TargetCost(hardware=Hardware(price=1200, months=36)), HOUR, 0, 1_000_000)
    assert local.per_month == pytest.approx(1200 / 36)
    assert local.per_mtok == pytest.approx(1200 / 36 / (MONTH_S / HOUR))
    cloud = cost_line(
        TargetCost(per_mtok=TokenPrice(input=0.15, output=0.60)), HOUR, 2_000_000, 1_000_000
    )
    assert cloud.total == pytest.approx(0.3 + 0.6)
    assert cloud.per_mtok == pytest.approx(0.9)
    assert cloud.per_month == pytest.approx(0.9 * MONTH_S / HOUR)
    assert cost_line(TargetCost(), HOUR, 1, 1).basis is None


def test_cost_per_month_in_the_report(slo_run: Path) -> None:
    rep = build_report(slo_run)
    alpha = rep.overall["alpha"]  # cost: {per_hour: 2.0}
    assert alpha.cost_per_month == pytest.approx(2.0 * MONTH_S / HOUR)
    assert alpha.cost_per_mtok == pytest.approx(alpha.cost / alpha.output_tokens * 1e6)
    md = render_markdown(rep)
    assert "## Cost at the measured load" in md
    assert "| alpha | 2/h |" in md


# --- config, gauges, the live window ----------------------------------------------------------

BASE: dict[str, Any] = {
    "targets": [
        {"name": "a", "base_url": "http://127.0.0.1:1"},
        {"name": "b", "base_url": "http://127.0.0.1:2", "slo": {"ttft_p99": "3s"}},
    ],
    "phases": [{"name": "p", "duration": "1m"}],
}


def test_slo_config_and_overrides() -> None:
    cfg = config_from_dict(
        BASE
        | {
            "slo": {
                "ttft_p99": "2s",
                "tpot_p99": "100ms",
                "vram_peak": "3.9GB",
                "error_ratio": 0.003,
            }
        }
    )
    assert cfg.slo_for("a").ttft_p99 == 2.0
    assert cfg.slo_for("b").ttft_p99 == 3.0
    assert cfg.slo_for("b").tpot_p99 == 0.1
    assert cfg.slo_for("b").vram_peak == 3.9e9
    assert config_from_dict(BASE).slo_for("a").empty


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            {"exporter": {"thresholds": {"vram_limit_bytes": 3.9e9}}},
            "exporter.thresholds: moved: the SLO limits are now the top-level slo block",
        ),
        ({"slo": {"ttft_p99": "0s"}}, "slo.ttft_p99:"),
        ({"slo": {"p99_ttft": "2s"}}, "slo.p99_ttft: unknown key"),
        (
            {"compare": {"baseline": "a", "candidate": "zz"}},
            "compare.candidate: unknown target 'zz'",
        ),
        (
            {"compare": {"baseline": "a", "candidate": "b", "max_regression": {"ttft": "5%"}}},
            "compare.max_regression: unknown key(s) ttft",
        ),
    ],
)
def test_slo_config_errors_are_one_line(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_dict(BASE | extra)
    assert says in str(exc.value)
    assert "\n" not in str(exc.value)


def test_limit_gauges_carry_the_run_wide_slo() -> None:
    m = Metrics(CollectorRegistry())
    get = m.registry.get_sample_value
    m.set_limits(Slo(), AlertLimits())
    assert get("soakd_slo_ttft_p99_seconds") is None  # not set: no limit, no alert
    assert get("soakd_vram_leak_limit_bytes_per_hour") == 50e6
    m.set_limits(
        Slo(ttft_p99=2, e2e_p99=30, error_ratio=0.003, vram_peak=3.9e9, jitter=0.15),
        AlertLimits(dispatch_lag=0.2),
    )
    assert get("soakd_slo_ttft_p99_seconds") == 2
    assert get("soakd_slo_e2e_p99_seconds") == 30
    assert get("soakd_error_ratio_limit") == 0.003
    assert get("soakd_vram_limit_bytes") == 3.9e9
    assert get("soakd_jitter_ratio_limit") == 0.15
    assert get("soakd_dispatch_lag_limit_seconds") == 0.2


def outcome_at(ttft_ms: int | None, error: ErrorKind | None = None) -> Outcome:
    o = Outcome(
        "a",
        "p",
        0,
        scheduled_ns=1_000 * MS,
        sent_ns=1_000 * MS,
        end_ns=1_500 * MS,
        status=200 if error is None else 503,
        error=error,
        output_tokens=5,
    )
    if ttft_ms is not None:
        o.first_token_ns = o.sent_ns + ttft_ms * MS
    return o


def test_live_goodput_window_and_gauges() -> None:
    window = GoodputWindow({"a": Slo(ttft_p99=0.1)})
    for o in (
        outcome_at(50),
        outcome_at(50),
        outcome_at(300),
        outcome_at(None, ErrorKind.HTTP_5XX),
        outcome_at(None, ErrorKind.CANCELLED),
    ):
        window.record(o)
    assert window.total["a"].goodput == pytest.approx(2 / 4)
    row = window.row("a")
    assert row["goodput"] == pytest.approx(2 / 4)
    m = Metrics(CollectorRegistry())
    m.add_target("a", ["p"])
    m.show({}, {"a": (row["goodput"], row["goodput_rps"])})
    assert m.registry.get_sample_value("soakd_goodput_ratio", {"target": "a"}) == 0.5
    assert m.registry.get_sample_value("soakd_goodput_rps", {"target": "a"}) > 0


def test_the_guard_refusal_predicate_is_the_one_switch() -> None:
    """A gateway answer is the guard's refusal by its ``shed_*`` kind (or, once outcomes
    carry one, its origin): out of the error ratios, still against goodput. Every other
    failure, a 401 or a 429 of the server included, is in the error ratio."""
    assert classify("http_5xx") == "error"
    assert classify("http_5xx", origin="gateway") == "guard"
    assert classify("shed_queue_full") == "guard"
    assert classify("http_429") == "error"
    assert classify("http_auth") == "error"
    assert classify("cancelled") == "excluded"
    assert classify("worker_lost") == "excluded"
    tally = Tally()
    tally.add("ok", True, 6)
    tally.add("guard", False, 3)
    tally.add("error", False, 1)
    assert tally.goodput == pytest.approx(6 / 10)
    counted = error_counts(
        12, {"shed_queue_full": 3, "http_5xx": 1, "http_auth": 1, "cancelled": 1}
    )
    assert (counted.judged, counted.failed, counted.server) == (8, 2, 1)
    assert counted.error_ratio == pytest.approx(2 / 8)  # the guard's and soakd's own apart
    assert counted.server_error_ratio == pytest.approx(1 / 8)


def test_judge_a_finished_run_by_another_config(
    slo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config``: the same journal, judged by a looser slo (targets matched by name)."""
    loose = json.loads(json.dumps(SLO_RUN))
    loose["targets"][1]["slo"] = {"ttft_p99": "500ms"}
    path = tmp_path / "loose.yaml"
    path.write_text(yaml.safe_dump(loose))
    assert main(["report", str(slo_run), "--check", "--config", str(path)]) == 0
    assert "beta: PASS" in capsys.readouterr().out
    assert main(["report", str(slo_run), "--check"]) == 1  # the run's own slo is unchanged


def test_judge_by_a_file_of_just_the_deciding_sections(
    slo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config`` reads a file holding only slo, compare, report and targets matched by
    name (no base_url, no phases): a release's SLO file."""
    path = tmp_path / "release-slo.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "slo": {"ttft_p99": "1s", "error_ratio": 0.5},
                "targets": [
                    {"name": "beta", "slo": {"ttft_p99": "500ms"}, "cost": {"per_hour": 3}}
                ],
                "report": {"currency": "EUR "},
            }
        )
    )
    assert main(["report", str(slo_run), "--check", "--config", str(path)]) == 0
    assert "beta: PASS" in capsys.readouterr().out
    assert main(["report", str(slo_run), "--config", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["currency"] == "EUR "
    assert doc["overall"]["beta"]["cost_basis"] == "3/h"
    assert doc["overall"]["alpha"]["cost_basis"] is None  # alpha is not in the file: no cost
    # the same sections are checked as strictly as in a whole config, one line each
    path.write_text(yaml.safe_dump({"slo": {"ttft_p9": "1s"}, "target": []}))
    with pytest.raises(SystemExit) as exc:
        main(["report", str(slo_run), "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: target: unknown key (did you mean 'targets'?)" in err
    assert f"{path}: slo.ttft_p9: unknown key (did you mean 'ttft_p99'?)" in err


def test_check_prints_each_targets_effective_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(BASE | {"slo": {"ttft_p99": "2s", "error_ratio": 0.003}}))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "slo a: ttft_p99 2s, error_ratio 0.3 %" in out
    assert "slo b: ttft_p99 3s, error_ratio 0.3 %" in out
