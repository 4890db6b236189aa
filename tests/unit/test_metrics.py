"""The metric contract: names documented, series pre-created, outcomes counted exactly once."""

from __future__ import annotations

import math
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from soakd.journal.metrics import JournalMetrics
from soakd.measure.fold import fold
from soakd.metrics.run import Metrics, ProbeMetrics
from soakd.model import ErrorKind, Outcome

DOCS = Path(__file__).parents[2] / "docs" / "metrics.md"


def full_registry() -> Metrics:
    metrics = Metrics(CollectorRegistry())
    ProbeMetrics(metrics.registry)
    JournalMetrics(metrics.registry)
    return metrics


def test_every_exported_family_is_documented() -> None:
    doc = DOCS.read_text()
    documented = set(re.findall(r"`(soakd_[a-z0-9_]+)`", doc))
    families = {f.name for f in full_registry().registry.collect()}
    assert families, "registry is empty"
    missing = set()
    for name in families:
        wire = {name, name + "_total", name + "_info"}
        if not wire & documented:
            missing.add(name)
    assert not missing, f"docs/metrics.md does not list: {sorted(missing)}"


def outcome(**kw: object) -> Outcome:
    o = Outcome(
        "a",
        "steady",
        0,
        scheduled_ns=1_000_000,
        sent_ns=3_000_000,
        first_token_ns=53_000_000,
        end_ns=253_000_000,
        status=200,
        output_tokens=5,
    )
    for key, value in kw.items():
        setattr(o, key, value)
    return o


def test_record_counts_and_observes() -> None:
    m = full_registry()
    m.add_target("a", ["steady"])
    get = m.registry.get_sample_value
    # pre-created: rates start at zero instead of being absent
    assert (
        get(
            "soakd_requests_total",
            {"target": "a", "phase": "steady", "outcome": "ok", "status_class": "2xx"},
        )
        == 0
    )
    ok = outcome()
    ok.itl_ns.extend([50_000_000] * 4)
    m.apply(fold([ok]))
    m.apply(fold([outcome(error=ErrorKind.HTTP_5XX, status=503, output_tokens=0, oom=True)]))
    assert (
        get(
            "soakd_requests_total",
            {"target": "a", "phase": "steady", "outcome": "ok", "status_class": "2xx"},
        )
        == 1
    )
    assert (
        get(
            "soakd_requests_total",
            {"target": "a", "phase": "steady", "outcome": "http_5xx", "status_class": "5xx"},
        )
        == 1
    )
    # latency histograms hold successful requests only
    assert get("soakd_request_duration_seconds_count", {"target": "a"}) == 1
    assert get("soakd_request_duration_seconds_sum", {"target": "a"}) == 0.25
    assert get("soakd_time_to_first_token_seconds_sum", {"target": "a"}) == 0.05
    assert get("soakd_inter_token_latency_seconds_count", {"target": "a"}) == 4
    assert get("soakd_time_per_output_token_seconds_sum", {"target": "a"}) == 0.05
    # dispatch lag for every sent request
    assert get("soakd_dispatch_lag_seconds_count", {"target": "a"}) == 2
    assert get("soakd_output_tokens_total", {"target": "a"}) == 5
    assert get("soakd_oom_errors_total", {"target": "a"}) == 1


def test_in_flight_and_goodput_are_what_the_run_loop_published() -> None:
    """Set by the run loop when it publishes (soakd/run/app.py), never read from the
    runner at scrape time: a scrape sees the last published values."""
    m = full_registry()
    m.add_target("a", ["p"])
    get = m.registry.get_sample_value
    assert get("soakd_in_flight_requests", {"target": "a"}) == 0
    busy = {"a": 7}
    m.show(busy, {"a": (0.5, 2.0)})
    busy["a"] = 3  # the runner's tally moves on: the gauge is what was published
    assert get("soakd_in_flight_requests", {"target": "a"}) == 7
    assert get("soakd_goodput_ratio", {"target": "a"}) == 0.5
    assert get("soakd_goodput_rps", {"target": "a"}) == 2.0
    m.show({}, {"a": (None, 0.0)})  # nothing in flight, none sent in the window
    assert get("soakd_in_flight_requests", {"target": "a"}) == 0
    assert math.isnan(get("soakd_goodput_ratio", {"target": "a"}) or 0.0)


