"""Config room, the run: the exporter, the journal, the run block, and ``Config``, the
root that checks what crosses sections (names, compare, concurrency against connections)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator

from soakd.config.base import (
    MAX_CONCURRENCY,
    ConfigError,
    Duration,
    HostPort,
    ListensOn,
    Logging,
    Name,
    Strict,
    parse_bytes,
    repeated_name,
)
from soakd.config.capacity import CapacityConfig
from soakd.config.checks import ChecksConfig
from soakd.config.gateway import GpuConfig, Probes
from soakd.config.slo import AlertLimits, Compare, ReportConfig, Slo
from soakd.config.targets import TargetConfig
from soakd.config.workload import Load, PhaseConfig, Workload
from soakd.net import TlsFileError, server_ssl


class ExporterBasicAuth(Strict):
    """HTTP basic auth on /metrics and /status (not on /healthz and /readyz, which say
    nothing and serve container health checks). The password is read by reference."""

    username: Annotated[str, Field(min_length=1, pattern=r"^[^:\s]+$")]
    password_file: Path | None = None
    password_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ExporterBasicAuth:
        if (self.password_file is None) == (self.password_env is None):
            raise ValueError("set password_file or password_env (one of them)")
        return self

    def password(self) -> SecretStr:
        """Read it. Raises ConfigError naming the reference, never the password."""
        if self.password_env:
            value = os.environ.get(self.password_env, "").strip()
            if not value:
                raise ConfigError(
                    f"exporter.basic_auth.password_env: environment variable "
                    f"{self.password_env} is not set"
                )
            return SecretStr(value)
        assert self.password_file is not None
        try:
            value = self.password_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(
                f"exporter.basic_auth.password_file: cannot read {self.password_file}: {why}"
            ) from None
        if not value:
            raise ConfigError(f"exporter.basic_auth.password_file: {self.password_file} is empty")
        return SecretStr(value)


class ExporterTls(Strict):
    """Serve /metrics, /status... over HTTPS with this certificate (PEM files)."""

    cert_file: Path
    key_file: Path

    def context(self) -> ssl.SSLContext:
        """Read the files; a ConfigError naming them when they cannot be loaded."""
        try:
            return server_ssl(self.cert_file, self.key_file)
        except TlsFileError as exc:
            raise ConfigError(f"exporter.tls: {exc}") from None


class Exporter(Strict, ListensOn):
    listen: HostPort = "127.0.0.1:9464"  # loopback: anything wider is an explicit choice
    basic_auth: ExporterBasicAuth | None = None
    tls: ExporterTls | None = None


class JournalConfig(Strict):
    """The run's durable journal (``journal.db``, SQLite WAL): docs/journal.md."""

    synchronous: Literal["full", "normal"] = "full"  # full: a power cut loses <= 1 flush
    flush_interval: Duration = 0.5  # a commit at least this often: a kill loses < 1 s
    queue_size: Annotated[int, Field(ge=100)] = 10_000  # records waiting; beyond: dropped
    keep_samples: Duration | None = None  # delete probe samples older than this
    keep_requests: Duration | None = None  # delete request rows older than this
    # the journal's disk budget; None: its size at start + half the free space, <= 20 GB
    max_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1_000_000)] | None = None
    itl_gaps: bool = True  # false: no gaps at all (count, mean, p50 and max remain)
    # --- journal size (issue 16): per-request ITL storage, disk budget; docs/journal.md
    itl: Literal["compact", "exact"] = "compact"  # compact: 2 % buckets; exact: 4 B a gap
    # max_bytes None: the journal's size at start + half the free space there, <= 20 GB

    @field_validator("flush_interval")
    @classmethod
    def _flush(cls, value: float) -> float:
        if not 0.01 <= value <= 0.5:
            raise ValueError(f"flush_interval must be within 10ms..500ms, got {value:g}s")
        return value


MAX_WORKERS = 256
Label = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
"""A name soakd puts in a Prometheus label value: any text but control characters."""


