"""Histogram restore without prometheus_client's private fields: the journal's bucket
counts (soakd/buckets.py) plus live observations equal a registry that counted it all."""

from __future__ import annotations

import random

from prometheus_client import Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.buckets import BucketChild, observe
from soakd.journal.codec import outcome_row
from soakd.journal.rollups import Deltas
from soakd.metrics import HISTOGRAM_BUCKETS, Metrics
from soakd.model import ErrorKind, Outcome
from tests.journal_fixtures import FakeClock, outcome

KINDS = [None] * 8 + [ErrorKind.HTTP_5XX, ErrorKind.TIMEOUT_CONNECT]
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def outcomes(n: int, seed: int) -> list[Outcome]:
    rng, clock = random.Random(seed), FakeClock(offset_s=30)
    return [
        outcome(
            rng, clock, ("alpha", "beta")[i % 2], "warm", i, 1 + i * 0.01, error=rng.choice(KINDS)
        )
        for i in range(n)
    ]


def metrics() -> Metrics:
    m = Metrics()
    for t in ("alpha", "beta"):
        m.add_target(t, ["warm"])
    return m


def scraped(m: Metrics) -> Scrape:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("soakd_") and not s.name.endswith("_created")
    }


def journaled(batch: list[Outcome]) -> Deltas:
    """What the journal's writer counts for these outcomes (totals and buckets)."""
    deltas = Deltas()
    for i, o in enumerate(batch, 1):
        row, ordered = outcome_row(o, i, 1, 0, itl="none")
        deltas.add(o, row, ordered, 1_000_000_000)
    return deltas


def test_restored_then_live_equals_counted_live_all_along() -> None:
    before, after = outcomes(300, seed=1), outcomes(200, seed=2)
    live = metrics()
    for o in before + after:
        live.record(o)
    deltas = journaled(before)
    resumed = metrics()
    totals = [(*k, *v) for k, v in deltas.totals.items()]
    assert resumed.restore(totals, deltas.hists) == []  # type: ignore[arg-type]
    for o in after:
        resumed.record(o)
    want, got = scraped(live), scraped(resumed)
    assert want.keys() == got.keys()
    for key, value in want.items():
        if key[0].endswith("_sum"):  # float sums, added in another order
            assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
        else:  # buckets, counts, counters: whole numbers, exact
            assert got[key] == value, key


def test_buckets_that_do_not_fit_are_reported_and_left_live() -> None:
    m = metrics()
    bounds = HISTOGRAM_BUCKETS["e2e"]
    missing = m.restore(
        [],
        {
            ("e2e", "alpha"): ([1] * len(bounds), 3.0),  # one short
            ("ttft", "nobody"): ([0] * (len(bounds) + 1), 0.0),
        },
    )
    assert sorted(missing) == ["e2e:alpha", "ttft:nobody"]
    get = m.registry.get_sample_value
    assert get("soakd_request_duration_seconds_count", {"target": "alpha"}) == 0
    assert isinstance(m.e2e, Histogram)


def test_a_value_on_a_bound_counts_in_that_bucket_as_prometheus_does() -> None:
    bounds = (0.1, 0.5, 1.0)
    hists: dict[tuple[str, str], tuple[list[int], float]] = {}
    observe(hists, ("k", "t"), bounds, [0.1])
    observe(hists, ("k", "t"), bounds, [0.05, 0.5, 0.7, 1.0, 2.0])
    assert hists[("k", "t")] == ([2, 1, 2, 1], 0.1 + (0.05 + 0.5 + 0.7 + 1.0 + 2.0))


def test_bucket_histogram_exposes_what_a_prometheus_histogram_would() -> None:
    """The per-token ITL histogram is counted outside prometheus_client (no lock, one
    bisect a value); a scrape must read exactly what client_python's Histogram writes."""
    from prometheus_client import CollectorRegistry

    from soakd.buckets import BucketHistogram
    from soakd.metrics import ITL_BUCKETS

    rng = random.Random(7)
    gaps_ns = [rng.randrange(0, 3_000_000_000) for _ in range(5000)]
    gaps_ns += [round(b * 1e9) for b in ITL_BUCKETS]  # on the bounds, and past the last
    gaps_ns += [0, 10_000_000_000]
    ref_reg, our_reg = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("x_seconds", "doc", ["target"], buckets=ITL_BUCKETS, registry=ref_reg)
    ours = BucketHistogram("x_seconds", "doc", ["target"], ITL_BUCKETS, registry=our_reg)
    for target, share in (("a", gaps_ns[::2]), ("b", gaps_ns[1::2])):
        for g in share:
            ref.labels(target).observe(g * 1e-9)
        ours.labels(target).observe_ns(share[:-3])
        for g in share[-3:]:
            ours.labels(target).observe(g * 1e-9)
    ours.labels("idle")
    ref.labels("idle")

    def lines(reg: CollectorRegistry) -> list[str]:
        text = generate_latest(reg).decode()
        return [ln for ln in text.splitlines() if "_created" not in ln and "_sum" not in ln]

    assert lines(our_reg) == lines(ref_reg)
    get_ref, get_ours = ref_reg.get_sample_value, our_reg.get_sample_value
    for target in ("a", "b", "idle"):
        want = get_ref("x_seconds_sum", {"target": target})
        assert want is not None
        assert abs((get_ours("x_seconds_sum", {"target": target}) or 0) - want) <= 1e-6


def test_long_answers_count_the_same_sorted_as_gap_by_gap() -> None:
    """A 512-token answer's gaps are counted sorted (one bisect a bucket): the same counts
    as one at a time, bounds hit exactly included."""
    bounds = tuple(HISTOGRAM_BUCKETS["itl"])
    rng = random.Random(7)
    on_bounds = [round(b * 1e9) for b in bounds]
    for n in (3, 2 * len(bounds) + 1, 512, 4000):
        gaps = [
            rng.choice(on_bounds) if rng.random() < 0.2 else int(rng.lognormvariate(15, 2))
            for _ in range(n)
        ]
        long_path, one_by_one = BucketChild(bounds), BucketChild(bounds)
        long_path.observe_ns(gaps)
        for g in gaps:
            one_by_one.observe_ns([g])
        assert long_path.counts == one_by_one.counts
        assert abs(long_path.total - one_by_one.total) < 1e-9 * max(1.0, one_by_one.total)
