"""Journal stored-run room: what the report and a resume read of the run the journal stored.

A journal's ``meta`` holds the run as its first session started it: the redacted config
(``soakd/config/redact.py``), the resolved plan (``resume.plan_doc``), the flags, the ids.
It used to be read by dict paths (``config.get("targets", [])``), so a key renamed by a
later soakd quietly became an empty list: no targets, no verdicts, no guard rows.
``StoredRun`` is the one typed reading of it:

- *Lenient where a newer soakd adds*: every model ignores keys it does not know
  (``extra="ignore"``), so a journal a newer soakd wrote still reads.
- *Strict where a reading would be wrong*: what the report cannot do without (the run id,
  each target's name, the plan's phases, the config itself) is required, and a journal
  that lacks it is a ``JournalError`` naming the key, not an empty report.
- *Defaults said once, here*: a key an older soakd did not write takes the default written
  beside its field (the same the config has, unless the comment says why not).
- *The deciding sections stay documents* (``slo``, ``compare``, a target's ``slo`` and
  ``cost``): they are read by the config's own strict models where they decide
  (soakd/report/decisions.py), which say in a note when one cannot be read, and
  ``soakd report --config`` replaces them (``decisions_from``, in the same module).

Versions follow the journal schema's (schema.py): ``upgrade`` brings an older document to
the shape read here, one step per change, as ``schema.migrate`` brings the tables. A
journal continued by a newer soakd keeps the config its first session stored while its
schema version moves on, so, like ``migrate`` (which looks for the columns), each step
recognises its old shape instead of trusting the number. The document in the file is
never rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from soakd.config import JournalConfig, ReportConfig, TokenLength
from soakd.journal.schema import JournalError
from soakd.model import NS_PER_S
from soakd.tracing import sends_traceparent

JsonObject = dict[str, object]
"""A section kept as the document it was stored as (read where it decides)."""


class Lenient(BaseModel):
    """A stored document's reading: keys this soakd does not know are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --- the config ------------------------------------------------------------------------------


class StoredCost(Lenient):
    """What the report's samples read of a target's ``cost`` (its prices are read where
    they decide, by the config's own model: decisions.py)."""

    gpus: list[str] | None = None  # the GPUs charged to it (None: where its process ran)

    @field_validator("gpus", mode="before")
    @classmethod
    def _listed(cls, value: object) -> list[str] | None:
        """Any list, each item as its label (a GPU index written as a number too)."""
        return [str(g) for g in value] if isinstance(value, list) else None


class StoredTarget(Lenient):
    name: str  # required: every figure of the report is by target name
    base_url: str = ""
    simulator: str | None = None
    metrics_url: str | None = None
    deployment: str | None = None
    model: str = ""  # the config's default is soakd-sim; absent, the report shows nothing
    kind: str = "openai"
    api: str = "chat"
    stream: bool = True
    # None: decided by the address (soakd/tracing.py); absent: a soakd that sent none
    traceparent: bool | None = None
    # how planned answer lengths were asked (None: by the address: workload/answers.py)
    planned_output: str | None = None
    gateway: JsonObject | None = None  # present: a guard gateway soakd started in front
    slo: JsonObject | None = None  # its overrides of the run's slo (decisions.py reads them)
    cost: JsonObject | None = None  # what it is charged (decisions.py reads it)

    @property
    def guarded(self) -> bool:
        return self.gateway is not None

    @property
    def charged_gpus(self) -> list[str] | None:
        """``cost.gpus``: the GPUs charged to it (None: where its process ran)."""
        return StoredCost.model_validate(self.cost or {}).gpus

    @property
    def traced(self) -> bool:
        """Its requests carried a ``traceparent`` (``tracing.sends_traceparent``); a config
        stored without the key was written by a soakd that sent none."""
        return "traceparent" in self.model_fields_set and sends_traceparent(
            self.traceparent, self.base_url, self.simulator, self.gateway
        )


_LENGTH = TokenLength()