class RunConfig(Strict):
    name: Name = "soak"  # starts the run id
    # This box's name (the host's unless set): soakd_build_info{node}, the report,
    # summary.json; the edge Prometheus's external label `node` carries the same value.
    node: Label = Field(default_factory=lambda: os.uname().nodename)
    # Where the box is (a lab, a customer, a city; boxes may share one): the label `site`,
    # as `node` (docs/deployment.md, "Beyond one server").
    site: Label | None = None
    duration: Duration | None = None  # a cap on the whole run
    loop: bool = False  # repeat the phases until duration
    drain_timeout: Duration = 30.0  # on stop: how long requests in flight may finish
    start_at: str | None = None  # ISO datetime: the plan's calendar start (default: now)
    # sender processes: 1 sends from soakd's own loop; N > 1 starts N that only send and
    # time; auto (the default): as many as the plan's peak needs, 1 for a light plan, at
    # most one per core soakd may use, less one (soakd/workers/senders.py)
    workers: int | Literal["auto"] = "auto"

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
            if value == "auto" or 1 <= value <= MAX_WORKERS:  # type: ignore[operator]
                return value
        elif isinstance(value, str) and value.strip().isdigit():
            return cls._workers(int(value))  # from the environment (SOAKD__RUN__WORKERS=4)
        raise ValueError(
            f"a number of sender processes from 1 to {MAX_WORKERS}, or auto (got {value!r})"
        )


