"""Probes room, GPU: a GpuSource (NVML, DCGM) sampled into soakd's GPU gauges.

One module per concern: ``model`` (the ``GpuSource`` seam, XID and throttle catalogs;
pure), ``nvml`` (NVML, read through the sampler process ``soakd.gpu.sampler``), ``dcgm`` (a
dcgm-exporter's page), ``probe`` (readings -> gauges and samples, on the loop) and
``sources`` (the one factory, shared with the gateway). The readings, the NVML driver's
calls and the process map live in ``soakd/gpu/`` (the sampler imports them without the
probes). Every name other modules import is re-exported here.
"""

from soakd.gpu.nvml import NvmlApi, NvmlSource
from soakd.gpu.procfs import LinuxProcFs, ProcessMap, ProcFs
from soakd.probes.gpu.dcgm import DcgmSource, parse_dcgm
from soakd.probes.gpu.model import (
    MEMORY_XIDS,
    OTHER,
    THROTTLE_BITS,
    XID_MEANINGS,
    GpuReading,
    GpuSource,
    ProcMem,
    Vanished,
    XidCallback,
)
from soakd.probes.gpu.nvml import NvmlSampler
from soakd.probes.gpu.probe import GpuProbe, VanishedCallback
from soakd.probes.gpu.sources import TIMEOUT_FLOOR_S, dcgm_timeout_s, make_gpu_source

__all__ = [
    "MEMORY_XIDS",
    "OTHER",
    "THROTTLE_BITS",
    "TIMEOUT_FLOOR_S",
    "XID_MEANINGS",
    "DcgmSource",
    "GpuProbe",
    "GpuReading",
    "GpuSource",
    "LinuxProcFs",
    "NvmlApi",
    "NvmlSampler",
    "NvmlSource",
    "ProcFs",
    "ProcMem",
    "ProcessMap",
    "Vanished",
    "VanishedCallback",
    "XidCallback",
    "dcgm_timeout_s",
    "make_gpu_source",
    "parse_dcgm",
]
