"""Report room, the data: a typed ``Report`` of plain numbers, and the metric columns.

``build`` fills it from the journal; the renderers only read it. ``render_json`` writes
it with ``dataclasses.asdict``, so the field names and their order here are the JSON
report's keys and order: add at the end, rename never.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

from soakd.measure.analysis import Quantiles, quantile_of
from soakd.measure.verdicts import CompareVerdict, Verdict
from soakd.report.slowest import SlowRequest

if TYPE_CHECKING:
    from soakd.report.checks import Checked  # its module draws its tables (imports this one)

LatencyKind = Literal["ttft", "itl", "tpot", "e2e"]
LATENCY_KINDS: tuple[LatencyKind, ...] = ("ttft", "itl", "tpot", "e2e")
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


class Downtime(TypedDict):
    offset_h: float  # plan time (hours) where soakd was down
    seconds: float


@dataclass
class Row:
    """One target over the whole run or over one phase. None: not measured."""

    target: str
    phase: str | None
    active_s: float = 0.0
    offered: int = 0  # open-loop instants planned (sent or not) + closed-loop sends
    missed: int = 0  # planned sends not made (soakd_sends_missed_total)
    missed_by_reason: dict[str, int] = field(default_factory=dict)
    requests: int = 0  # sent: each one ends as one outcome (ok + errors + shed + not_judged)
    ok: int = 0
    shed: int = 0  # refused by the guard gateway (shed_* outcomes), not the server's failure
    success_rate: float | None = None  # ok / (requests - not_judged)
    errors: int = 0  # failed: the error ratio's numerator (soakd/measure/goodput.py)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    oom_responses: int = 0
    oom_events: int | None = None
    restarts: int | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    rps: float | None = None  # successes per second of active time
    output_tps: float | None = None
    # share of sent requests within every SLO (soakd/measure/goodput.py)
    goodput: float | None = None
    goodput_rps: float | None = None
    error_ratio: float | None = None  # errors / (requests - shed - not_judged)
    correct_ratio: float | None = None  # checks passed / judged (report/checks.py); None: none
    latency_ms: dict[str, Quantiles] = field(default_factory=dict)  # LatencyKind -> Quantiles
    lag_p99_ms: float | None = None  # soakd's own dispatch lag: high = client-limited
    jitter: float | None = None
    jitter_slices: int = 0
    vram_peak_bytes: float | None = None
    leak_bytes_per_hour: float | None = None
    leak_note: str | None = None  # why there is no slope ("too short to tell")
    energy_j: float | None = None
    energy_shared: bool = False
    tokens_per_joule: float | None = None
    cost: float | None = None
    cost_per_mtok: float | None = None
    cost_per_month: float | None = None
    cost_basis: str | None = None
    not_judged: int = 0  # cancelled at the stop, lost with a sender process: in no ratio
    server_errors: int = 0  # of the errors, 5xx answers
    server_error_ratio: float | None = None  # server_errors / (requests - shed - not_judged)
    attempt_rps: float | None = None  # requests sent per second, whatever became of them


@dataclass
class GpuRow:
    gpu: str
    peak_used_bytes: float | None
    leak_bytes_per_hour: float | None
    energy_j: float | None
    mean_power_w: float | None
    targets: list[str]
    leak_note: str | None = None


@dataclass
class GuardRow:
    """What the guard gateway in front of a target did in one phase."""

    phase: str
    target: str
    modes: str  # the features the phase switched on ("vram_breaker, adaptive"...)
    breaker_openings: dict[str, int]  # breaker -> times it opened
    shed: dict[str, int]  # shed_* kind -> requests soakd counted so
    rejections: dict[str, int]  # the gateway's own count, by its reason
    limit_min: float | None  # concurrency limit over the phase
    limit_max: float | None


@dataclass
class Series:
    """One line of a plot: x in plan hours, y in the plot's unit (None breaks the line)."""

    label: str
    points: list[tuple[float, float | None]]
    group: str = ""  # lines of one group (a target, a GPU) share a colour
    dashed: bool = False


@dataclass
class TargetTested:
    """One target as the run was configured to call it (the journal's redacted config),
    and the sizes it was sent and answered with."""

    name: str
    model: str
    endpoint: str  # redacted (soakd/config/redact.py), or "simulator <profile>"
    api: str  # "chat" or "completions", "openai" or "azure"
    stream: bool
    gateway: bool  # through a soakd gateway soakd started
    prompt_tokens_planned: str  # the workload's distribution ("normal 200 ± 50, 16-400")
    max_tokens: int
    prompt_tokens_served: float | None  # mean over successful requests (server's usage)
    output_tokens_served: float | None  # mean over successful requests
    # the answers' planned lengths and how they were asked ("uniform 16-64 (ignore_eos)");
    # None: none planned, max_tokens capped each answer (soakd/report/output_tokens.py)
    output_tokens_planned: str | None = None


