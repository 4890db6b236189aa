"""Probes room, GPU sources: the one factory that turns ``gpu:`` settings into a GpuSource,
for the probes of ``soakd run`` and the VRAM breaker of ``soakd gateway`` alike.

A DCGM read times out after the sampling interval, at least ``TIMEOUT_FLOOR_S`` and at
most ``DCGM_TIMEOUT_S``: a slow exporter then makes a reading late, not missing, and a
short interval does not turn every busy-exporter answer into a failed reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import structlog

from soakd.config import GpuConfig, TargetConfig
from soakd.gpu.nvml import NvmlApi, NvmlSource
from soakd.gpu.procfs import ProcFs
from soakd.probes._http import Endpoint, base_root
from soakd.probes.gpu.dcgm import DCGM_TIMEOUT_S, DcgmSource
from soakd.probes.gpu.model import GpuSource
from soakd.probes.gpu.nvml import NvmlSampler

log = structlog.get_logger()

TIMEOUT_FLOOR_S: Final = 1.0
"""The shortest DCGM read timeout, whatever ``gpu.interval`` is."""


def dcgm_timeout_s(interval_s: float) -> float:
    """One DCGM read's timeout: the interval, within [TIMEOUT_FLOOR_S, DCGM_TIMEOUT_S]."""
    return min(DCGM_TIMEOUT_S, max(interval_s, TIMEOUT_FLOOR_S))


def make_gpu_source(
    cfg: GpuConfig,
    *,
    dcgm_base: str = "",
    targets: Sequence[TargetConfig] = (),
    nvml: NvmlApi | None = None,
    procfs: ProcFs | None = None,
) -> GpuSource | None:
    """The configured source, or None for ``none`` and for ``dcgm`` with no URL to read.

    ``dcgm`` without ``dcgm_url`` reads ``dcgm_base``'s /metrics (the first simulator
    target's, or the gateway's upstream); with neither, one error line and None.
    ``targets`` map NVML's GPU processes to target names. NVML is read in the sampler
    process (``NvmlSampler``); ``nvml``/``procfs``: a test's fakes, read in this process."""
    if cfg.source == "none":
        return None
    if cfg.source == "dcgm":
        url = cfg.dcgm_url or (base_root(dcgm_base) + "/metrics" if dcgm_base else "")
        if not url:
            log.error(
                "gpu_probe_absent",
                source="dcgm",
                reason="gpu.source is dcgm but there is no dcgm_url and no "
                "simulator target with a URL",
            )
            return None
        return DcgmSource(Endpoint(url), timeout_s=dcgm_timeout_s(cfg.interval))
    # auto and nvml: NVML when a driver answers
    required = cfg.source == "nvml"
    if nvml is not None or procfs is not None:
        return NvmlSource(targets, nvml=nvml, procfs=procfs, required=required)
    return NvmlSampler(targets, required=required)