class Config(Strict):
    run: RunConfig = RunConfig()
    targets: Annotated[list[TargetConfig], Field(min_length=1)]
    workload: Workload = Workload()
    phases: Annotated[list[PhaseConfig], Field(min_length=1)]
    exporter: Exporter = Exporter()
    gpu: GpuConfig = GpuConfig()
    probes: Probes = Probes()
    logging: Logging = Logging()
    journal: JournalConfig = JournalConfig()
    report: ReportConfig = ReportConfig()
    slo: Slo = Slo()
    alert_limits: AlertLimits = AlertLimits()
    compare: Compare | None = None
    checks: ChecksConfig | None = None
    capacity: CapacityConfig | None = None  # the knee's search: soakd capacity (docs/capacity.md)

    @model_validator(mode="after")
    def _names(self) -> Config:
        names = [t.name for t in self.targets]
        repeated = repeated_name("targets", names) or repeated_name(
            "phases", (p.name for p in self.phases)
        )
        if repeated:  # a second phase of a name: the report and the journal merged them
            raise ValueError(repeated)
        if self.workload.conversations is not None:
            completions = [t.name for t in self.targets if t.api != "chat"]
            if completions:  # a conversation is chat messages: a completions prompt has none
                raise ValueError(
                    "workload.conversations: every target must speak api 'chat', but "
                    f"{', '.join(completions)} speak 'completions'"
                )
            source = self.workload.prompts.source
            if source == "sharegpt":  # the dataset's conversations: its turns, its lengths
                given = {"turns", "user_tokens"} & self.workload.conversations.model_fields_set
                if given:
                    raise ValueError(
                        f"workload.conversations.{min(given)}: the sharegpt file's "
                        "conversations give their own turns and lengths; leave it out"
                    )
            elif source != "synthetic":
                raise ValueError(
                    "workload.conversations: synthetic conversations draw their own user "
                    f"turns; prompts.source {source!r} is not used with them (sharegpt "
                    "gives its own)"
                )
        known = set(names)
        gated = {t.name for t in self.targets if t.gateway is not None}
        if self.compare is not None:
            for role in ("baseline", "candidate"):
                name = getattr(self.compare, role)
                if name not in names:
                    raise ValueError(
                        f"compare.{role}: unknown target {name!r} (known: {', '.join(names)})"
                    )
            if self.compare.baseline == self.compare.candidate:
                raise ValueError("compare: baseline and candidate are the same target")
        ref = self.checks.reference if self.checks is not None else None
        if ref is not None and ref.target is not None and ref.target not in known:
            raise ValueError(
                f"checks.reference.target: unknown target {ref.target!r} "
                f"(known: {', '.join(names)})"
            )
        for phase in self.phases:
            unknown = sorted(set(phase.targets) - known)
            if unknown:
                raise ValueError(
                    f"phase {phase.name!r} sets load for unknown target(s) {', '.join(unknown)}"
                    f" (known: {', '.join(names)})"
                )
            for t in self.targets:
                load = phase.targets.get(t.name, phase.load)
                if load.unresolved:  # a share of the knee: checked once resolved
                    if self.capacity is None or not (self.capacity.result or self.capacity.measure):
                        where = f"targets.{t.name}" if t.name in phase.targets else "load"
                        raise ValueError(
                            f"phases[{phase.name}].{where}.{load.share_of}: a share of the "
                            "knee needs capacity.result (a soakd capacity result) or "
                            "capacity.measure: true"
                        )
                    continue
                if load.shape().concurrency > t.max_connections:
                    raise ValueError(
                        f"phase {phase.name!r}: concurrency {load.concurrency} for "
                        f"{t.name!r} is above its max_connections ({t.max_connections}): the "
                        "requests past it would wait inside soakd for a connection, and the "
                        "wait would count as TTFT; raise targets[].max_connections (at most "
                        f"{MAX_CONCURRENCY}) or lower the concurrency"
                    )
            stray = sorted(set(phase.gateway) - gated)
            if stray:
                raise ValueError(
                    f"phase {phase.name!r} sets gateway modes for {', '.join(stray)}, which "
                    f"has no gateway (targets with one: {', '.join(sorted(gated)) or 'none'})"
                )
        if self.run.loop and self.run.duration is None:
            raise ValueError("run.loop needs run.duration, or it would never end")
        if self.capacity is not None or self.sweeps:
            problem = self.capacity_problem()
            if problem:
                raise ValueError(problem)
        return self

    def capacity_problem(self) -> str | None:
        """Why these targets cannot be swept (``soakd capacity``, and ``soakd check`` of a
        config with a ``capacity`` block or a ``mode: sweep`` phase): a floor for an unknown
        target, a target with no SLO to judge a step by. None: they can."""
        names = [t.name for t in self.targets]
        cap = self.capacity or CapacityConfig()
        for name in cap.floor:
            if name not in names:
                return f"capacity.floor.{name}: unknown target (known: {', '.join(names)})"
        for name in names:
            if self.slo_for(name).empty:
                return (
                    f"targets[{name}].slo: no SLO to judge a capacity step by; set slo (or "
                    "the target's slo) with e.g. ttft_p99, e2e_p99 or error_ratio"
                )
        return None

    @property
    def sweeps(self) -> bool:
        """A phase re-measures a target's knee (``mode: sweep``)."""
        return any(
            self.load_for(p, t.name).mode == "sweep" for p in self.phases for t in self.targets
        )

    @property
    def shares(self) -> list[tuple[str, str, Load]]:
        """Every (phase, target, load) written as a share of the knee."""
        return [
            (phase.name, t.name, load)
            for phase in self.phases
            for t in self.targets
            if (load := self.load_for(phase, t.name)).share_of is not None
        ]

    def share_texts(self) -> dict[str, dict[str, str]]:
        """phase -> target -> what its share of the knee resolved to (the plan table,
        /status, the report)."""
        out: dict[str, dict[str, str]] = {}
        for phase, target, load in self.shares:
            out.setdefault(phase, {})[target] = load.share_text() or ""
        return out

    def with_knees(self, knees: dict[str, tuple[str, float]], where: str) -> Config:
        """The config with every share resolved against ``knees`` (target -> (by, knee),
        from ``where``), as each target's own load in its phase. ConfigError, one line
        naming the load, when a target has no knee of the share's kind."""
        phases = []
        for phase in self.phases:
            targets = dict(phase.targets)
            for t in self.targets:
                load = self.load_for(phase, t.name)
                if not load.unresolved:
                    continue
                by, knee = knees.get(t.name, ("", 0.0))
                if by != load.share_of or knee <= 0:
                    field = f"targets.{t.name}" if t.name in phase.targets else "load"
                    raise ConfigError(
                        f"phases[{phase.name}].{field}.{load.share_of}: {where} has no knee "
                        f"by {load.share_of} for target {t.name}"
                    )
                targets[t.name] = load.of_knee(knee)
            phases.append(phase.model_copy(update={"targets": targets}))
        return Config.model_validate(self.model_copy(update={"phases": phases}).model_dump())

    def target(self, name: str) -> TargetConfig:
        return next(t for t in self.targets if t.name == name)

    def slo_for(self, name: str) -> Slo:
        """The run-wide slo with the target's own keys over it."""
        return self.target(name).slo.over(self.slo)

    def load_for(self, phase: PhaseConfig, target: str) -> Load:
        return phase.targets.get(target, phase.load)
