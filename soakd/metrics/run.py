"""Metrics: every metric of ``soakd run``, in an injected registry.

The names are ``soakd/metrics/names.py``'s constants (``soakd gateway``'s metrics are in
``soakd/gateway/metrics.py``); docs/metrics.md lists them; the dashboards and alert rules
use exactly these names (``tests/unit/test_metric_names.py``).
Labels are bounded: target and phase names come from config, outcome from ErrorKind.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import Metric

from soakd import __version__
from soakd.config import AlertLimits, Slo, TargetConfig
from soakd.measure.buckets import BucketChild, BucketHistogram, ExemplarClock

# the latency buckets live with the fold (the journal's writer counts them); imported from
# here as before
from soakd.measure.fold import E2E_BUCKETS as E2E_BUCKETS
from soakd.measure.fold import HISTOGRAM_BUCKETS as HISTOGRAM_BUCKETS
from soakd.measure.fold import ITL_BUCKETS as ITL_BUCKETS
from soakd.measure.fold import LAG_BUCKETS as LAG_BUCKETS
from soakd.measure.fold import TTFT_BUCKETS as TTFT_BUCKETS
from soakd.measure.fold import Fold, Hist
from soakd.measure.goodput import SERVER_ERRORS, classify
from soakd.measure.notes import (
    MISMATCH_DIRECTIONS,
    RETRY_AFTER_UNREADABLE,
    USAGE_MISMATCH,
    USAGE_REJECTED,
)
from soakd.metrics import names as mn

# the probes' and the guard's families live beside this module; imported from here as before
from soakd.metrics.guard import GuardMetrics as GuardMetrics
from soakd.metrics.guard import TargetGuardGauges as TargetGuardGauges
from soakd.metrics.limits import Limits
from soakd.metrics.probes import OOM_SOURCES as OOM_SOURCES
from soakd.metrics.probes import THROTTLE_REASONS as THROTTLE_REASONS
from soakd.metrics.probes import ProbeMetrics as ProbeMetrics
from soakd.model import OK, USAGE_REJECTED_REASONS, ErrorKind, MissReason, Phase, Plan
from soakd.tracing import trace_id, traced_names

# No `*_created` series: one per counter and histogram child, undocumented and unused by
# the rules and dashboards (a counter's reset shows in the counter itself). A process-wide
# switch of prometheus_client, thrown when this module is imported.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

OUTCOMES = (OK, *(k.value for k in ErrorKind))


@dataclass(slots=True)
class _TargetChildren:
    """Label children cached per target: ``labels()`` is a lookup and a lock a call."""

    e2e: BucketChild
    ttft: BucketChild
    itl: BucketChild
    tpot: BucketChild
    lag: BucketChild
    output_tokens: Counter
    prompt_tokens: Counter
    in_flight: Gauge
    e2e_exemplar: ExemplarClock
    ttft_exemplar: ExemplarClock
    run_counts: list[int]  # [judged, failed, 5xx] of the run (soakd/measure/goodput.py's classes)
    error_ratio: Gauge
    server_error_ratio: Gauge

    def show_ratios(self) -> None:
        """The run ratios from the counts: set by the loop whenever they change."""
        counts = self.run_counts
        self.error_ratio.set(counts[1] / counts[0] if counts[0] else 0.0)
        self.server_error_ratio.set(counts[2] / counts[0] if counts[0] else 0.0)


class Continued(CollectorRegistry):
    """The families a resumed run continues from the journal's totals (docs/metrics.md),
    held out of every scrape until ``release``: until then a scrape finds them absent
    (stale, to Prometheus), never at 0. A 0 followed by the restored totals reads as a
    counter reset, and ``rate()``/``increase()`` would count the earlier sessions again.

    Registered into the served registry as one collector; ``held=False`` serves at once
    (a new run: 0 is the truth)."""

    def __init__(self, *, held: bool) -> None:
        super().__init__()
        self._released = threading.Event()
        if not held:
            self._released.set()

    def release(self) -> None:
        """The families stand at the journal's totals: serve them from now on."""
        self._released.set()

    def collect(self) -> Iterator[Metric]:
        if self._released.is_set():
            yield from super().collect()


@dataclass(frozen=True, slots=True)
class RunSeries:
    """What a run's ``Metrics`` are built with, whole: its identity (``soakd_build_info``),
    its run-wide limits, its phases and targets (every series up front), the targets whose
    exemplars carry a trace id, and when it started (a resume: the first session's)."""

    run_id: str
    node: str
    site: str
    slo: Slo
    alerts: AlertLimits
    phases: tuple[str, ...]
    targets: tuple[TargetConfig, ...]
    started: float  # unix time


