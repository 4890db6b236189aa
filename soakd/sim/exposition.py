"""Simulator room: what the simulator shows on /metrics, named as the real servers name it.

Two exporters in one page, because on a real box a soak test scrapes both:

- vLLM's own ``vllm:*`` metrics (names, types, help, labels ``engine`` and
  ``model_name``, and histogram buckets copied from real vLLM 0.26/0.32 captures),
  plus prometheus_client's process and Python collectors, as vLLM has them;
- dcgm-exporter's ``DCGM_FI_DEV_*`` for the simulated card. These are rendered by
  hand: dcgm-exporter types energy as a counter without a ``_total`` suffix, which
  prometheus_client cannot produce.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from soakd.metrics import names as mn
from soakd.profiles import Profile
from soakd.sim.gpu import GpuSample

# Buckets as vLLM defines them (identical in the 0.26 and 0.32 captures).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                           4096.0, 8192.0, 16384.0)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """Snapshot readers for the gauges: read on each scrape, never stored."""

    running: Callable[[], float]
    waiting: Callable[[], float]
    kv_usage: Callable[[], float]


class VllmMetrics:
    """vLLM's metric set for one engine ("0") and one served model, in ``registry``.

    Label children are resolved once: ``labels()`` is too slow for per-token use.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        profile: Profile,
        model: str,
        gauges: EngineGauges,
    ) -> None:
        names = ("engine", "model_name")  # sorted, as in the captures
        lbl = {"engine": "0", "model_name": model}

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=registry).labels(**lbl).set_function(fn)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=registry).labels(**lbl)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, registry=registry, buckets=buckets).labels(**lbl)

        gauge(
            mn.VLLM_REQUESTS_RUNNING,
            "Number of requests in model execution batches.",
            gauges.running,
        )
        gauge(
            mn.VLLM_REQUESTS_WAITING,
            "Number of requests waiting to be processed.",
            gauges.waiting,
        )
        gauge(
            mn.VLLM_KV_CACHE_USAGE,
            "KV-cache usage. 1 means 100 percent usage.",
            gauges.kv_usage,
        )
        self.preemptions = counter(
            mn.VLLM_PREEMPTIONS, "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            mn.VLLM_GENERATION_TOKENS, "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("engine", "finished_reason", "model_name"),
            registry=registry,
        )
        self.success = {r: success.labels(finished_reason=r, **lbl) for r in FINISHED_REASONS}
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            TOKEN_COUNT_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            TOKEN_COUNT_BUCKETS,
        )
        self.ttft = histogram(
            mn.VLLM_TTFT_SECONDS,
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            mn.VLLM_ITL_SECONDS,
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            mn.VLLM_E2E_SECONDS,
            "Histogram of e2e request latency in seconds.",
            REQUEST_TIME_BUCKETS,
        )
        self.queue_time = histogram(
            mn.VLLM_QUEUE_SECONDS,
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_TIME_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_TIME_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_TIME_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_TIME_BUCKETS,
        )
        info = {
            "block_size": str(profile.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "engine": "0",
            "gpu_memory_utilization": str(profile.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(profile.kv_cache_tokens / profile.max_model_len),
            "kv_cache_size_tokens": str(profile.kv_cache_blocks * profile.block_size),
            "num_gpu_blocks": str(profile.kv_cache_blocks),
        }
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(info),
            registry=registry,
        ).labels(**info).set(1.0)


def make_registry() -> CollectorRegistry:
    """An own registry with the process and Python collectors vLLM's page also has."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@dataclass(frozen=True, slots=True)
class CardIdentity:
    """The labels dcgm-exporter puts on every sample of one GPU."""

    uuid: str
    model_name: str
    hostname: str
    gpu: str = "0"
    device: str = "nvidia0"
    pci_bus_id: str = "00000000:01:00.0"

    @classmethod
    def for_profile(cls, profile: Profile) -> CardIdentity:
        """A stable UUID per profile and seed, so restarts look like the same card."""
        ident = uuid.uuid5(uuid.NAMESPACE_URL, f"soakd-sim/{profile.name}/{profile.seed}")
        return cls(uuid=f"GPU-{ident}", model_name=profile.gpu_name, hostname=socket.gethostname())

    def labels(self) -> str:
        pairs = (
            ("gpu", self.gpu),
            ("UUID", self.uuid),
            ("pci_bus_id", self.pci_bus_id),
            ("device", self.device),
            ("modelName", self.model_name),
            ("Hostname", self.hostname),
        )
        return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def render_dcgm(sample: GpuSample, card: CardIdentity) -> str:
    """The sample as dcgm-exporter's text page (help, type, one line per field)."""
    lbl = "{" + card.labels() + "}"
    rows = (
        (mn.DCGM_SM_CLOCK, "gauge", "SM clock frequency (in MHz).",
         str(round(sample.sm_clock_mhz))),
        (mn.DCGM_MEM_CLOCK, "gauge", "Memory clock frequency (in MHz).",
         str(round(sample.mem_clock_mhz))),
        (mn.DCGM_GPU_TEMP, "gauge", "GPU temperature (in C).",
         str(round(sample.gpu_temp_c))),
        (mn.DCGM_POWER_USAGE, "gauge", "Power draw (in W).", f"{sample.power_w:.6f}"),
        (mn.DCGM_TOTAL_ENERGY, "counter",
         "Total energy consumption since boot (in mJ).", str(int(sample.total_energy_mj))),
        (mn.DCGM_GPU_UTIL, "gauge", "GPU utilization (in %).",
         str(round(sample.gpu_util_pct))),
        (mn.DCGM_XID_ERRORS, "gauge", "Value of the last XID error encountered.",
         str(sample.xid_last)),
        (mn.DCGM_FB_FREE, "gauge", "Framebuffer memory free (in MiB).",
         str(round(sample.fb_free_mib))),
        (mn.DCGM_FB_USED, "gauge", "Framebuffer memory used (in MiB).",
         str(round(sample.fb_used_mib))),
    )  # fmt: skip
    return "".join(
        f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{lbl} {value}\n"
        for name, kind, doc, value in rows
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