class StoredTokenLength(Lenient):
    """``workload.prompts.input_tokens`` (or ``output_tokens``) as written, with the config's
    defaults; unchecked (a bound this soakd tightened since must not hide the rest of the
    report): the planners check it with the config's model (``TokenLength``) before use."""

    dist: str = _LENGTH.dist
    mean: int = _LENGTH.mean
    stddev: float = _LENGTH.stddev
    min: int = _LENGTH.min
    max: int = _LENGTH.max


class StoredPrefix(Lenient):
    """``workload.prompts.prefix`` as written (shared prefixes)."""

    share: float = 0.0
    count: int = 1
    tokens: int = 256


class StoredPrompts(Lenient):
    source: str = "synthetic"
    input_tokens: StoredTokenLength = StoredTokenLength()
    output_tokens: StoredTokenLength | None = None  # absent: no answer length planned
    file: str | None = None
    prefix: StoredPrefix | None = None  # absent: no shared prefixes


class StoredWorkload(Lenient):
    """``workload``, every key of the config's (``Workload``), in its order: a fleet report
    compares it whole (``model_dump(exclude_unset=True)``: as stored)."""

    prompts: StoredPrompts = StoredPrompts()
    max_tokens: int = 512
    temperature: float | None = None  # absent: not said (the report shows none)
    seed: int = 0
    # absent: a soakd from before the prompts were sized; such a run goes on as it ran
    # (not "auto", the config's default)
    calibrate: str | None = None
    tokenizer: str | None = None
    # multi-turn conversations (their plan, as configured); None: single requests
    conversations: dict[str, Any] | None = None


class StoredRunSection(Lenient):
    """``run``: where the run was."""

    name: str = ""
    node: str = ""
    site: str | None = None


class StoredReport(ReportConfig):
    """``report``: the config's own model (energy price, currency), lenient."""

    model_config = ConfigDict(extra="ignore")


class StoredAlertLimits(Lenient):
    dispatch_lag: float | None = None  # None: the default (report/decisions.py)


class StoredGpu(Lenient):
    source: str = "auto"
    dcgm_url: str | None = None


_JOURNAL = JournalConfig()


class StoredJournal(Lenient):
    """``journal``: how the rows kept each request's ITL gaps (the export says so)."""

    itl: str = _JOURNAL.itl  # compact: 2 % buckets, their order lost; exact: every gap
    itl_gaps: bool = _JOURNAL.itl_gaps  # false: no gaps at all


class StoredConfig(Lenient):
    """The run's config as stored (redacted), as far as the report and a resume read it."""

    targets: list[StoredTarget]  # required: without it nothing is by target
    workload: StoredWorkload = StoredWorkload()
    run: StoredRunSection = StoredRunSection()
    report: StoredReport = StoredReport()
    alert_limits: StoredAlertLimits = StoredAlertLimits()
    gpu: StoredGpu = StoredGpu()
    journal: StoredJournal = StoredJournal()
    slo: JsonObject | None = None
    compare: JsonObject | None = None

    def target(self, name: str) -> StoredTarget | None:
        return next((t for t in self.targets if t.name == name), None)

    def traced(self) -> frozenset[str]:
        """The targets whose requests carried a ``traceparent`` (``StoredTarget.traced``)."""
        return frozenset(t.name for t in self.targets if t.traced)


# --- the plan, the flags, the run -------------------------------------------------------------


class StoredLoad(Lenient):
    """One target's load in one phase, as ``resume.plan_doc`` stored it. Read with
    ``model_dump(exclude_unset=True)``: what was stored, for ``shape_of`` to default."""

    mode: str | None = None
    concurrency: int | None = None
    rate: int | float | None = None  # as written (a describe() prints it)
    rate_end: int | float | None = None
    max_in_flight: int | None = None
    # trace (shapes.Trace.doc)
    trace: str | None = None
    format: str | None = None
    speed: float | None = None
    loop: bool | None = None
    records: int | None = None
    span_ns: int | None = None
    # daily (shapes.Daily.doc)
    hours: list[float] | None = None
    low: float | None = None
    high: float | None = None
    peak_hour: float | None = None
    arrival: str | None = None
    timezone: str | None = None
    anchor_s: float | None = None
    scale: float | None = None


class StoredPhase(Lenient):
    name: str
    start_ns: int
    end_ns: int
    index: int = 0
    loads: dict[str, StoredLoad] = Field(default_factory=dict)