class Metrics:
    """Owns the registry and every metric; applies the journal's committed folds. Given
    ``run``, it is built whole: the run's identity, limits, phases and targets are in it
    from the start (nothing is wired into it later; the loop sets its gauges)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        held: bool = False,
        run: RunSeries | None = None,
    ) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        # what a resume continues from the journal: served once it stands there (Continued)
        self.continued = c = Continued(held=held)
        r.register(c)
        self.build_info = Info(  # Info adds the "_info" to its name
            mn.BUILD_INFO.removesuffix("_info"), "soakd version and run identity.", registry=r
        )
        self.build_info.info({"version": __version__})

        self.requests = Counter(
            mn.REQUESTS_TOTAL,
            "Finished requests by outcome (ok or the error kind).",
            ["target", "phase", "outcome", "status_class"],
            registry=c,
        )
        self.output_tokens = Counter(
            mn.OUTPUT_TOKENS_TOTAL, "Generated tokens received.", ["target"], registry=c
        )
        self.prompt_tokens = Counter(
            mn.PROMPT_TOKENS_TOTAL,
            "Prompt tokens sent (as the server counted them).",
            ["target"],
            registry=c,
        )
        self.sends_missed = Counter(
            mn.SENDS_MISSED_TOTAL,
            "Planned open-loop sends not made, by reason: late (the "
            "instant was past max_lateness), in_flight_cap, spend_cap, rate_limited, failing, "
            "no_worker, invalid_request (the client refused to build it).",
            ["target", "phase", "reason"],
            registry=c,
        )
        self.conversations = Counter(
            mn.CONVERSATIONS_TOTAL,
            "Multi-turn conversations (workload.conversations), by event: started, "
            "finished (every turn sent), ended_early, with its reason (the failed turn's "
            "outcome, not_sent, phase_ended, stopped; empty for the others).",
            ["target", "event", "reason"],
            registry=c,
        )
        self.oom_errors = Counter(
            mn.OOM_ERRORS_TOTAL,
            "Requests whose error body said the device ran out of memory.",
            ["target"],
            registry=c,
        )
        # what the answers carried beyond their outcome (soakd/measure/notes.py)
        self.usage_rejected = Counter(
            mn.USAGE_REJECTED_TOTAL,
            "Answers whose usage was not taken, by reason: not_integer, negative, "
            "implausible (their output tokens are the streamed count; not streamed: unknown).",
            ["target", "reason"],
            registry=c,
        )
        self.usage_mismatch = Counter(
            mn.USAGE_MISMATCH_TOTAL,
            "Streamed answers whose usage, taken, is above or below the content chunks by "
            "more than one (above: legitimate for a server sending several tokens a chunk).",
            ["target", "direction"],
            registry=c,
        )
        self.retry_after_unreadable = Counter(
            mn.RETRY_AFTER_UNREADABLE_TOTAL,
            "429/503 answers whose Retry-After soakd could not read (paused for "
            "rate_limit.default_pause instead).",
            ["target"],
            registry=c,
        )

        self.e2e = BucketHistogram(
            mn.REQUEST_DURATION_SECONDS,
            "End-to-end latency: send to the answer's last chunk carrying a choice.",
            ["target"],
            E2E_BUCKETS,
            registry=c,
        )
        self.ttft = BucketHistogram(
            mn.TIME_TO_FIRST_TOKEN_SECONDS,
            "Send to the first chunk carrying generated content.",
            ["target"],
            TTFT_BUCKETS,
            registry=c,
        )
        self.itl = BucketHistogram(
            mn.INTER_TOKEN_LATENCY_SECONDS,
            "Gap between consecutive content chunks.",
            ["target"],
            ITL_BUCKETS,
            registry=c,
        )
        self.tpot = BucketHistogram(
            mn.TIME_PER_OUTPUT_TOKEN_SECONDS,
            "(E2E - TTFT) / (output tokens - 1), per request.",
            ["target"],
            ITL_BUCKETS,
            registry=c,
        )
        self.lag = BucketHistogram(
            mn.DISPATCH_LAG_SECONDS,
            "Actual minus scheduled send time: how far the load generator fell behind.",
            ["target"],
            LAG_BUCKETS,
            registry=c,
        )

        # TTFT broken down (soakd/measure/breakdown.py): not continued by a resume, they
        # start at 0 in a new process like the probe counters (docs/metrics.md)
        self.ttft_by = {
            "context": BucketHistogram(
                mn.TTFT_BY_CONTEXT_SECONDS,
                "TTFT of successful requests by context length: the served prompt tokens' "
                "bucket (its upper bound; +Inf past 131072).",
                ["target", "context"],
                TTFT_BUCKETS,
                registry=r,
            ),
            "turn": BucketHistogram(
                mn.TURN_TTFT_SECONDS,
                "TTFT of successful conversation turns by turn index (from 0; 16+ past 15).",
                ["target", "turn"],
                TTFT_BUCKETS,
                registry=r,
            ),
        }

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
        self.sink_failures = Counter(
            mn.SINK_FAILURES_TOTAL,
            "Outcomes one of soakd's own readers raised on and missed, by reader (the others "
            "got them; soakd's log names the exception's type and place). Any is a soakd bug.",
            ["sink"],
            registry=r,
        )
        self.run_start = Gauge(mn.RUN_START_TIME_SECONDS, "Unix time the run started.", registry=r)

        self.limits = Limits()
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

        # the run's ratios on the report's basis (soakd/measure/goodput.py): over the requests
        # judged, i.e. less the guard's sheds and the requests soakd cut or lost itself
        self.run_5xx_ratio = Gauge(
            mn.RUN_5XX_RATIO,
            "Share of this run's judged requests answered with HTTP 5xx by the server "
            "(since the run started, across resumes); 0 before the first request.",
            ["target"],
            registry=c,
        )
        self.run_error_ratio = Gauge(
            mn.RUN_ERROR_RATIO,
            "Share of this run's judged requests that failed, whatever the cause (4xx, 5xx, "
            "transport, timeouts, bad answers; since the run started, across resumes); 0 "
            "before the first request.",
            ["target"],
            registry=c,
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
        self._counters: dict[tuple[str, str, str, str], Counter] = {}
        # target -> [judged, failed, 5xx] of the run (soakd/measure/goodput.py's classes)
        self._run_counts: dict[str, list[int]] = {}
        self._traced: dict[str, str] = {}  # target -> run id: exemplars carry the trace id
        if run is not None:
            self._build(run)

    def _build(self, run: RunSeries) -> None:
        """A run's series, before anything reads the registry."""
        self.build_info.info(
            {"version": __version__, "run_id": run.run_id, "node": run.node, "site": run.site}
        )
        self.set_limits(run.slo, run.alerts)
        phases = list(run.phases)
        self.add_phases(phases)
        for t in run.targets:
            self.add_target(t.name, phases)
        self.trace_exemplars(run.run_id, run.targets)  # those sending a traceparent
        self.run_start.set(run.started)
        self.phase_index.set(-1)

    def trace_exemplars(self, run_id: str, targets: Iterable[TargetConfig | str]) -> None:
        """The e2e and TTFT observations of the targets sending a traceparent (names: these)
        carry the request's trace id as an exemplar (soakd/tracing.py; OpenMetrics only)."""
        self._traced = dict.fromkeys(traced_names(targets), run_id)

    def set_limits(self, slo: Slo, alerts: AlertLimits) -> None:
        """The run-wide SLO and the alert-only limits, as gauges (soakd/metrics/limits.py)."""
        self.limits.set(slo, alerts)

    def show(
        self,
        in_flight: Mapping[str, int],
        goodput: Mapping[str, tuple[float | None, float | None]],
    ) -> None:
        """What the run loop publishes once a tick (soakd/run/app.py): each target's
        requests in flight, and its goodput over the last minute (share, None: none sent;
        good requests a second: soakd/measure/goodput.py). Set here, on the loop: no
        gauge reads the run's objects at scrape time."""
        for target, c in self._children.items():
            c.in_flight.set(in_flight.get(target, 0))
        for target, (ratio, rate) in goodput.items():
            self.goodput.labels(target).set(math.nan if ratio is None else ratio)
            self.goodput_rate.labels(target).set(rate or 0.0)

    def show_phase(self, plan: Plan, targets: Sequence[str], phase: Phase | None) -> None:
        """The phase now (None: the plan is over): its flag, index and closed-loop width."""
        for p in {p.name for p in plan.phases}:
            self.phase_info.labels(p).set(0)
        self.phase_index.set(len(plan.phases) if phase is None else phase.index)
        if phase is not None:
            self.phase_info.labels(phase.name).set(1)
        for name in targets:
            shape = phase.loads.get(name) if phase is not None else None
            self.offered_concurrency.labels(name).set(shape.concurrency if shape is not None else 0)
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
            e2e_exemplar=ExemplarClock(len(E2E_BUCKETS) + 1),
            ttft_exemplar=ExemplarClock(len(TTFT_BUCKETS) + 1),
            run_counts=self._run_counts.setdefault(target, [0, 0, 0]),
            error_ratio=self.run_error_ratio.labels(target),
            server_error_ratio=self.run_5xx_ratio.labels(target),
        )
        self.oom_errors.labels(target)
        for reason in USAGE_REJECTED_REASONS:
            self.usage_rejected.labels(target, reason)
        for direction in MISMATCH_DIRECTIONS:
            self.usage_mismatch.labels(target, direction)
        self.retry_after_unreadable.labels(target)
        self._children[target].show_ratios()  # present at 0 before the first request
        self.offered_rate.labels(target)
        self.offered_concurrency.labels(target)
        for phase in phases:
            self.requests.labels(target, phase, OK, "2xx")
            for reason in MissReason:
                self.sends_missed.labels(target, phase, reason)

    def conversation(self, target: str, event: str, reason: str) -> None:
        """The runner's ``on_conversation``: one started, finished or ended early."""
        self.conversations.labels(target, event, reason).inc()

    def missed(self, target: str, phase: str, reason: str, n: int) -> None:
        """A SendLedger's ``on_miss``: planned sends not made."""
        self.sends_missed.labels(target, phase, reason).inc(n)

    def add_phases(self, phases: list[str]) -> None:
        for phase in phases:
            self.phase_info.labels(phase).set(0)

    def apply(self, f: Fold) -> None:
        """A committed batch of outcomes, folded once by the journal's writer
        (soakd/measure/fold.py): counters by key, notes, histogram buckets in bulk, and the exemplar
        candidates of the targets sending a traceparent (a bucket's at most once a second);
        the run ratios of the targets it counted."""
        counters, children = self._counters, self._children
        counted: dict[str, _TargetChildren] = {}
        for key, (n, out_tokens, in_tokens, oom) in f.totals.items():
            counter = counters.get(key)
            if counter is None:
                counter = counters[key] = self.requests.labels(*key)
            counter.inc(n)
            target, _, outcome, _ = key
            c = children[target]
            if out_tokens:
                c.output_tokens.inc(out_tokens)
            if in_tokens:
                c.prompt_tokens.inc(in_tokens)
            if oom:
                self.oom_errors.labels(target).inc(oom)
            _count_run(c.run_counts, outcome, n)
            counted[target] = c
        for c in counted.values():
            c.show_ratios()
        for (target, note), n in f.notes.items():
            self.note(target, note, n)
        for (kind, target), b in f.hists.items():
            child: BucketChild = getattr(children[target], kind)
            child.add(b.counts, b.total)
        for (by, target, split_key), b in f.split.items():
            self.ttft_by[by].labels(target, split_key).add(b.counts, b.total)
        for (kind, target), candidates in f.exemplars.items():
            run = self._traced.get(target)
            if run is None:
                continue
            c = children[target]
            clock = c.e2e_exemplar if kind == "e2e" else c.ttft_exemplar
            child = c.e2e if kind == "e2e" else c.ttft
            for bucket, (seq, value, end_ns) in candidates.items():
                if clock.due(bucket, end_ns):
                    child.set_exemplar(bucket, {"trace_id": trace_id(run, target, seq)}, value)

    def note(self, target: str, note: str, n: int = 1) -> None:
        """Count ``n`` answers of ``target`` that carried ``note`` (soakd/measure/notes.py)."""
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
        histograms: Mapping[tuple[str, str], Hist],
    ) -> list[str]:
        """Continue the counters of a resumed run from the journal's totals, so Prometheus
        sees no reset. ``totals``: (target, phase, outcome, status_class, requests,
        output_tokens, prompt_tokens, oom) rows; ``histograms``: (kind, target) -> (count per
        bucket, +Inf last; sum). Call once, after ``add_target``. Counters continue through
        ``inc``; histogram buckets are added to soakd's own (soakd/measure/buckets.py). Returns what
        could not be restored (no such target, other buckets)."""
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
        for (kind, target), (counts, total) in histograms.items():
            c = self._children.get(target)
            bounds = HISTOGRAM_BUCKETS.get(kind)
            if c is None or bounds is None or len(counts) != len(bounds) + 1:
                missing.append(f"{kind}:{target}")
                continue
            child: BucketChild = getattr(c, kind)
            child.add(counts, total)
        for c in self._children.values():
            c.show_ratios()
        return missing


def _count_run(counts: list[int], outcome: str, n: int) -> None:
    """``n`` outcomes into a target's [judged, failed, 5xx] (soakd/measure/goodput.py decides)."""
    cls = classify(None if outcome == OK else outcome)
    if cls in ("ok", "error"):
        counts[0] += n
    if cls == "error":
        counts[1] += n
        if outcome in SERVER_ERRORS:
            counts[2] += n
