"""Config: one strict model tree, loaded once from YAML plus ``SOAKD__`` env overrides.

Nothing else in soakd reads config files or environment variables (API keys are read
here too, by reference, and kept out of every repr). A package, one module per room;
every name other modules import is re-exported here, so ``from soakd.config import X``
is the one way in:

- ``base``: ``Strict``, ``ConfigError``, durations, sizes, limits, URL and HOST:PORT fields
- ``targets``: ``TargetConfig`` and its timeouts, TLS, spend caps and 429 handling
- ``workload``: prompts, load shapes, phases
- ``gateway``: GPU source, probe intervals, the guard gateway's settings and file
- ``checks``: answers checked while the load runs (docs/checks.md)
- ``slo``: SLOs, alert-only limits, costs, report and compare
- ``run``: exporter, journal, run block, and the root ``Config``
- ``loader``: YAML, the env overlay, one-line errors
- ``redact``: the config as stored or shown (``config_doc``), secrets replaced
"""

from soakd.config.base import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    Bytes,
    ConfigError,
    Count,
    Duration,
    Limit,
    Logging,
    PositiveDuration,
    PositiveRate,
    Strict,
    format_duration,
    parse_bytes,
    parse_duration,
)
from soakd.config.capacity import CapacityConfig
from soakd.config.checks import BuiltinKind, ChecksConfig, Reference
from soakd.config.gateway import (
    Concurrency,
    ErrorBreaker,
    GatewayConfig,
    GatewayLimits,
    GatewayModes,
    GatewaySettings,
    GpuConfig,
    Probes,
    VramBreaker,
)
from soakd.config.loader import (
    ENV_PREFIX,
    GATEWAY_ENV_PREFIX,
    config_from_dict,
    gateway_config_from_dict,
    load_config,
    load_decisions,
    load_gateway_config,
)
from soakd.config.run import (
    Config,
    Exporter,
    ExporterBasicAuth,
    ExporterTls,
    JournalConfig,
    RunConfig,
)
from soakd.config.slo import (
    REGRESSION_KEYS,
    THRESHOLDS_MOVED,
    AlertLimits,
    Compare,
    Decisions,
    Hardware,
    JudgedTarget,
    LimitKind,
    Regression,
    ReportConfig,
    Slo,
    TargetCost,
    TokenPrice,
)
from soakd.config.targets import Failing, RateLimit, SpendGuard, TargetConfig, Timeouts, Tls
from soakd.config.workload import (
    DATASETS,
    MAX_TOKENS,
    MAX_TURNS,
    Conversations,
    Load,
    PhaseConfig,
    Prefix,
    Prompts,
    ThinkTime,
    TokenLength,
    TurnCount,
    Workload,
)

__all__ = [
    "DATASETS",
    "ENV_PREFIX",
    "GATEWAY_ENV_PREFIX",
    "MAX_CONCURRENCY",
    "MAX_DURATION_S",
    "MAX_TOKENS",
    "MAX_TURNS",
    "REGRESSION_KEYS",
    "THRESHOLDS_MOVED",
    "AlertLimits",
    "BuiltinKind",
    "Bytes",
    "CapacityConfig",
    "ChecksConfig",
    "Compare",
    "Concurrency",
    "Config",
    "ConfigError",
    "Conversations",
    "Count",
    "Decisions",
    "Duration",
    "ErrorBreaker",
    "Exporter",
    "ExporterBasicAuth",
    "ExporterTls",
    "Failing",
    "GatewayConfig",
    "GatewayLimits",
    "GatewayModes",
    "GatewaySettings",
    "GpuConfig",
    "Hardware",
    "JournalConfig",
    "JudgedTarget",
    "Limit",
    "LimitKind",
    "Load",
    "Logging",
    "PhaseConfig",
    "PositiveDuration",
    "PositiveRate",
    "Prefix",
    "Probes",
    "Prompts",
    "RateLimit",
    "Reference",
    "Regression",
    "ReportConfig",
    "RunConfig",
    "Slo",
    "SpendGuard",
    "Strict",
    "TargetConfig",
    "TargetCost",
    "ThinkTime",
    "Timeouts",
    "Tls",
    "TokenLength",
    "TokenPrice",
    "TurnCount",
    "VramBreaker",
    "Workload",
    "config_from_dict",
    "format_duration",
    "gateway_config_from_dict",
    "load_config",
    "load_decisions",
    "load_gateway_config",
    "parse_bytes",
    "parse_duration",
]