class StoredPlan(Lenient):
    scale: float = 1.0  # run time per configured time (a rehearsal's is below 1)
    phases: list[StoredPhase]  # required: a plan has at least one

    @property
    def end_ns(self) -> int:
        """Where the plan ends, on the plan clock (0: no phase)."""
        return self.phases[-1].end_ns if self.phases else 0

    @property
    def end_s(self) -> float:
        """Where the plan ends, in seconds of plan time (0: no phase)."""
        return self.end_ns / NS_PER_S


class StoredOptions(Lenient):
    """The first session's flags (``--rehearse``, ``--duration``)."""

    rehearse_s: float | None = None
    duration_s: float | None = None


class StoredCore(Lenient):
    """What every reading of a journal needs of its ``meta``, all a salvage reads
    (integrity.py): the run, its config and plan, the rollup window."""

    run_id: str
    config: StoredConfig
    plan: StoredPlan
    window_ns: int


class StoredRun(StoredCore):
    """What the journal's ``meta`` says of the run (read with ``read_stored``); every key
    here has been written since the first journal schema. ``config_document``: the config
    as stored, whole and not upgraded, which a resume compares with its own
    (resume.py)."""

    options: StoredOptions = StoredOptions()
    created_wall: float
    created: str = ""
    plan_start: str  # ISO (read with ``datetime.fromisoformat``, as it was written)
    schema_version: int
    soakd_version: str
    config_document: JsonObject = Field(default_factory=dict)


# --- versions --------------------------------------------------------------------------------


def _alert_limits_from_thresholds(config: JsonObject) -> None:
    """v1 (before the slo block): the alert lines were ``exporter.thresholds``. Their one
    the report reads, the dispatch lag that makes a target client-limited, is
    ``alert_limits.dispatch_lag`` since. The others are not made an SLO: they were written
    with their defaults whether anyone chose them or not, and a limit nobody chose passes
    or fails no release (docs/slo.md), so such a run judges nothing unless
    ``soakd report --config`` gives it an slo."""
    exporter = config.get("exporter")
    thresholds = exporter.get("thresholds") if isinstance(exporter, dict) else None
    if not isinstance(thresholds, dict) or "alert_limits" in config:
        return
    lag = thresholds.get("dispatch_lag_seconds")
    config["alert_limits"] = {} if lag is None else {"dispatch_lag": lag}


UPGRADES: tuple[tuple[int, Callable[[JsonObject], None]], ...] = (
    (1, _alert_limits_from_thresholds),
)
"""(the schema version whose stored config had the old shape, the step to the next), in
order; each step changes only a document it recognises."""


def upgrade(config: Mapping[str, object]) -> JsonObject:
    """A stored config brought to the shape ``StoredConfig`` reads (a copy)."""
    doc = dict(config)
    for _, step in UPGRADES:
        step(doc)
    return doc


def read_stored(meta: Mapping[str, object], where: object = "the journal") -> StoredRun:
    """The run a journal's ``meta`` stored, upgraded; JournalError naming each key that
    is missing or unreadable (``where``: the journal's path, for the message)."""
    try:
        return _read(StoredRun, meta)
    except ValidationError as exc:
        raise JournalError(
            f"{where}: the run it stored cannot be read by this soakd ({unreadable(exc)})"
        ) from None


def read_core(meta: Mapping[str, object]) -> StoredCore:
    """``StoredCore`` of a journal's ``meta``, upgraded; ValueError naming each key that
    is missing or unreadable."""
    try:
        return _read(StoredCore, meta)
    except ValidationError as exc:
        raise ValueError(unreadable(exc)) from None


def unreadable(exc: ValidationError) -> str:
    """The keys a stored document lacks or holds unreadably, in a line (5 at most)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'meta'}: {e['msg']}" for e in exc.errors()[:5]
    )


Read = TypeVar("Read", bound=StoredCore)


def _read(model: type[Read], meta: Mapping[str, object]) -> Read:
    doc = dict(meta)
    config = doc.get("config")
    if isinstance(config, Mapping):
        doc["config"] = upgrade(config)
        doc["config_document"] = config
    return model.model_validate(doc)
