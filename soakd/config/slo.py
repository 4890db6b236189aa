"""Config room, decisions: SLOs, alert-only limits, costs, the report and compare blocks
(docs/slo.md)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, field_validator

from soakd.config.base import Limit, Strict, parse_bytes, parse_duration


class Hardware(Strict):
    """A box bought outright, written off over ``months`` (docs/slo.md: cost)."""

    price: Annotated[float, Field(ge=0)]  # what the box cost
    months: Annotated[float, Field(gt=0)] = 36.0


class TokenPrice(Strict):
    """What a cloud bills per million prompt (input) and output tokens."""

    input: Annotated[float, Field(ge=0)] = 0.0
    output: Annotated[float, Field(ge=0)] = 0.0


class TargetCost(Strict):
    """What the report charges a target, summed: an all-in hourly price (a rented box),
    hardware amortisation, the tokens at a cloud's price, and, without ``per_hour``, the
    energy of its GPUs at ``report.energy_price_per_kwh``."""

    per_hour: Annotated[float, Field(ge=0)] | None = None  # an all-in price per hour
    hardware: Hardware | None = None
    per_mtok: TokenPrice | None = None
    gpus: list[str] | None = None  # GPU indexes charged to it (default: where its process ran)


class Slo(Strict):
    """Service level objectives: the one source of the report's verdicts, goodput, and
    the exporter's limit gauges (docs/slo.md). Every key is optional: unset, not judged."""

    ttft_p99: Limit | None = None  # P99 time to first token (successful requests)
    tpot_p99: Limit | None = None  # P99 time per output token
    e2e_p99: Limit | None = None  # P99 end-to-end latency
    # every failed request (4xx, 5xx, transport, timeouts, bad answers) / judged requests
    error_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    server_error_ratio: Annotated[float, Field(ge=0, le=1)] | None = None  # 5xx / judged
    # checks passed / checks judged, at least (docs/checks.md; needs ``checks:``)
    correct_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    jitter: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None  # stdev / mean
    oom_events: Annotated[int, Field(ge=0)] | None = None  # out-of-memory events, at most
    # the target's peak GPU memory (its process, else its GPUs'), at most
    vram_peak: (
        Annotated[
            float, BeforeValidator(lambda v: parse_bytes(v)), Field(gt=0, allow_inf_nan=False)
        ]
        | None
    ) = None

    def over(self, base: Slo) -> Slo:
        """``base`` with the keys set here replacing its own (a target's overrides)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


DISPATCH_LAG_S: Final = 0.1
"""``alert_limits.dispatch_lag``'s default, also where a stored config or ``/status`` has none."""


class AlertLimits(Strict):
    """Limits that only alert rules read (no verdict judges them), exported as gauges.
    The SLO limits are in the ``slo`` block."""

    vram_leak_per_hour: Annotated[
        float, BeforeValidator(lambda v: parse_bytes(v)), Field(gt=0, allow_inf_nan=False)
    ] = 50e6  # VramLeak: GPU memory growing faster than this
    dispatch_lag: Limit = DISPATCH_LAG_S  # DispatchLagHigh: soakd sending later than this
    e2e_p99_drift_per_hour: Limit = 1.0  # P99 E2E growing faster than this


def lag_limit_s(dispatch_lag: float | None) -> float:
    """The dispatch lag a target's P99 may reach before it is client-limited:
    ``alert_limits.dispatch_lag`` (None: the default)."""
    return float(dispatch_lag or DISPATCH_LAG_S)


def lagged(lag_p99_ms: float | None, dispatch_lag: float | None) -> bool:
    """soakd's dispatch lag P99 for a target past ``lag_limit_s``."""
    return lag_p99_ms is not None and lag_p99_ms > lag_limit_s(dispatch_lag) * 1e3


def client_limited(lag_p99_ms: float | None, late: int, dispatch_lag: float | None) -> bool:
    """soakd itself could not keep a target's schedule: its dispatch lag P99 past the
    limit (``lagged``), or planned sends it made too late to count (``late``: sends not
    made, reason late). Such a target's latency and rate figures measure the client. The
    one rule for the live view's CLIENT-LIMITED line and the report's note."""
    return lagged(lag_p99_ms, dispatch_lag) or late > 0


THRESHOLDS_MOVED = (
    "exporter.thresholds: moved: the SLO limits are now the top-level slo block "
    "(vram_limit_bytes -> slo.vram_peak, error_ratio -> slo.error_ratio, p99_ttft_seconds -> "
    "slo.ttft_p99, p99_e2e_seconds -> slo.e2e_p99, jitter_ratio -> slo.jitter) and the "
    "alert-only ones alert_limits (vram_leak_bytes_per_hour -> vram_leak_per_hour, "
    "dispatch_lag_seconds -> dispatch_lag, p99_e2e_drift_seconds_per_hour -> "
    "e2e_p99_drift_per_hour); see docs/slo.md"
)


class ReportConfig(Strict):
    energy_price_per_kwh: Annotated[float, Field(ge=0)] | None = None  # to cost GPU energy
    currency: str = "$"  # written before every amount


REGRESSION_KEYS = (
    "ttft_p99",
    "tpot_p99",
    "e2e_p99",
    "ttft_p50",
    "e2e_p50",
    "error_ratio",
    "server_error_ratio",
    "goodput",
    "goodput_rps",
    "output_tps",
    "rps",
)
"""What ``compare.max_regression`` may bound (soakd/measure/verdicts.py knows each one's
direction)."""


def _regression(value: Any) -> Any:
    """``"10%"`` -> ("relative", 0.10); a number or a duration -> ("absolute", value)."""
    if isinstance(value, list | tuple) and len(value) == 2:  # as stored: (kind, amount)
        return tuple(value)
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return ("relative", float(value.strip()[:-1]) / 100)
        except ValueError:
            raise ValueError(f"bad percentage {value!r}") from None
    if isinstance(value, str):
        return ("absolute", parse_duration(value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a limit: {value!r} (use e.g. 10% or 0.001)")  # noqa: TRY004
    return ("absolute", float(value))


LimitKind = Literal["relative", "absolute"]
"""How a regression limit reads: a share of the baseline (10 %) or the metric's own unit."""

Regression = Annotated[
    tuple[LimitKind, Annotated[float, Field(ge=0, allow_inf_nan=False)]],
    BeforeValidator(_regression),
]


class Compare(Strict):
    """A candidate target against a baseline (a model version against the current one)."""

    baseline: str  # a target's name
    candidate: str  # another target's name, judged against the baseline
    max_regression: dict[str, Regression] = Field(default_factory=dict)

    @field_validator("max_regression")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(REGRESSION_KEYS))
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(unknown)} (known: {', '.join(REGRESSION_KEYS)})"
            )
        return value


class JudgedTarget(Strict):
    """A target of ``soakd report --config``, matched by name: its SLO overrides and cost."""

    name: str
    slo: Slo = Slo()
    cost: TargetCost = TargetCost()


class Decisions(Strict):
    """What ``soakd report --config FILE`` reads of FILE: what decides a run (its SLO,
    compare, report and per-target slo and cost blocks), nothing else; a whole config is
    read the same way (loader.load_decisions)."""

    slo: Slo = Slo()
    compare: Compare | None = None
    report: ReportConfig = ReportConfig()
    targets: list[JudgedTarget] = Field(default_factory=list)
