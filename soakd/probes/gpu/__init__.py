"""Probes room, GPU: a GpuSource (NVML, DCGM) sampled into soakd's GPU gauges.

One module per concern: ``model`` (readings, the ``GpuSource`` seam, XID and throttle
catalogs; pure), ``nvml`` (the driver, in threads), ``procfs`` (which target a GPU
process belongs to), ``dcgm`` (a dcgm-exporter's page), ``probe`` (readings -> gauges and
samples, on the loop) and ``sources`` (the one factory, shared with the gateway). Every name
other modules import is re-exported here.
"""

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
from soakd.probes.gpu.nvml import NvmlApi, NvmlSource
from soakd.probes.gpu.probe import GpuProbe, VanishedCallback
from soakd.probes.gpu.procfs import LinuxProcFs, ProcessMap, ProcFs
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
