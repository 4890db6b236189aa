"""Metrics: every metric of ``soakd run``, in an injected registry.

The names are ``soakd/metric_names.py``'s constants (``soakd gateway``'s metrics are in
``soakd/gateway/metrics.py``); docs/metrics.md lists them; the dashboards and alert rules
use exactly these names (``tests/unit/test_metric_names.py``).
Labels are bounded: target and phase names come from config, outcome from ErrorKind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from soakd import __version__
from soakd import metric_names as mn
from soakd.buckets import BucketChild, BucketHistogram, ExemplarClock
from soakd.config import AlertLimits, Slo, TargetConfig
from soakd.goodput import SERVER_ERRORS, classify

# the probes' and the guard's families live beside this module; imported from here as before
from soakd.guard_metrics import PAUSE_REASONS as PAUSE_REASONS
from soakd.guard_metrics import SPEND_CAPS as SPEND_CAPS
from soakd.guard_metrics import GuardMetrics as GuardMetrics
from soakd.guard_metrics import TargetGuardGauges as TargetGuardGauges
from soakd.metric_names import (
    LIMIT_DRIFT,
    LIMIT_E2E,
    LIMIT_ERROR_RATIO,
    LIMIT_JITTER,
    LIMIT_LAG,
    LIMIT_LEAK,
    LIMIT_SERVER_ERROR_RATIO,
    LIMIT_TPOT,
    LIMIT_TTFT,
    LIMIT_VRAM,
)
from soakd.model import (
    OK,
    S_PER_NS,
    USAGE_REJECTED_REASONS,
    ErrorKind,
    Outcome,
    Phase,
    Plan,
    status_class,
)
from soakd.notes import (
    MISMATCH_DIRECTIONS,
    RETRY_AFTER_UNREADABLE,
    USAGE_MISMATCH,
    USAGE_REJECTED,
    notes_of,
)
from soakd.probe_metrics import OOM_SOURCES as OOM_SOURCES
from soakd.probe_metrics import THROTTLE_REASONS as THROTTLE_REASONS
from soakd.probe_metrics import ProbeMetrics as ProbeMetrics
from soakd.tracing import trace_id, traced_names
from soakd.workload.ledger import MISSED_REASONS

# No `*_created` series: one per counter and histogram child, undocumented and unused by
# the rules and dashboards (a counter's reset shows in the counter itself). A process-wide
# switch of prometheus_client, thrown when this module is imported.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

# Buckets in seconds, chosen for LLM serving: a TTFT from 5 ms (a warm GPU, short prompt)
# to a minute (a queue on a 4 GB card); an E2E of up to 10 minutes (long generations).
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
)
E2E_BUCKETS = (
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
    180.0,
    300.0,
    600.0,
)
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)
LAG_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

OUTCOMES = (OK, *(k.value for k in ErrorKind))

HISTOGRAM_BUCKETS = {
    "e2e": E2E_BUCKETS,
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "tpot": ITL_BUCKETS,
    "lag": LAG_BUCKETS,
}
"""Per-target histogram (attribute of ``_TargetChildren``) -> its buckets: the journal keeps
the same bucket counts, so a resumed run continues the histograms exactly."""


@dataclass(slots=True)
class _TargetChildren:
    """Label children cached per target: ``labels()`` is too slow for the hot path."""

    e2e: Histogram
    ttft: Histogram
    itl: BucketChild
    tpot: Histogram
    lag: Histogram
    output_tokens: Counter
    prompt_tokens: Counter
    in_flight: Gauge
    e2e_exemplar: ExemplarClock
    ttft_exemplar: ExemplarClock


class Metrics:
    """Owns the registry and every metric; an OutcomeSink."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.build_info = Info(  # Info adds the "_info" to its name
            mn.BUILD_INFO.removesuffix("_info"), "soakd version and run identity.", registry=r
        )
        self.build_info.info({"version": __version__})

        self.requests = Counter(
            mn.REQUESTS_TOTAL,
            "Finished requests by outcome (ok or the error kind).",
            ["target", "phase", "outcome", "status_class"],
            registry=r,
        )
        self.output_tokens = Counter(
            mn.OUTPUT_TOKENS_TOTAL, "Generated tokens received.", ["target"], registry=r
        )
        self.prompt_tokens = Counter(
            mn.PROMPT_TOKENS_TOTAL,
            "Prompt tokens sent (as the server counted them).",
            ["target"],
            registry=r,
        )
        self.sends_missed = Counter(
            mn.SENDS_MISSED_TOTAL,
            "Planned open-loop sends not made, by reason: late (the "
            "instant was past max_lateness), in_flight_cap, spend_cap, rate_limited, failing, "
            "no_worker, invalid_request (the client refused to build it).",
            ["target", "phase", "reason"],
            registry=r,
        )
        self.oom_errors = Counter(
            mn.OOM_ERRORS_TOTAL,
            "Requests whose error body said the device ran out of memory.",
            ["target"],
            registry=r,
        )
        # what the answers carried beyond their outcome (soakd/notes.py)
        self.usage_rejected = Counter(
            mn.USAGE_REJECTED_TOTAL,
            "Answers whose usage was not taken, by reason: not_integer, negative, "
            "implausible (their output tokens are the streamed count).",
            ["target", "reason"],
            registry=r,
        )
        self.usage_mismatch = Counter(
            mn.USAGE_MISMATCH_TOTAL,
            "Streamed answers whose usage, taken, is above or below the content chunks by "
            "more than one (above: legitimate for a server sending several tokens a chunk).",
            ["target", "direction"],
            registry=r,
        )
        self.retry_after_unreadable = Counter(
            mn.RETRY_AFTER_UNREADABLE_TOTAL,
            "429/503 answers whose Retry-After soakd could not read (paused for "
            "rate_limit.default_pause instead).",
            ["target"],
            registry=r,
        )

        self.e2e = Histogram(
            mn.REQUEST_DURATION_SECONDS,
            "End-to-end latency: send to last byte.",
            ["target"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            mn.TIME_TO_FIRST_TOKEN_SECONDS,
            "Send to the first chunk carrying generated content.",
            ["target"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = BucketHistogram(  # one observation per token: soakd/buckets.py
            mn.INTER_TOKEN_LATENCY_SECONDS,
            "Gap between consecutive content chunks.",
            ["target"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            mn.TIME_PER_OUTPUT_TOKEN_SECONDS,
            "(E2E - TTFT) / (output tokens - 1), per request.",
            ["target"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.lag = Histogram(
            mn.DISPATCH_LAG_SECONDS,
            "Actual minus scheduled send time: how far the load generator fell behind.",
            ["target"],
            buckets=LAG_BUCKETS,
            registry=r,
        )

        self.in_flight = Gauge(
            mn.IN_FLIGHT_REQUESTS, "Requests sent and not yet finished.", ["target"], registry=r
        )
        self.offered_rate = Gauge(
            mn.OFFERED_RATE_RPS,
            "Configured open-loop rate now (0 in closed loop).",
            ["target"],
            registry=r,
        )
        self.offered_concurrency = Gauge(
            mn.OFFERED_CONCURRENCY,
            "Configured closed-loop concurrency now.",
            ["target"],
            registry=r,
        )
        self.phase_info = Gauge(
            mn.PHASE_ACTIVE, "1 for the phase running now, 0 for the others.", ["phase"], registry=r
        )
        self.phase_index = Gauge(
            mn.PHASE_INDEX, "Index of the running phase (-1 before, len(phases) after).", registry=r
        )
        self.elapsed = Gauge(mn.RUN_ELAPSED_SECONDS, "Plan time elapsed.", registry=r)
        self.remaining = Gauge(mn.RUN_REMAINING_SECONDS, "Plan time remaining.", registry=r)
        self.loop_delay = Gauge(
            mn.EVENT_LOOP_DELAY_SECONDS,
            "How late soakd's run loop woke for its last "
            "1 s tick: above a few ms, soakd is short of CPU and its timings suffer.",
            registry=r,
        )
        self.loop_tasks = Gauge(
            mn.EVENT_LOOP_TASKS,
            "asyncio tasks alive on soakd's run loop (its last tick).",
            registry=r,
        )
        self.run_start = Gauge(mn.RUN_START_TIME_SECONDS, "Unix time the run started.", registry=r)

        self.limits = _Limits()
        r.register(self.limits)
        self.goodput = Gauge(
            mn.GOODPUT_RATIO,
            "Share of the requests sent in the last minute that succeeded within every "
            "latency SLO of the target (NaN: none sent).",
            ["target"],
            registry=r,
        )
        self.goodput_rate = Gauge(
            mn.GOODPUT_RPS,
            "Requests per second over the last minute that succeeded within every latency "
            "SLO of the target.",
            ["target"],
            registry=r,
        )

        # the run's ratios on the report's basis (soakd/goodput.py): over the requests
        # judged, i.e. less the guard's sheds and the requests soakd cut or lost itself
        self.run_5xx_ratio = Gauge(
            mn.RUN_5XX_RATIO,
            "Share of this run's judged requests answered with HTTP 5xx by the server "
            "(since the run started, across resumes); 0 before the first request.",
            ["target"],
            registry=r,
        )
        self.run_error_ratio = Gauge(
            mn.RUN_ERROR_RATIO,
            "Share of this run's judged requests that failed, whatever the cause (4xx, 5xx, "
            "transport, timeouts, bad answers; since the run started, across resumes); 0 "
            "before the first request.",
            ["target"],
            registry=r,
        )

        self.no_reuse = Gauge(
            mn.TARGET_NO_REUSE,
            "1 for each answer status after which the target's server closes its connections "
            "without saying so (no Connection: close): soakd reuses no connection after such "
            "an answer; 0 once it keeps them again.",
            ["target", "status"],
            registry=r,
        )

        self._children: dict[str, _TargetChildren] = {}
        self._counters: dict[tuple[str, str, str, int], Counter] = {}
        # target -> [judged, failed, 5xx] of the run (soakd/goodput.py's classes)
        self._run_counts: dict[str, list[int]] = {}
        self._traced: dict[str, str] = {}  # target -> run id: exemplars carry the trace id

    def trace_exemplars(self, run_id: str, targets: Iterable[TargetConfig | str]) -> None:
        """The e2e and TTFT observations of the targets sending a traceparent (names: these)
        carry the request's trace id as an exemplar (soakd/tracing.py; OpenMetrics only)."""
        self._traced = dict.fromkeys(traced_names(targets), run_id)

    def set_limits(self, slo: Slo, alerts: AlertLimits) -> None:
        """The run-wide SLO and the alert-only limits, as gauges; an SLO key not set is
        not exported (no limit, no alert). Per-target overrides are not here."""
        self.limits.values = {
            name: value
            for name, value in (
                (LIMIT_VRAM, slo.vram_peak),
                (LIMIT_ERROR_RATIO, slo.error_ratio),
                (LIMIT_SERVER_ERROR_RATIO, slo.server_error_ratio),
                (LIMIT_E2E, slo.e2e_p99),
                (LIMIT_TTFT, slo.ttft_p99),
                (LIMIT_TPOT, slo.tpot_p99),
                (LIMIT_JITTER, slo.jitter),
                (LIMIT_LEAK, alerts.vram_leak_per_hour),
                (LIMIT_LAG, alerts.dispatch_lag),
                (LIMIT_DRIFT, alerts.e2e_p99_drift_per_hour),
            )
            if value is not None
        }

    def watch_goodput(self, ratio: Callable[[str], float], rate: Callable[[str], float]) -> None:
        """Read each target's windowed goodput at scrape time (soakd/goodput.py)."""
        for target in self._children:
            self.goodput.labels(target).set_function(partial(ratio, target))
            self.goodput_rate.labels(target).set_function(partial(rate, target))

    def show_phase(self, plan: Plan, targets: Sequence[str], phase: Phase | None) -> None:
        """The phase now (None: the plan is over): its flag, index and closed-loop width."""
        for p in {p.name for p in plan.phases}:
            self.phase_info.labels(p).set(0)
        self.phase_index.set(len(plan.phases) if phase is None else phase.index)
        if phase is not None:
            self.phase_info.labels(phase.name).set(1)
        for name in targets:
            shape = phase.loads.get(name) if phase is not None else None
            self.offered_concurrency.labels(name).set(
                shape.concurrency if shape is not None and shape.mode == "closed" else 0
            )
            if phase is None:
                self.offered_rate.labels(name).set(0)

    def add_target(self, target: str, phases: list[str]) -> None:
        """Create every series of a target up front, so rates start at zero, not absent."""
        self._children[target] = _TargetChildren(
            e2e=self.e2e.labels(target),
            ttft=self.ttft.labels(target),
            itl=self.itl.labels(target),
            tpot=self.tpot.labels(target),
            lag=self.lag.labels(target),
            output_tokens=self.output_tokens.labels(target),
            prompt_tokens=self.prompt_tokens.labels(target),
            in_flight=self.in_flight.labels(target),
            e2e_exemplar=ExemplarClock(E2E_BUCKETS),
            ttft_exemplar=ExemplarClock(TTFT_BUCKETS),
        )
        self.oom_errors.labels(target)
        for reason in USAGE_REJECTED_REASONS:
            self.usage_rejected.labels(target, reason)
        for direction in MISMATCH_DIRECTIONS:
            self.usage_mismatch.labels(target, direction)
        self.retry_after_unreadable.labels(target)
        counts = self._run_counts.setdefault(target, [0, 0, 0])
        self.run_error_ratio.labels(target).set_function(partial(_ratio_of, counts, 1))
        self.run_5xx_ratio.labels(target).set_function(partial(_ratio_of, counts, 2))
        self.offered_rate.labels(target)
        self.offered_concurrency.labels(target)
        for phase in phases:
            self.requests.labels(target, phase, OK, "2xx")
            for reason in MISSED_REASONS:
                self.sends_missed.labels(target, phase, reason)

    def missed(self, target: str, phase: str, reason: str, n: int) -> None:
        """A SendLedger's ``on_miss``: planned sends not made."""
        self.sends_missed.labels(target, phase, reason).inc(n)

    def add_phases(self, phases: list[str]) -> None:
        for phase in phases:
            self.phase_info.labels(phase).set(0)

    def watch_in_flight(self, busy: dict[str, int]) -> None:
        """Read in-flight counts at scrape time from the runner's own tally."""
        for target, child in self._children.items():
            child.in_flight.set_function(partial(_count_of, busy, target))

    def record(self, o: Outcome) -> None:
        c = self._children[o.target]
        key = (o.target, o.phase, o.outcome, o.status // 100)
        counter = self._counters.get(key)
        if counter is None:
            counter = self.requests.labels(o.target, o.phase, o.outcome, status_class(o.status))
            self._counters[key] = counter
        counter.inc()
        counts = self._run_counts.get(o.target)
        if counts is not None:
            _count_run(counts, o.outcome, 1)
        if o.sent_ns:
            c.lag.observe(o.dispatch_lag_ns * S_PER_NS)
        if o.output_tokens:
            c.output_tokens.inc(o.output_tokens)
        if o.prompt_tokens:
            c.prompt_tokens.inc(o.prompt_tokens)
        if o.oom:
            self.oom_errors.labels(o.target).inc()
        if o.usage_rejected or o.usage_mismatch or o.retry_after_unreadable:
            for note in notes_of(o):
                self.note(o.target, note)
        if o.error is not None:
            return
        run = self._traced.get(o.target)
        e2e, ttft_ns = o.e2e_ns * S_PER_NS, o.ttft_ns
        ttft = None if ttft_ns is None else ttft_ns * S_PER_NS
        ex = None  # the trace id, as its bucket's exemplar when that bucket's is due
        due = run is not None and c.e2e_exemplar.due(e2e, o.end_ns)
        due_ttft = run is not None and ttft is not None and c.ttft_exemplar.due(ttft, o.end_ns)
        if due or due_ttft:
            ex = {"trace_id": trace_id(run or "", o.target, o.seq)}
        c.e2e.observe(e2e, ex if due else None)
        if ttft is not None:
            c.ttft.observe(ttft, ex if due_ttft else None)
        tpot = o.tpot_ns
        if tpot is not None:
            c.tpot.observe(tpot * S_PER_NS)
        if o.itl_ns:
            c.itl.observe_ns(o.itl_ns)

    def note(self, target: str, note: str, n: int = 1) -> None:
        """Count ``n`` answers of ``target`` that carried ``note`` (soakd/notes.py)."""
        kind, _, value = note.partition(":")
        if kind == USAGE_REJECTED:
            self.usage_rejected.labels(target, value).inc(n)
        elif kind == USAGE_MISMATCH:
            self.usage_mismatch.labels(target, value).inc(n)
        elif kind == RETRY_AFTER_UNREADABLE:
            self.retry_after_unreadable.labels(target).inc(n)

    def restore_notes(self, notes: Iterable[tuple[str, str, int]]) -> None:
        """Continue the note counters of a resumed run from the journal's notes table."""
        for target, note, n in notes:
            self.note(target, note, n)

    def restore(
        self,
        totals: Iterable[tuple[str, str, str, str, int, int, int, int]],
        histograms: Mapping[tuple[str, str], tuple[Sequence[int], float]],
    ) -> list[str]:
        """Continue the counters of a resumed run from the journal's totals, so Prometheus
        sees no reset. ``totals``: (target, phase, outcome, status_class, requests,
        output_tokens, prompt_tokens, oom) rows; ``histograms``: (kind, target) -> (count per
        bucket, +Inf last; sum). Call once, after ``add_target``. Counters continue through
        ``inc``; histograms through ``soakd.buckets.restore_histogram`` (public API only).
        Returns what could not be restored."""
        missing: list[str] = []
        for target, phase, outcome, sclass, n, out_tokens, in_tokens, oom in totals:
            if n:
                self.requests.labels(target, phase, outcome, sclass).inc(n)
                _count_run(self._run_counts.setdefault(target, [0, 0, 0]), outcome, n)
            if out_tokens:
                self.output_tokens.labels(target).inc(out_tokens)
            if in_tokens:
                self.prompt_tokens.labels(target).inc(in_tokens)
            if oom:
                self.oom_errors.labels(target).inc(oom)
        # prometheus_client has no public way to set a histogram: each one with a base is
        # served from now on through a collector that adds the base at scrape time
        from soakd.buckets import Hist, LabelKey, restore_histogram  # only a resume needs it

        bases: dict[str, dict[LabelKey, Hist]] = {}
        for (kind, target), (counts, total) in histograms.items():
            if kind in HISTOGRAM_BUCKETS and target in self._children:
                bases.setdefault(kind, {})[(("target", target),)] = (list(counts), total)
            else:
                missing.append(f"{kind}:{target}")
        for kind, by_child in bases.items():
            misfits = restore_histogram(self.registry, getattr(self, kind), by_child)
            missing += [f"{kind}:{dict(key)['target']}" for key in misfits]
        return missing


def _count_of(busy: dict[str, int], target: str) -> float:
    return busy.get(target, 0)


def _count_run(counts: list[int], outcome: str, n: int) -> None:
    """``n`` outcomes into a target's [judged, failed, 5xx] (soakd/goodput.py decides)."""
    cls = classify(None if outcome == OK else outcome)
    if cls in ("ok", "error"):
        counts[0] += n
    if cls == "error":
        counts[1] += n
        if outcome in SERVER_ERRORS:
            counts[2] += n


def _ratio_of(counts: list[int], which: int) -> float:
    return counts[which] / counts[0] if counts[0] else 0.0


LIMIT_HELP = {
    LIMIT_VRAM: "VRAM limit (slo.vram_peak).",
    LIMIT_ERROR_RATIO: "Error ratio limit (slo.error_ratio): every failure / judged requests.",
    LIMIT_SERVER_ERROR_RATIO: "5xx ratio limit (slo.server_error_ratio).",
    LIMIT_E2E: "P99 end-to-end latency SLO (slo.e2e_p99).",
    LIMIT_TTFT: "P99 TTFT SLO (slo.ttft_p99).",
    LIMIT_TPOT: "P99 TPOT SLO (slo.tpot_p99).",
    LIMIT_JITTER: "Limit on P99 jitter (slo.jitter).",
    LIMIT_LEAK: "VRAM leak slope limit (alert_limits.vram_leak_per_hour).",
    LIMIT_LAG: "Dispatch lag limit (alert_limits.dispatch_lag).",
    LIMIT_DRIFT: "Limit on the drift of P99 end-to-end latency "
    "(alert_limits.e2e_p99_drift_per_hour).",
}


class _Limits:
    """The run-wide limit gauges (no labels), from a snapshot: only the ones set."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def collect(self) -> Iterator[Metric]:
        for name, help_text in LIMIT_HELP.items():
            value = self.values.get(name)
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)


JOURNAL_KINDS = ("request", "sample", "event")


class JournalMetrics:
    """The journal's own health (soakd/journal/), and the run's downtime across resumes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.records = Counter(
            mn.JOURNAL_RECORDS_TOTAL, "Records committed to the journal.", ["kind"], registry=r
        )
        self.dropped = Counter(
            mn.JOURNAL_DROPPED_RECORDS_TOTAL,
            "Records not journaled because the writer's queue was full.",
            ["kind"],
            registry=r,
        )
        self.write_errors = Counter(
            mn.JOURNAL_WRITE_ERRORS_TOTAL,
            "Failed journal commits (disk full, read-only, I/O error); the batch is retried.",
            registry=r,
        )
        self.queue_depth = Gauge(
            mn.JOURNAL_QUEUE_DEPTH, "Records waiting for the journal writer.", registry=r
        )
        self.commit = Histogram(
            mn.JOURNAL_COMMIT_SECONDS,
            "Time to write and commit one batch.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.last_commit = Gauge(
            mn.JOURNAL_LAST_COMMIT_TIME_SECONDS,
            "Unix time of the last successful commit.",
            registry=r,
        )
        self.size = Gauge(
            mn.JOURNAL_SIZE_BYTES, "journal.db and its write-ahead log on disk.", registry=r
        )
        self.downtime = Counter(
            mn.RUN_DOWNTIME_SECONDS_TOTAL,
            "Time the run was down between a stop or crash and its resume.",
            registry=r,
        )
        self.resumes = Counter(mn.RUN_RESUMES_TOTAL, "Times this run was resumed.", registry=r)
        # the disk budget (journal.max_bytes, soakd/journal/budget.py)
        self.max_bytes = Gauge(mn.JOURNAL_MAX_BYTES, "The journal's disk budget.", registry=r)
        self.disk_free = Gauge(
            mn.JOURNAL_DISK_FREE_BYTES, "Free space of the journal's file system.", registry=r
        )
        self.rows_kept = Gauge(
            mn.JOURNAL_ROWS_KEPT,
            "1 while per-request rows are written, 0 once near the budget (rollups only).",
            registry=r,
        )
        self.rows_dropped = Counter(
            mn.JOURNAL_ROWS_DROPPED_TOTAL,
            "Requests kept only in the rollups and totals (no row): "
            "the journal was near its budget.",
            registry=r,
        )
        for kind in JOURNAL_KINDS:
            self.records.labels(kind)
            self.dropped.labels(kind)