@dataclass
class PhaseTested:
    """One phase of the plan (a looped plan's repeats of it counted in ``times``)."""

    name: str
    start_s: float  # plan time of its first start
    duration_s: float  # one pass, as run (a rehearsal's compressed time)
    configured_s: float  # one pass, as configured
    times: int
    loads: dict[str, str]  # target -> the load shape, described


@dataclass
class Tested:
    """What was tested, for the report's top: targets, plan, sizes, soakd, where, when."""

    run_name: str
    node: str  # run.node (the host's name unless configured)
    site: str | None  # run.site: where the box is (docs/deployment.md)
    hosts: list[str]  # where soakd ran, one per host its sessions ran on
    started: str  # ISO, UTC
    ended: str  # ISO, UTC: the last heartbeat
    rehearsal: bool  # --rehearse: the plan compressed, nothing projected monthly
    scale: float  # run time per configured time (1: not a rehearsal)
    configured_plan_s: float
    duration_cap_s: float | None  # --duration
    prompts: str  # "synthetic" or "file <name>"
    temperature: float | None
    targets: list[TargetTested]
    phases: list[PhaseTested]


@dataclass
class PlannedServed:
    """One target's planned token counts against what it served, as means over the pairs
    compared (prompt tokens, output tokens: the subclasses)."""

    target: str
    requests: int  # the pairs compared
    planned: float | None  # mean planned tokens (None: none compared)
    served: float | None  # mean served tokens

    @property
    def off(self) -> float | None:
        """Served off planned, as a share of planned."""
        if self.planned is None or self.served is None or self.planned <= 0:
            return None
        return self.served / self.planned - 1.0


@dataclass
class PromptTokens(PlannedServed):
    """One target's prompt lengths over the run (report/prompt_tokens.py): over its
    journaled successful requests with usage; served is usage.prompt_tokens."""

    at_start: float | None  # the target's own count of the first prompts, at start


@dataclass
class OutputTokens(PlannedServed):
    """One target's planned answer lengths against what it served (report/output_tokens.py):
    over its successful answers whose length was planned and counted; served is the
    server's usage or the stream's count."""

    asked_with: str  # ignore_eos, min_tokens or none (max_tokens alone)


@dataclass
class SplitRow:
    """Latency of one key of a breakdown (report/breakdowns.py): a context-length bucket
    (its upper bound in served prompt tokens, "+Inf" past the last) or a turn ("0", ...
    "16+"). Latencies over the successful requests; None: none."""

    key: str
    requests: int  # sent, every outcome
    errors: int  # in the error ratio (soakd/measure/goodput.py)
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    itl_p50_ms: float | None  # the median of the requests' own median gaps
    prompt_tokens_mean: float | None  # served prompt tokens: the context length


@dataclass
class Breakdown:
    """One target's latency by context length and by turn, over the run (``phase`` None)
    or one phase; ``by_turn`` empty when it had no conversation."""

    target: str
    phase: str | None
    by_context: list[SplitRow]
    by_turn: list[SplitRow]


@dataclass
class PrefixCacheRow:
    """A target's prefix cache in one phase (``phase`` "run": over the run), as its server
    counted it, beside the shared prefixes planned (report/prefix_cache.py)."""

    target: str
    phase: str
    planned: str  # the shared prefixes planned, in words ("none": none)
    queried: float | None  # prompt tokens looked up (None: the server counts none)
    hits: float | None  # of them, found in the cache

    @property
    def hit_ratio(self) -> float | None:
        if not self.queried or self.hits is None:
            return None
        return self.hits / self.queried


@dataclass
class Report:
    run_id: str
    created: str
    versions: list[str]
    sessions: int
    completed: bool
    active_s: float
    plan_s: float
    downtime_s: float
    downtimes: list[Downtime]
    targets: list[str]
    phases: list[str]
    overall: dict[str, Row]
    by_phase: dict[str, dict[str, Row]]
    gpus: list[GpuRow]
    guard: list[GuardRow]
    best: dict[str, list[str]]
    plots: dict[str, list[Series]]
    notes: list[str]
    currency: str
    slice_s: float
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by target, whole run
    phase_verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    comparison: CompareVerdict | None = None
    passed: bool | None = None  # None: nothing judged (no slo, no compare)
    # target -> phase -> its slowest requests, with trace ids (soakd/report/slowest.py)
    slowest: dict[str, dict[str, list[SlowRequest]]] = field(default_factory=dict)
    tested: Tested | None = None  # what was tested (soakd/report/tested.py)
    # what frames the plots: each phase's start (plan hours, name), each plot's SLO lines
    # (plot -> (label, value in the plot's unit)); soakd/report/plots.py
    plot_phases: list[tuple[float, str]] = field(default_factory=list)
    plot_limits: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    # target -> note -> answers that carried it (soakd/measure/notes.py: usage not taken, usage off
    # the stream, unreadable Retry-After); each also a line of ``notes``
    answer_notes: dict[str, dict[str, int]] = field(default_factory=dict)
    prompt_tokens: list[PromptTokens] = field(default_factory=list)  # planned against served
    prompt_sizing: str | None = None  # how the synthetic prompts were sized (calibration)
    # planned against served answer lengths, per target (empty: none planned)
    output_tokens: list[OutputTokens] = field(default_factory=list)
    # the server's prefix-cache hit ratio beside the shared prefixes planned, per target
    # and phase (empty: no server counted it, none planned)
    prefix_cache: list[PrefixCacheRow] = field(default_factory=list)
    checks: Checked | None = None  # the answers to checks (soakd/report/checks.py)
    # the knees the plan's shares resolved against: the run dir's capacity.json as soakd
    # capacity wrote it (docs/capacity.md), None: none
    capacity: dict[str, Any] | None = None
    # what the journal lost or could not keep (damage, a lost WAL, a full disk): the
    # report's first lines, before anything else (build.py, _journal_warnings)
    warnings: list[str] = field(default_factory=list)
    # latency by context length and by turn, per target: the whole run, then each phase
    # (soakd/report/breakdowns.py)
    breakdowns: list[Breakdown] = field(default_factory=list)


