"""Simulator room: the hardware/model profiles the embedded vLLM-like target can play.

A profile is every number the simulator needs, so that its behaviour is
reproducible and reviewable in one place. The numbers of ``edge-4gb`` come from
what a real vLLM did on a 4 GB budget (see shared/gpu-vllm/README.md) and from
the card's datasheet; they are an approximation, not a benchmark.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One simulated server: engine limits, speed, faults, and the card under it."""

    name: str
    description: str

    # Engine limits, as vLLM's flags of the same names.
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int  # per-step token budget (chunked prefill)
    kv_cache_tokens: int  # KV capacity; vLLM reserves it at start
    block_size: int = 16
    gpu_memory_utilization: float = 0.9  # only shown in vllm:cache_config_info

    # Speed. One engine step costs
    #   decode_s_per_step * (1 + decode_slowdown_per_seq * (n - 1))
    #   + decode_s_per_kv_token * cached tokens
    #   + (scheduled tokens - n) / prefill_tokens_per_s
    # for n sequences in the batch: decoding is memory-bound (weights read once a
    # step, so batching is cheap), prefill is compute-bound (linear in tokens).
    prefill_tokens_per_s: float
    decode_s_per_step: float  # step time with one running sequence
    decode_slowdown_per_seq: float  # fractional step-time growth per extra sequence
    decode_s_per_kv_token: float = 0.0  # attention reads grow with cached context

    # Behaviour and faults.
    eos_probability: float = 0.0  # per token, unless the request sets ignore_eos
    error_rate: float = 0.0  # random HTTP 500s (vLLM-shaped InternalServerError)
    # A request arriving when the batch would grow past this many sequences fails at
    # once with HTTP 500 "CUDA out of memory" (a card whose activations do not fit).
    oom_above_running: int | None = None
    seed: int = 0
    # Drift (docs/checks.md): from this many seconds after the start, a check's answer is
    # wrong (a number off by one, a text reversed); and the answers' ``model`` becomes
    # ``drift_model``, their system_fingerprint ``drift_fingerprint`` (the same name still
    # accepted, as a proxy that moved it would). None: never
    wrong_answers_after_s: float | None = None
    model_switch_after_s: float | None = None
    drift_model: str = "soakd-sim-0925"
    drift_fingerprint: str = "fp_sim0925"  # the answers' system_fingerprint after the switch

    # The card, for the DCGM-exporter metrics.
    gpu_name: str
    vram_total_mib: float
    vram_used_mib: float  # device memory used with the server idle: flat by design
    vram_mib_per_running_seq: float  # activations/workspace grow a little with the batch
    vram_leak_bytes_per_hour: float = 0.0  # simulated leak; exhausting VRAM means OOM
    power_idle_w: float
    power_max_w: float
    temp_idle_c: float
    temp_max_c: float  # steady state at full load
    thermal_time_constant_s: float = 60.0
    throttle_temp_c: float = 87.0  # SM clock drops above this
    sm_clock_idle_mhz: float
    sm_clock_max_mhz: float
    mem_clock_mhz: float

    def __post_init__(self) -> None:
        positive = {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_tokens": self.kv_cache_tokens,
            "block_size": self.block_size,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_s_per_step": self.decode_s_per_step,
            "vram_total_mib": self.vram_total_mib,
            "thermal_time_constant_s": self.thermal_time_constant_s,
        }
        for field, value in positive.items():
            if value <= 0:
                raise ValueError(f"profile {self.name!r}: {field} must be > 0, got {value!r}")
        for field, value in {
            "eos_probability": self.eos_probability,
            "error_rate": self.error_rate,
        }.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"profile {self.name!r}: {field} must be in [0, 1], got {value!r}")
        if self.max_model_len > self.kv_cache_tokens // self.block_size * self.block_size:
            # vLLM refuses to start in this case: one sequence could never fit.
            raise ValueError(
                f"profile {self.name!r}: max_model_len {self.max_model_len} exceeds "
                f"the KV cache ({self.kv_cache_tokens} tokens in blocks of {self.block_size})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Every running sequence must be able to decode one token per step.
            raise ValueError(
                f"profile {self.name!r}: max_num_batched_tokens {self.max_num_batched_tokens} "
                f"< max_num_seqs {self.max_num_seqs}"
            )
        if self.oom_above_running is not None and self.oom_above_running < 1:
            raise ValueError(
                f"profile {self.name!r}: oom_above_running must be >= 1, "
                f"got {self.oom_above_running!r}"
            )
        if self.vram_used_mib > self.vram_total_mib:
            raise ValueError(f"profile {self.name!r}: vram_used_mib exceeds vram_total_mib")

    @property
    def kv_cache_blocks(self) -> int:
        """KV capacity in whole blocks, as vLLM allocates it."""
        return self.kv_cache_tokens // self.block_size


# An RTX 3050 Laptop GPU (4 GiB GDDR6, 192 GB/s) serving a ~1.3B Llama-shaped model in
# bf16: weights ~2.5 GiB, KV cache ~0.6 GiB (~20k tokens), the rest CUDA context and
# activations. Decode is bandwidth-bound (~25 ms a step), prefill ~2000 tokens/s.
_EDGE_4GB = Profile(
    name="edge-4gb",
    description="RTX 3050-class 4 GB card, ~1B model, max_num_seqs 16, 20k-token KV cache",
    max_model_len=2048,
    max_num_seqs=16,
    max_num_batched_tokens=2048,
    kv_cache_tokens=20480,
    gpu_memory_utilization=0.9,
    prefill_tokens_per_s=2000.0,
    decode_s_per_step=0.025,
    decode_slowdown_per_seq=0.03,  # 16 running: ~36 ms a step
    decode_s_per_kv_token=1.25e-7,  # a full 20k-token cache adds ~2.5 ms a step
    gpu_name="NVIDIA GeForce RTX 3050 Laptop GPU",
    vram_total_mib=4096.0,
    vram_used_mib=3686.4,  # 3.6 GiB
    vram_mib_per_running_seq=1.5,
    power_idle_w=7.0,
    power_max_w=60.0,
    temp_idle_c=42.0,
    temp_max_c=82.0,
    thermal_time_constant_s=45.0,
    throttle_temp_c=87.0,
    sm_clock_idle_mhz=210.0,
    sm_clock_max_mhz=1740.0,
    mem_clock_mhz=6001.0,
)

# An H200 (141 GB HBM3e) serving an 8B model in bf16 with gpu_memory_utilization 0.9.
_H200 = Profile(
    name="h200",
    description="H200 141 GB, ~8B model, max_num_seqs 256, 800k-token KV cache",
    max_model_len=32768,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    kv_cache_tokens=800_000,
    gpu_memory_utilization=0.9,
    prefill_tokens_per_s=25_000.0,
    decode_s_per_step=0.007,
    decode_slowdown_per_seq=0.004,  # 256 running: ~14 ms a step
    decode_s_per_kv_token=4e-9,
    gpu_name="NVIDIA H200",
    vram_total_mib=143771.0,
    vram_used_mib=129900.0,
    vram_mib_per_running_seq=4.0,
    power_idle_w=115.0,
    power_max_w=700.0,
    temp_idle_c=30.0,
    temp_max_c=68.0,
    thermal_time_constant_s=90.0,
    throttle_temp_c=85.0,
    sm_clock_idle_mhz=345.0,
    sm_clock_max_mhz=1980.0,
    mem_clock_mhz=3201.0,
)

# Tiny delays so tests and benchmarks run in milliseconds: ~1 ms TTFT, ~1 ms a token,
# practically no batching slowdown and no queueing below 256 concurrent requests.
_FAST = dataclasses.replace(
    _H200,
    name="fast",
    description="tiny delays for tests and benchmarks: ~1 ms TTFT, ~1 ms/token",
    max_model_len=32768,
    max_num_seqs=256,
    max_num_batched_tokens=65536,
    kv_cache_tokens=1_048_576,
    prefill_tokens_per_s=1_000_000.0,
    decode_s_per_step=0.001,
    decode_slowdown_per_seq=0.0,
    decode_s_per_kv_token=0.0,
)


def _capacity(name: str, seqs: int, step_s: float, slowdown: float) -> Profile:
    """A profile whose capacity follows from its batch and step time alone: no KV-read
    cost, prefill practically free, no EOS. Answers of M tokens each hold a batch slot for
    M steps (the prefill step samples the first token), so the most it serves is
    ``seqs / (M * step(seqs))`` requests a second, ``step(n) = step_s * (1 + slowdown *
    (n - 1))`` (docs/capacity.md)."""
    return dataclasses.replace(
        _EDGE_4GB,
        name=name,
        description=f"capacity test: max_num_seqs {seqs}, {step_s * 1000:g} ms a step "
        f"(+{slowdown:.0%} a sequence), free prefill",
        max_num_seqs=seqs,
        prefill_tokens_per_s=1e9,
        decode_s_per_step=step_s,
        decode_slowdown_per_seq=slowdown,
        decode_s_per_kv_token=0.0,
    )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _EDGE_4GB,
        # The same card with a slow VRAM leak: the ~390 MiB of headroom are gone after
        # ~12 h, then every new request fails with CUDA out of memory.
        dataclasses.replace(
            _EDGE_4GB,
            name="edge-4gb-leak",
            description="edge-4gb leaking 32 MiB of VRAM an hour (OOM after ~12 h)",
            vram_leak_bytes_per_hour=32.0 * MIB,
        ),
        # The same card misconfigured: activations do not fit past 12 running sequences.
        dataclasses.replace(
            _EDGE_4GB,
            name="edge-4gb-oom",
            description="edge-4gb failing with CUDA out of memory past 12 running sequences",
            oom_above_running=12,
        ),
        # The same card at max_num_seqs 4 with heavy activations (60 MiB a sequence): VRAM
        # used is 3.67 GB idle and passes 3.9 GB with 4 running, so a VRAM breaker in front
        # (soakd gateway) opens under load and closes when the batch drains.
        dataclasses.replace(
            _EDGE_4GB,
            name="edge-4gb-surge",
            description="edge-4gb at max_num_seqs 4, VRAM rising 60 MiB a running sequence "
            "(3.67 GB idle, 3.92 GB at 4 running)",
            max_num_seqs=4,
            vram_used_mib=3500.0,
            vram_mib_per_running_seq=60.0,
        ),
        _H200,
        _FAST,
        # Random 500s and early EOS, for exercising error accounting quickly.
        # Right answers for a while, then wrong ones, and another model under the same name:
        # what the checks and the identity watch are for (docs/checks.md)
        dataclasses.replace(
            _FAST,
            name="fast-drift",
            description="fast, then after 5 s wrong answers to checks and another model",
            wrong_answers_after_s=5.0,
            model_switch_after_s=5.0,
        ),
        dataclasses.replace(
            _FAST,
            name="fast-flaky",
            description="fast with 5% random HTTP 500s and random early EOS",
            error_rate=0.05,
            eos_probability=0.01,
        ),
        # Answers that end by themselves, as a model's do, unless the request sets
        # ignore_eos or min_tokens: what planned answer lengths are for (docs/workloads.md).
        dataclasses.replace(
            _FAST,
            name="fast-eos",
            description="fast with answers ending at their own EOS: 2% a token (~50 tokens)",
            eos_probability=0.02,
        ),
        # capacities known from the profile alone (docs/capacity.md, tests/integration/
        # test_capacity_sim.py): with 32-token answers, 12.5, 18.5 and 25.4 req/s
        _capacity("cap-4", 4, 0.010, 0.0),
        _capacity("cap-8", 8, 0.010, 0.05),
        _capacity("cap-32", 32, 0.030, 0.01),
    )
}


def get_profile(name: str, **overrides: Any) -> Profile:
    """The named profile, optionally with fields replaced (validated again).

    Unknown names raise ``KeyError`` listing the known ones, so a CLI can show them.
    """
    try:
        profile = PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise KeyError(f"unknown sim profile {name!r}; known: {known}") from None
    return dataclasses.replace(profile, **overrides) if overrides else profile