def test_run_ratios_count_the_whole_run_on_the_reports_basis_across_a_resume() -> None:
    """soakd_run_error_ratio (every failure) and soakd_run_5xx_ratio (5xx alone) over the
    judged requests: the guard's sheds and soakd's own cuts are in neither (goodput.py)."""
    m = full_registry()
    m.add_target("a", ["steady"])
    get = m.registry.get_sample_value
    assert get("soakd_run_5xx_ratio", {"target": "a"}) == 0  # present at 0 before a request
    assert get("soakd_run_error_ratio", {"target": "a"}) == 0
    for _ in range(3):
        m.apply(fold([outcome()]))
    m.apply(fold([outcome(error=ErrorKind.HTTP_5XX, status=500, output_tokens=0)]))
    m.apply(fold([outcome(error=ErrorKind.TIMEOUT_TTFT, status=0, output_tokens=0)]))  # not a 5xx
    m.apply(fold([outcome(error=ErrorKind.HTTP_AUTH, status=401, output_tokens=0)]))  # a failure
    m.apply(fold([outcome(error=ErrorKind.SHED_QUEUE_TIMEOUT, status=503, output_tokens=0)]))
    m.apply(fold([outcome(error=ErrorKind.CANCELLED, status=0, output_tokens=0)]))
    assert get("soakd_run_5xx_ratio", {"target": "a"}) == 1 / 6
    assert get("soakd_run_error_ratio", {"target": "a"}) == 3 / 6
    # a resumed run starts from the journal's totals: 995 ok and 5 5xx before the crash
    resumed = full_registry()
    resumed.add_target("a", ["steady"])
    resumed.restore(
        [
            ("a", "steady", "ok", "2xx", 995, 0, 0, 0),
            ("a", "steady", "http_5xx", "5xx", 5, 0, 0, 0),
            ("a", "steady", "shed_error_breaker", "5xx", 40, 0, 0, 0),
        ],
        {},
    )
    resumed.apply(fold([outcome(error=ErrorKind.HTTP_5XX, status=502, output_tokens=0)]))
    assert resumed.registry.get_sample_value("soakd_run_5xx_ratio", {"target": "a"}) == 6 / 1001
    assert resumed.registry.get_sample_value("soakd_run_error_ratio", {"target": "a"}) == 6 / 1001


def test_no_created_series() -> None:
    from prometheus_client import generate_latest

    m = full_registry()
    m.add_target("a", ["steady"])
    m.apply(fold([outcome()]))
    assert b"_created" not in generate_latest(m.registry)


def test_a_resume_serves_the_continued_families_only_at_the_journals_totals() -> None:
    """Until the journal's totals are restored, a resumed run's scrape has no request,
    token, latency or resume series (absent is stale to Prometheus; 0 would be a reset)."""
    held = Metrics(CollectorRegistry(), held=True)
    jm = JournalMetrics(held.registry, held.continued)
    held.add_target("a", ["steady"])
    get = held.registry.get_sample_value
    assert get("soakd_output_tokens_total", {"target": "a"}) is None
    assert get("soakd_run_resumes_total") is None
    assert get("soakd_in_flight_requests", {"target": "a"}) == 0  # the rest is served
    held.restore([("a", "steady", "ok", "2xx", 10, 160, 500, 0)], {})
    jm.resumes.inc(1)
    held.continued.release()
    assert get("soakd_output_tokens_total", {"target": "a"}) == 160
    assert (
        get(
            "soakd_requests_total",
            {"target": "a", "phase": "steady", "outcome": "ok", "status_class": "2xx"},
        )
        == 10
    )
    assert get("soakd_run_resumes_total") == 1
    fresh = Metrics(CollectorRegistry())  # a new run: 0 is the truth, served at once
    fresh.add_target("a", ["steady"])
    assert fresh.registry.get_sample_value("soakd_output_tokens_total", {"target": "a"}) == 0