Better = Literal["min", "max"]


class Column(NamedTuple):
    """A metric row of the side-by-side table: ``key`` is a ``Row`` field, or
    ``kind.quantile`` for a latency ("e2e.p99")."""

    key: str
    title: str
    better: Better | None


METRIC_COLUMNS: list[Column] = [
    Column("offered", "offered", None),
    Column("missed", "sends not made", None),
    Column("requests", "sent", None),
    Column("goodput", "goodput (within SLO)", "max"),
    Column("goodput_rps", "goodput (req/s)", "max"),
    Column("success_rate", "success rate", "max"),
    Column("errors", "errors", "min"),
    Column("error_ratio", "error ratio", "min"),
    Column("server_errors", "of which 5xx", "min"),
    Column("server_error_ratio", "5xx ratio", "min"),
    Column("shed", "shed by the guard", None),
    Column("not_judged", "cut by soakd (not judged)", None),
    Column("oom_events", "OOM events", "min"),
    Column("oom_responses", "OOM error responses", "min"),
    Column("restarts", "restarts", "min"),
    Column("ttft.p50", "TTFT p50", "min"),
    Column("ttft.p95", "TTFT p95", "min"),
    Column("ttft.p99", "TTFT p99", "min"),
    Column("itl.p50", "ITL p50", "min"),
    Column("itl.p95", "ITL p95", "min"),
    Column("itl.p99", "ITL p99", "min"),
    Column("tpot.p50", "TPOT p50", "min"),
    Column("tpot.p95", "TPOT p95", "min"),
    Column("tpot.p99", "TPOT p99", "min"),
    Column("e2e.p50", "E2E p50", "min"),
    Column("e2e.p95", "E2E p95", "min"),
    Column("e2e.p99", "E2E p99", "min"),
    Column("jitter", "P99 jitter", "min"),
    Column("rps", "throughput (ok req/s)", "max"),
    Column("attempt_rps", "attempts (req/s)", None),
    Column("output_tps", "output tokens/s", "max"),
    Column("lag_p99_ms", "dispatch lag p99", None),
    Column("vram_peak_bytes", "VRAM peak", "min"),
    Column("leak_bytes_per_hour", "VRAM leak slope", "min"),
    Column("tokens_per_joule", "tokens per joule", "max"),
    Column("cost_per_mtok", "cost per M output tokens", "min"),
    Column("cost_per_month", "cost per month at this load", "min"),
]
TERMINAL_COLUMNS = (
    "offered",
    "missed",
    "requests",
    "goodput",
    "goodput_rps",
    "success_rate",
    "errors",
    "error_ratio",
    "server_error_ratio",
    "shed",
    "not_judged",
    "oom_events",
    "restarts",
    "ttft.p50",
    "ttft.p99",
    "itl.p50",
    "itl.p99",
    "tpot.p50",
    "e2e.p50",
    "e2e.p99",
    "jitter",
    "rps",
    "attempt_rps",
    "output_tps",
    "vram_peak_bytes",
    "tokens_per_joule",
    "cost_per_mtok",
    "cost_per_month",
)
# per phase: the same, less what only the whole run has (a monthly bill); the VRAM peak is
# the phase's own, its readings placed in phases as the counters' are (report/samples.py)
PHASE_COLUMNS = frozenset(TERMINAL_COLUMNS) - {"cost_per_month"}
NOT_RANKED = frozenset(
    {
        "goodput",
        "goodput_rps",
        "success_rate",
        "errors",
        "error_ratio",
        "server_errors",
        "server_error_ratio",
    }
)
"""Rows where any target may be marked best; on every other row only targets that pass the
error criterion and succeeded on most requests compete (soakd/measure/verdicts.py)."""


def value_of(row: Row, key: str) -> float | None:
    """A column's value for one row (``Column.key``)."""
    if "." in key:
        kind, q = key.split(".")
        return quantile_of(row.latency_ms.get(kind, Quantiles()), q)
    value = getattr(row, key)
    return None if value is None else float(value)
