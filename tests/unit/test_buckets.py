"""soakd's own latency histograms (soakd/measure/buckets.py) fed by the journal's folds
(soakd/measure/fold.py): the same exposition as client_python's, a resumed run's stored counts plus
live folds equal a registry that counted it all, and a batch folded at once equals its
outcomes folded one by one."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.measure.buckets import BucketHistogram
from soakd.measure.fold import HISTOGRAM_BUCKETS, ITL_BUCKETS, Buckets, Fold, fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from tests.journal_fixtures import FakeClock, outcome
from tests.scraping import NOT_CONTINUED, continued

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


def test_restored_then_live_equals_counted_live_all_along() -> None:
    before, after = outcomes(300, seed=1), outcomes(200, seed=2)
    live = metrics()
    live.apply(fold(before))
    live.apply(fold(after))
    stored = fold(before)  # what the journal keeps: totals and bucket counts
    resumed = metrics()
    totals = [(*k, *v) for k, v in stored.totals.items()]
    assert resumed.restore(totals, stored.hist_counts()) == []  # type: ignore[arg-type]
    resumed.apply(fold(after))
    want, got = continued(scraped(live)), continued(scraped(resumed))
    assert want.keys() == got.keys()
    for key, value in want.items():
        if key[0].endswith("_sum"):  # float sums, added in another order
            assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
        else:  # buckets, counts, counters: whole numbers, exact
            assert got[key] == value, key


def test_the_breakdowns_start_again_at_zero_after_a_resume() -> None:
    before, after = outcomes(300, seed=1), outcomes(200, seed=2)
    stored = fold(before)
    resumed, fresh = metrics(), metrics()
    totals = [(*k, *v) for k, v in stored.totals.items()]
    assert resumed.restore(totals, stored.hist_counts()) == []  # type: ignore[arg-type]
    resumed.apply(fold(after))
    fresh.apply(fold(after))
    got = {k: v for k, v in scraped(resumed).items() if k[0].startswith(NOT_CONTINUED)}
    want = {k: v for k, v in scraped(fresh).items() if k[0].startswith(NOT_CONTINUED)}
    assert got == want
    assert got  # the outcomes have prompt tokens: some context buckets were counted


def test_a_batch_folded_at_once_equals_its_outcomes_one_by_one() -> None:
    """The writer folds a batch into one Fold, and while the disk fails merges batches:
    Metrics must end the same as if every outcome had been applied on its own."""
    batch = outcomes(400, seed=3)
    whole, one_by_one, merged = metrics(), metrics(), Fold()
    whole.apply(fold(batch))
    for i in range(0, len(batch), 7):
        part = fold(batch[i : i + 7])
        merged.merge(part)
        for o in batch[i : i + 7]:
            one_by_one.apply(fold([o]))
    merged_m = metrics()
    merged_m.apply(merged)
    want = scraped(one_by_one)
    for got in (scraped(whole), scraped(merged_m)):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    assert merged.requests == len(batch)
    stats = merged.by_phase()
    assert sum(s.requests for s in stats.values()) == len(batch)
    assert sum(s.e2e.count for s in stats.values()) == sum(1 for o in batch if o.ok)


def test_a_tallied_outcome_counts_but_stays_out_of_the_histograms() -> None:
    """A request whose row the journal's queue could not take is counted (requests, tokens,
    the run's counts), never observed: the journal's histograms never had it either."""
    o = outcomes(1, seed=4)[0]
    o.error = None
    f = Fold()
    f.tally(o)
    m = metrics()
    m.apply(f)
    get = m.registry.get_sample_value
    labels = {"target": o.target, "phase": "warm", "outcome": "ok", "status_class": "2xx"}
    assert get("soakd_requests_total", labels) == 1
    assert get("soakd_output_tokens_total", {"target": o.target}) == o.output_tokens
    assert get("soakd_request_duration_seconds_count", {"target": o.target}) == 0
    (stats,) = f.by_phase().values()
    assert (stats.requests, stats.ok, stats.e2e.count) == (1, 1, 0)


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


def test_a_value_on_a_bound_counts_in_that_bucket_as_prometheus_does() -> None:
    b = Buckets((0.1, 0.5, 1.0))
    b.add(0.1)
    b.add_sorted([0.05, 0.5, 0.7, 1.0, 2.0])
    assert b.hist() == ([2, 1, 2, 1], 0.1 + (0.05 + 0.5 + 0.7 + 1.0 + 2.0))


def test_bucket_histogram_exposes_what_a_prometheus_histogram_would() -> None:
    """The latency histograms are counted outside prometheus_client (bulk adds, no lock);
    a scrape must read exactly what client_python's Histogram writes."""
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
        counted = Buckets(ITL_BUCKETS)
        counted.add_sorted(sorted(g * 1e-9 for g in share[:-3]))
        for g in share[-3:]:
            counted.add(g * 1e-9)
        ours.labels(target).add(counted.counts, counted.total)
    for g in gaps_ns[::3]:  # one at a time, as a reading outside the journal's batches
        ref.labels("c").observe(g * 1e-9)
        ours.labels("c").observe(g * 1e-9)
    ours.labels("idle")
    ref.labels("idle")

    def lines(reg: CollectorRegistry) -> list[str]:
        text = generate_latest(reg).decode()
        return [ln for ln in text.splitlines() if "_created" not in ln and "_sum" not in ln]

    assert lines(our_reg) == lines(ref_reg)
    get_ref, get_ours = ref_reg.get_sample_value, our_reg.get_sample_value
    for target in ("a", "b", "c", "idle"):
        want = get_ref("x_seconds_sum", {"target": target})
        assert want is not None
        assert abs((get_ours("x_seconds_sum", {"target": target}) or 0) - want) <= 1e-6


def test_long_answers_count_the_same_sorted_as_gap_by_gap() -> None:
    """A 512-token answer's gaps are counted sorted (one bisect a bucket): the same counts
    as one at a time, bounds hit exactly included."""
    bounds = tuple(HISTOGRAM_BUCKETS["itl"])
    rng = random.Random(7)
    on_bounds = [b for b in bounds]
    for n in (3, 2 * len(bounds) + 1, 512, 4000):
        gaps = [
            rng.choice(on_bounds) if rng.random() < 0.2 else rng.lognormvariate(15, 2) * 1e-9
            for _ in range(n)
        ]
        long_path, one_by_one = Buckets(bounds), Buckets(bounds)
        long_path.add_sorted(sorted(gaps))
        for g in gaps:
            one_by_one.add(g)
        assert long_path.counts == one_by_one.counts
        assert abs(long_path.total - one_by_one.total) < 1e-9 * max(1.0, one_by_one.total)
