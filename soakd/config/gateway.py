"""Config room, probes and the guard gateway: where GPU readings come from, probe
intervals, and what a gateway does (soakd gateway: docs/gateway.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from soakd.config.base import (
    Bytes,
    Duration,
    HostPort,
    ListensOn,
    Logging,
    Strict,
    base_http_url,
    http_url,
    parse_bytes,
)


class GpuConfig(Strict):
    """Where GPU readings come from. ``auto``: NVML when a driver answers, else none.
    ``dcgm``: a dcgm-exporter's /metrics at ``dcgm_url``, or, when that is unset, the
    /metrics of the first simulator target (the simulator speaks DCGM's names)."""

    source: Literal["auto", "nvml", "dcgm", "none"] = "auto"
    dcgm_url: str | None = None  # a dcgm-exporter's /metrics (source: dcgm)
    interval: Duration = 1.0  # a reading this often (50 ms at the least)
    leak_window: Duration = 3600.0  # the VRAM leak slope's window (the VramLeak alert)

    @field_validator("dcgm_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value)

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: float) -> float:
        if value < 0.05:
            raise ValueError(f"interval must be at least 50ms, got {value:g}s")
        return value


class Probes(Strict):
    scrape_interval: Duration = 5.0  # target /metrics
    health_interval: Duration = 5.0  # target health_url
    # P99 E2E drift: one P99 per drift_interval, a Theil-Sen slope over drift_window
    drift_interval: Duration = 60.0
    drift_window: Duration = 3600.0

    @model_validator(mode="after")
    def _drift(self) -> Probes:
        if self.drift_interval < 1 or self.drift_window < 2 * self.drift_interval:
            raise ValueError(
                "drift_interval must be at least 1s and drift_window at least twice it, "
                f"got {self.drift_interval:g}s and {self.drift_window:g}s"
            )
        return self


class VramBreaker(Strict):
    """Open (answer 429) once VRAM used stays above ``limit_bytes`` for ``hold``; half-open
    once it stays below ``lower_mark_bytes`` for ``close_hold``; closed after one probe
    request succeeds."""

    enabled: bool = True
    limit_bytes: Bytes = 3.9e9  # the VRAM line (decimal: 3.9GB = 3,719 MiB)
    hold: Duration = 5.0  # above the line this long: open
    lower_mark_bytes: Bytes | None = None  # default: 97 % of limit_bytes
    close_hold: Duration | None = None  # default: hold
    retry_after: Duration = 5.0  # the Retry-After sent while open
    gpu: Annotated[int, Field(ge=0)] | None = None  # None: the fullest GPU

    @model_validator(mode="after")
    def _marks(self) -> VramBreaker:
        if self.lower_mark_bytes is not None and self.lower_mark_bytes >= self.limit_bytes:
            raise ValueError(
                f"lower_mark_bytes ({self.lower_mark_bytes:g}) must be below limit_bytes "
                f"({self.limit_bytes:g})"
            )
        return self

    @property
    def lower_mark(self) -> float:
        mark = self.lower_mark_bytes
        return mark if mark is not None else 0.97 * self.limit_bytes


class ErrorBreaker(Strict):
    """Open (answer 503) when upstream failures (5xx, connect errors, cut streams) exceed
    ``threshold`` of the requests of the last ``window`` (with at least ``min_requests``);
    after ``open_for`` one probe request decides: closed, or open again."""

    enabled: bool = True
    threshold: Annotated[float, Field(gt=0, le=1)] = 0.5
    window: Duration = 30.0
    min_requests: Annotated[int, Field(ge=1)] = 10
    open_for: Duration = 30.0


class Concurrency(Strict):
    """Requests in flight to the upstream. Static (``limit``), or adaptive: AIMD on the
    upstream's P95 time to first byte, every ``interval``. Beyond the limit requests wait,
    at most ``queue`` of them, each at most ``queue_timeout`` (then 429 / 503)."""

    limit: Annotated[int, Field(ge=1)] = 64  # the static limit, or where adaptive starts
    adaptive: bool = False
    min_limit: Annotated[int, Field(ge=1)] = 1
    max_limit: Annotated[int, Field(ge=1)] = 64
    target_p95: Duration = 2.0
    interval: Duration = 5.0
    min_samples: Annotated[int, Field(ge=1)] = 5
    decrease: Annotated[float, Field(gt=0, lt=1)] = 0.5
    queue: Annotated[int, Field(ge=0)] = 256
    queue_timeout: Duration = 30.0

    @model_validator(mode="after")
    def _bounds(self) -> Concurrency:
        if not self.min_limit <= self.max_limit:
            raise ValueError(f"min_limit ({self.min_limit}) is above max_limit ({self.max_limit})")
        if self.adaptive and not self.min_limit <= self.limit <= self.max_limit:
            raise ValueError(
                f"limit ({self.limit}) must be within min_limit..max_limit "
                f"({self.min_limit}..{self.max_limit})"
            )
        if self.interval <= 0 or self.target_p95 <= 0:
            raise ValueError("interval and target_p95 must be above zero")
        return self


class GatewayLimits(Strict):
    max_body_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1024)] = 8 << 20
    max_header_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1024)] = 16384
    connect_timeout: Duration = 5.0
    total_timeout: Duration = 900.0  # one proxied request, first byte to last


class GatewaySettings(Strict):
    """What a gateway does; a target's ``gateway:`` section (soakd starts it) or the body of
    a ``soakd gateway`` config file (``GatewayConfig``)."""

    vram_breaker: VramBreaker = VramBreaker()
    error_breaker: ErrorBreaker = ErrorBreaker()
    concurrency: Concurrency = Concurrency()
    limits: GatewayLimits = GatewayLimits()
    gpu: GpuConfig = GpuConfig()  # where VRAM readings come from (dcgm: the upstream's page)


class GatewayModes(Strict):
    """A phase's switches for a target's gateway (unset: left as they are)."""

    vram_breaker: bool | None = None  # the VRAM breaker on or off from this phase on
    error_breaker: bool | None = None  # the error breaker on or off
    adaptive: bool | None = None  # adaptive concurrency on or off


class GatewayConfig(GatewaySettings, ListensOn):
    """``soakd gateway --config FILE``: one upstream, one listening address."""

    listen: HostPort = "127.0.0.1:8080"  # HOST:PORT the gateway serves on
    upstream: str  # the model server's base URL
    admin_token_env: str | None = None  # enables PUT /gateway/modes with this bearer token
    logging: Logging = Field(default_factory=lambda: Logging())

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        checked = base_http_url(value)
        assert checked is not None
        return checked.rstrip("/")
