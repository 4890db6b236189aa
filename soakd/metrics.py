"""Metrics: every soakd metric name lives here, in an injected registry.

docs/metrics.md lists them; the dashboards and alert rules use exactly these names.
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
from soakd.config import AlertLimits, Slo, TargetConfig
from soakd.model import OK, ErrorKind, Outcome, status_class
from soakd.tracing import trace_id, traced_names
from soakd.workload.ledger import MISSED_REASONS

NS = 1e-9

# No `*_created` series: one per counter and histogram child, undocumented and unused by
# the rules and dashboards (a counter's reset shows in the counter itself). A process-wide
# switch of prometheus_client, thrown when this module is imported.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client

# Buckets in seconds, chosen for LLM serving: a TTFT from 5 ms (a warm GPU, short prompt)
# to a minute (a queue on a 4 GB card); an E2E of up to 10 minutes (long generations).
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0,
               30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
               0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
LAG_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
               0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

OUTCOMES = (OK, *(k.value for k in ErrorKind))

HISTOGRAM_BUCKETS = {"e2e": E2E_BUCKETS, "ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS,
                     "tpot": ITL_BUCKETS, "lag": LAG_BUCKETS}
"""Per-target histogram (attribute of ``_TargetChildren``) -> its buckets: the journal keeps
the same bucket counts, so a resumed run continues the histograms exactly."""


@dataclass(slots=True)
class _TargetChildren:
    """Label children cached per target: ``labels()`` is too slow for the hot path."""

    e2e: Histogram
    ttft: Histogram
    itl: Histogram
    tpot: Histogram
    lag: Histogram
    output_tokens: Counter
    prompt_tokens: Counter
    in_flight: Gauge


class Metrics:
    """Owns the registry and every metric; an OutcomeSink."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.build_info = Info("soakd_build", "soakd version and run identity.", registry=r)
        self.build_info.info({"version": __version__})

        self.requests = Counter(
            "soakd_requests", "Finished requests by outcome (ok or the error kind).",
            ["target", "phase", "outcome", "status_class"], registry=r)
        self.output_tokens = Counter(
            "soakd_output_tokens", "Generated tokens received.", ["target"], registry=r)
        self.prompt_tokens = Counter(
            "soakd_prompt_tokens", "Prompt tokens sent (as the server counted them).",
            ["target"], registry=r)
        self.sends_missed = Counter(
            "soakd_sends_missed", "Planned open-loop sends not made, by reason: late (the "
            "instant was past max_lateness), in_flight_cap, spend_cap, rate_limited.",
            ["target", "phase", "reason"], registry=r)
        self.resends = Counter(
            "soakd_connection_resends", "Requests sent again on a fresh connection because a "
            "reused keep-alive one was dead before any response byte (not an outcome).",
            ["target"], registry=r)
        self.oom_errors = Counter(
            "soakd_oom_errors", "Requests whose error body said the device ran out of memory.",
            ["target"], registry=r)

        self.e2e = Histogram(
            "soakd_request_duration_seconds", "End-to-end latency: send to last byte.",
            ["target"], buckets=E2E_BUCKETS, registry=r)
        self.ttft = Histogram(
            "soakd_time_to_first_token_seconds",
            "Send to the first chunk carrying generated content.",
            ["target"], buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(
            "soakd_inter_token_latency_seconds", "Gap between consecutive content chunks.",
            ["target"], buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram(
            "soakd_time_per_output_token_seconds",
            "(E2E - TTFT) / (output tokens - 1), per request.",
            ["target"], buckets=ITL_BUCKETS, registry=r)
        self.lag = Histogram(
            "soakd_dispatch_lag_seconds",
            "Actual minus scheduled send time: how far the load generator fell behind.",
            ["target"], buckets=LAG_BUCKETS, registry=r)

        self.in_flight = Gauge(
            "soakd_in_flight_requests", "Requests sent and not yet finished.", ["target"],
            registry=r)
        self.offered_rate = Gauge(
            "soakd_offered_rate_rps", "Configured open-loop rate now (0 in closed loop).",
            ["target"], registry=r)
        self.offered_concurrency = Gauge(
            "soakd_offered_concurrency", "Configured closed-loop concurrency now.",
            ["target"], registry=r)
        self.phase_info = Gauge(
            "soakd_phase_active", "1 for the phase running now, 0 for the others.",
            ["phase"], registry=r)
        self.phase_index = Gauge(
            "soakd_phase_index", "Index of the running phase (-1 before, len(phases) after).",
            registry=r)
        self.elapsed = Gauge(
            "soakd_run_elapsed_seconds", "Plan time elapsed.", registry=r)
        self.remaining = Gauge(
            "soakd_run_remaining_seconds", "Plan time remaining.", registry=r)
        self.loop_delay = Gauge(
            "soakd_event_loop_delay_seconds", "How late soakd's run loop woke for its last "
            "1 s tick: above a few ms, soakd is short of CPU and its timings suffer.",
            registry=r)
        self.run_start = Gauge(
            "soakd_run_start_time_seconds", "Unix time the run started.", registry=r)

        self.limits = _Limits()
        r.register(self.limits)
        self.goodput = Gauge(
            "soakd_goodput_ratio",
            "Share of the requests sent in the last minute that succeeded within every "
            "latency SLO of the target (NaN: none sent).", ["target"], registry=r)
        self.goodput_rate = Gauge(
            "soakd_goodput_rps",
            "Requests per second over the last minute that succeeded within every latency "
            "SLO of the target.", ["target"], registry=r)

        self.run_5xx_ratio = Gauge(
            "soakd_run_5xx_ratio",
            "Share of this run's finished requests answered with HTTP 5xx (since the run "
            "started, across resumes); 0 before the first request.", ["target"], registry=r)

        self._children: dict[str, _TargetChildren] = {}
        self._counters: dict[tuple[str, str, str, int], Counter] = {}
        self._run_counts: dict[str, list[int]] = {}  # target -> [requests, 5xx] of the run
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

    def watch_goodput(
        self, ratio: Callable[[str], float], rate: Callable[[str], float]
    ) -> None:
        """Read each target's windowed goodput at scrape time (soakd/goodput.py)."""
        for target in self._children:
            self.goodput.labels(target).set_function(partial(ratio, target))
            self.goodput_rate.labels(target).set_function(partial(rate, target))

    def add_target(self, target: str, phases: list[str]) -> None:
        """Create every series of a target up front, so rates start at zero, not absent."""
        self._children[target] = _TargetChildren(
            e2e=self.e2e.labels(target), ttft=self.ttft.labels(target),
            itl=self.itl.labels(target), tpot=self.tpot.labels(target),
            lag=self.lag.labels(target), output_tokens=self.output_tokens.labels(target),
            prompt_tokens=self.prompt_tokens.labels(target),
            in_flight=self.in_flight.labels(target))
        self.oom_errors.labels(target)
        counts = self._run_counts.setdefault(target, [0, 0])
        self.run_5xx_ratio.labels(target).set_function(partial(_ratio_of, counts))
        self.resends.labels(target)
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
            counts[0] += 1
            if o.status // 100 == 5 and not (o.error is not None and o.error.shed):
                counts[1] += 1  # the guard's own 503s are load it shed, not failures
        if o.resends:
            self.resends.labels(o.target).inc(o.resends)
        if o.sent_ns:
            c.lag.observe(o.dispatch_lag_ns * NS)
        if o.output_tokens:
            c.output_tokens.inc(o.output_tokens)
        if o.prompt_tokens:
            c.prompt_tokens.inc(o.prompt_tokens)
        if o.oom:
            self.oom_errors.labels(o.target).inc()
        if o.error is not None:
            return
        run = self._traced.get(o.target)
        ex = None if run is None else {"trace_id": trace_id(run, o.target, o.seq)}
        c.e2e.observe(o.e2e_ns * NS, ex)
        ttft = o.ttft_ns
        if ttft is not None:
            c.ttft.observe(ttft * NS, ex)
        tpot = o.tpot_ns
        if tpot is not None:
            c.tpot.observe(tpot * NS)
        observe = c.itl.observe
        for gap in o.itl_ns:
            observe(gap * NS)


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
                tally = self._run_counts.setdefault(target, [0, 0])
                tally[0] += n
                if sclass == "5xx" and not outcome.startswith("shed_"):
                    tally[1] += n
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


def _ratio_of(counts: list[int]) -> float:
    return counts[1] / counts[0] if counts[0] else 0.0


LIMIT_VRAM = "soakd_vram_limit_bytes"
LIMIT_ERROR_RATIO = "soakd_error_ratio_limit"
LIMIT_E2E = "soakd_slo_e2e_p99_seconds"
LIMIT_TTFT = "soakd_slo_ttft_p99_seconds"
LIMIT_TPOT = "soakd_slo_tpot_p99_seconds"
LIMIT_JITTER = "soakd_jitter_ratio_limit"
LIMIT_LEAK = "soakd_vram_leak_limit_bytes_per_hour"
LIMIT_LAG = "soakd_dispatch_lag_limit_seconds"
LIMIT_DRIFT = "soakd_e2e_p99_drift_limit_seconds_per_hour"
LIMIT_HELP = {
    LIMIT_VRAM: "VRAM limit (slo.vram_peak).",
    LIMIT_ERROR_RATIO: "Error ratio limit (slo.error_ratio).",
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
    """The journal's own health (soakd/journal.py), and the run's downtime across resumes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.records = Counter(
            "soakd_journal_records", "Records committed to the journal.", ["kind"], registry=r)
        self.dropped = Counter(
            "soakd_journal_dropped_records",
            "Records not journaled because the writer's queue was full.", ["kind"], registry=r)
        self.write_errors = Counter(
            "soakd_journal_write_errors",
            "Failed journal commits (disk full, read-only, I/O error); the batch is retried.",
            registry=r)
        self.queue_depth = Gauge(
            "soakd_journal_queue_depth", "Records waiting for the journal writer.", registry=r)
        self.commit = Histogram(
            "soakd_journal_commit_seconds", "Time to write and commit one batch.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r)
        self.last_commit = Gauge(
            "soakd_journal_last_commit_time_seconds", "Unix time of the last successful commit.",
            registry=r)
        self.size = Gauge(
            "soakd_journal_size_bytes", "journal.db and its write-ahead log on disk.",
            registry=r)
        self.downtime = Counter(
            "soakd_run_downtime_seconds",
            "Time the run was down between a stop or crash and its resume.", registry=r)
        self.resumes = Counter("soakd_run_resumes", "Times this run was resumed.", registry=r)
        for kind in JOURNAL_KINDS:
            self.records.labels(kind)
            self.dropped.labels(kind)


THROTTLE_REASONS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sync_boost",
                    "sw_thermal", "hw_thermal", "hw_power_brake", "display_clock", "other")
OOM_SOURCES = ("error_body", "restart_after_errors", "process_vanished", "xid", "log")


class ProbeMetrics:
    """GPU, server-side and health metrics, filled by the probes (soakd/probes/)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        gpu = ["gpu"]
        self.probe_up = Gauge(
            "soakd_gpu_probe_up", "1 when the GPU source answers, 0 when absent or failing.",
            ["source"], registry=r)
        self.gpu_info = Gauge(
            "soakd_gpu_info", "Always 1; names each GPU.", ["gpu", "uuid", "name"], registry=r)
        self.mem_total = Gauge("soakd_gpu_memory_total_bytes", "GPU memory in all.", gpu,
                               registry=r)
        self.mem_used = Gauge("soakd_gpu_memory_used_bytes", "GPU memory used.", gpu,
                              registry=r)
        self.mem_free = Gauge("soakd_gpu_memory_free_bytes", "GPU memory free.", gpu,
                              registry=r)
        self.mem_reserved = Gauge("soakd_gpu_memory_reserved_bytes",
                                  "GPU memory reserved by the driver.", gpu, registry=r)
        self.mem_peak = Gauge("soakd_gpu_memory_used_peak_bytes",
                              "Highest GPU memory used seen this run.", gpu, registry=r)
        self.proc_mem = Gauge(
            "soakd_gpu_process_memory_bytes",
            "GPU memory of the target's process ('other' for processes of no target).",
            ["gpu", "target"], registry=r)
        self.leak_slope = Gauge(
            "soakd_gpu_memory_leak_slope_bytes_per_hour",
            "Robust (Theil-Sen) slope of GPU memory used over the leak window.", gpu,
            registry=r)
        self.leak_window_fill = Gauge(
            "soakd_gpu_memory_leak_window_fill_ratio",
            "How much of the leak window the slope's readings span (0-1): the VramLeak alert "
            "waits for 0.8.", gpu, registry=r)
        self.proc_leak_slope = Gauge(
            "soakd_gpu_process_memory_leak_slope_bytes_per_hour",
            "Robust slope of the target's GPU process memory over the leak window.",
            ["gpu", "target"], registry=r)
        self.temperature = Gauge("soakd_gpu_temperature_celsius", "GPU temperature.", gpu,
                                 registry=r)
        self.power = Gauge("soakd_gpu_power_watts", "GPU power draw.", gpu, registry=r)
        self.energy = Counter("soakd_gpu_energy_joules", "GPU energy used since soakd started.",
                              gpu, registry=r)
        self.sm_clock = Gauge("soakd_gpu_sm_clock_hertz", "SM clock.", gpu, registry=r)
        self.mem_clock = Gauge("soakd_gpu_memory_clock_hertz", "Memory clock.", gpu,
                               registry=r)
        self.utilization = Gauge("soakd_gpu_utilization_ratio", "GPU busy fraction (0-1).",
                                 gpu, registry=r)
        self.throttle = Gauge(
            "soakd_gpu_throttle_active", "1 while the clock is held back for this reason.",
            ["gpu", "reason"], registry=r)
        self.xid = Counter("soakd_gpu_xid_errors", "XID critical errors by code.",
                           ["gpu", "xid"], registry=r)

        target = ["target"]
        self.target_up = Gauge(
            "soakd_target_up", "1 when the target's health check answers.", target, registry=r)
        self.restarts = Counter(
            "soakd_target_restarts", "Times the target's server restarted.", target, registry=r)
        self.oom_events = Counter(
            "soakd_target_oom_events", "Out-of-memory events, by where soakd saw them.",
            ["target", "source"], registry=r)
        self.scrape_errors = Counter(
            "soakd_target_scrape_errors", "Failed scrapes of the target's /metrics.", target,
            registry=r)
        self.running = Gauge("soakd_server_requests_running",
                             "Requests the server is running (vllm:num_requests_running).",
                             target, registry=r)
        self.waiting = Gauge("soakd_server_requests_waiting",
                             "Requests queued in the server (vllm:num_requests_waiting).",
                             target, registry=r)
        self.kv_cache = Gauge("soakd_server_kv_cache_usage_ratio",
                              "KV cache in use, 0-1 (vllm:kv_cache_usage_perc).", target,
                              registry=r)
        self.preemptions = Counter("soakd_server_preemptions",
                                   "Preemptions reported by the server.", target, registry=r)
        self.server_rss = Gauge("soakd_server_resident_memory_bytes",
                                "The server process's resident memory.", target, registry=r)
        self.server_start = Gauge("soakd_server_start_time_seconds",
                                  "The server process's start time (Unix).", target, registry=r)
        self.server_rss_leak_slope = Gauge(
            "soakd_server_resident_memory_leak_slope_bytes_per_hour",
            "Robust slope of the server process's resident memory over the leak window.",
            target, registry=r)
        self.server_means = {
            "ttft": Gauge("soakd_server_time_to_first_token_mean_seconds",
                          "Server-side mean TTFT over the last scrape interval "
                          "(vllm:time_to_first_token_seconds).", target, registry=r),
            "e2e": Gauge("soakd_server_request_duration_mean_seconds",
                         "Server-side mean end-to-end latency over the last scrape interval "
                         "(vllm:e2e_request_latency_seconds).", target, registry=r),
            "queue": Gauge("soakd_server_queue_time_mean_seconds",
                           "Server-side mean queue time over the last scrape interval "
                           "(vllm:request_queue_time_seconds).", target, registry=r),
            "itl": Gauge("soakd_server_inter_token_latency_mean_seconds",
                         "Server-side mean time per generated token over the last scrape "
                         "interval (vllm:inter_token_latency_seconds, llama.cpp's "
                         "tokens_predicted_seconds / tokens_predicted).", target, registry=r),
        }
        self.e2e_p99_interval = Gauge(
            "soakd_e2e_p99_interval_seconds",
            "Client-side P99 end-to-end latency of the last closed drift interval.", target,
            registry=r)
        self.e2e_p99_drift = Gauge(
            "soakd_e2e_p99_drift_seconds_per_hour",
            "Robust (Theil-Sen) slope of the per-interval P99 end-to-end latency over the "
            "drift window.", target, registry=r)


SPEND_CAPS = ("requests_per_hour", "tokens_per_hour", "requests", "tokens")
PAUSE_REASONS = ("spend_cap", "rate_limited")


class GuardMetrics:
    """Send guards (soakd/workload/guard.py): pauses and spend caps (the open-loop sends not
    made while paused are ``soakd_sends_missed_total``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        target_reason = ["target", "reason"]
        self.paused = Gauge(
            "soakd_target_paused", "1 while the target's sends are paused, by reason.",
            target_reason, registry=r)
        self.pauses = Counter(
            "soakd_target_pauses", "Times the target's sends were paused, by reason.",
            target_reason, registry=r)
        self.cap_hits = Counter(
            "soakd_spend_cap_hits", "Times a spend cap paused the target.", ["target", "cap"],
            registry=r)
        self.used = Gauge(
            "soakd_spend_used", "What the spend caps compare against: requests or tokens in "
            "the last hour, or in the whole run.", ["target", "cap"], registry=r)
        self.limit = Gauge(
            "soakd_spend_limit", "Configured spend caps (absent when not set).",
            ["target", "cap"], registry=r)

    def add_target(
        self, target: str, limits: Mapping[str, int | None], used: Callable[[], Mapping[str, float]]
    ) -> TargetGuardGauges:
        """Series of one target, zero from the start; ``used`` is read at scrape time."""
        for reason in PAUSE_REASONS:
            self.paused.labels(target, reason).set(0)
            self.pauses.labels(target, reason)
        for cap in SPEND_CAPS:
            limit = limits.get(cap)
            if limit is None:
                continue
            self.limit.labels(target, cap).set(limit)
            self.cap_hits.labels(target, cap)
            self.used.labels(target, cap).set_function(partial(_used_of, used, cap))
        return TargetGuardGauges(self, target)


def _used_of(used: Callable[[], Mapping[str, float]], cap: str) -> float:
    return used().get(cap, 0.0)


@dataclass(slots=True)
class TargetGuardGauges:
    """One target's guard series (the ``GuardGauges`` a TargetGuard reports to)."""

    m: GuardMetrics
    target: str

    def paused(self, reason: str, on: bool) -> None:
        self.m.paused.labels(self.target, reason).set(1 if on else 0)
        if on:
            self.m.pauses.labels(self.target, reason).inc()

    def cap_hit(self, cap: str) -> None:
        self.m.cap_hits.labels(self.target, cap).inc()


GATEWAY_BREAKERS = ("vram", "error_rate")
GATEWAY_BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
GATEWAY_REJECTIONS = ("vram_breaker_open", "error_breaker_open", "queue_full", "queue_timeout",
                      "body_too_large", "headers_too_large")
GATEWAY_UPSTREAM_ERRORS = ("connect", "timeout", "truncated")
GATEWAY_FEATURES = ("vram_breaker", "error_breaker", "adaptive")
GATEWAY_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0,
                           1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    """``soakd gateway`` (soakd/gateway/): admission, breakers, concurrency, the upstream."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.build_info = Info("soakd_gateway_build", "soakd gateway version.", registry=r)
        self.build_info.info({"version": __version__})
        self.responses = Counter(
            "soakd_gateway_upstream_responses", "Upstream answers passed on, by status class.",
            ["status_class"], registry=r)
        self.upstream_errors = Counter(
            "soakd_gateway_upstream_errors",
            "Upstream failures with no (whole) answer: connect, timeout, truncated.",
            ["kind"], registry=r)
        self.rejections = Counter(
            "soakd_gateway_rejections", "Requests the gateway answered itself, by reason.",
            ["reason"], registry=r)
        self.in_flight = Gauge(
            "soakd_gateway_in_flight_requests", "Requests in flight to the upstream.", registry=r)
        self.queue_depth = Gauge(
            "soakd_gateway_queue_depth", "Requests waiting for a concurrency slot.", registry=r)
        self.limit = Gauge(
            "soakd_gateway_concurrency_limit", "Requests allowed in flight to the upstream now.",
            registry=r)
        self.limit_changes = Counter(
            "soakd_gateway_concurrency_limit_changes",
            "Adaptive limit changes, by direction (up, down).", ["direction"], registry=r)
        self.ttfb_p95 = Gauge(
            "soakd_gateway_upstream_ttfb_p95_seconds",
            "The adaptive controller's last P95 of upstream time to first byte.", registry=r)
        self.latency_target = Gauge(
            "soakd_gateway_latency_target_seconds",
            "Configured P95 upstream time-to-first-byte target.", registry=r)
        self.breaker_state = Gauge(
            "soakd_gateway_breaker_state", "0 closed, 1 half-open, 2 open.", ["breaker"],
            registry=r)
        self.transitions = Counter(
            "soakd_gateway_breaker_transitions", "Breaker state changes, by the state entered.",
            ["breaker", "to"], registry=r)
        self.feature = Gauge(
            "soakd_gateway_feature_enabled", "1 when the feature is on.", ["feature"], registry=r)
        self.vram_used = Gauge(
            "soakd_gateway_vram_used_bytes", "The VRAM reading the breaker compares.", registry=r)
        self.vram_limit = Gauge(
            "soakd_gateway_vram_limit_bytes", "VRAM breaker: open above this (for hold).",
            registry=r)
        self.vram_lower = Gauge(
            "soakd_gateway_vram_lower_mark_bytes", "VRAM breaker: close below this.", registry=r)
        self.vram_up = Gauge(
            "soakd_gateway_vram_probe_up", "1 when the VRAM source answers.", registry=r)
        self.ttfb = Histogram(
            "soakd_gateway_upstream_ttfb_seconds",
            "Upstream time to first response byte (headers and the first body chunk).",
            buckets=GATEWAY_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram(
            "soakd_gateway_upstream_duration_seconds",
            "Upstream request duration, send to last byte passed on.",
            buckets=GATEWAY_LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "soakd_gateway_queue_wait_seconds", "Time admitted requests waited for a slot.",
            buckets=GATEWAY_LATENCY_BUCKETS, registry=r)
        for sc in ("2xx", "3xx", "4xx", "5xx"):
            self.responses.labels(sc)
        for kind in GATEWAY_UPSTREAM_ERRORS:
            self.upstream_errors.labels(kind)
        for reason in GATEWAY_REJECTIONS:
            self.rejections.labels(reason)
        for direction in ("up", "down"):
            self.limit_changes.labels(direction)
        for breaker in GATEWAY_BREAKERS:
            self.breaker_state.labels(breaker).set(0)
            for state in GATEWAY_BREAKER_STATES:
                self.transitions.labels(breaker, state)

    def set_breaker(self, breaker: str, state: str, transition: bool = True) -> None:
        self.breaker_state.labels(breaker).set(GATEWAY_BREAKER_STATES[state])
        if transition:
            self.transitions.labels(breaker, state).inc()
