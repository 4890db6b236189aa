"""A stand-in ``pynvml`` for the NVML sampler process (``python -m soakd.gpu.sampler``): a
test puts this directory first on the sampler's PYTHONPATH. One fake H200 (or none with
``FAKE_NVML_GPUS=0``); ``FAKE_NVML_XID`` (``gpu:code``) is delivered once, after open;
``FAKE_NVML_USED`` sets the memory used (bytes); ``FAKE_NVML_PROC`` (``pid:bytes``) lists
a GPU process."""

from __future__ import annotations

import os
from typing import Any

from tests.fake_nvml import FakeGpu, FakeNvml

_gpus = int(os.environ.get("FAKE_NVML_GPUS", "1"))
_fake = FakeNvml([FakeGpu(i, uuid=f"GPU-{i:04d}") for i in range(_gpus)])
if "FAKE_NVML_USED" in os.environ:
    for _g in _fake.gpus:
        _g.used = int(os.environ["FAKE_NVML_USED"])
if "FAKE_NVML_PROC" in os.environ:
    _pid, _used = os.environ["FAKE_NVML_PROC"].split(":")
    _fake.gpus[0].procs = [(int(_pid), int(_used))]
if "FAKE_NVML_XID" in os.environ:
    _gpu, _code = os.environ["FAKE_NVML_XID"].split(":")
    _fake.xids.put((int(_gpu), int(_code)))

NVMLError = _fake.NVMLError
nvmlMemory_v2 = _fake.nvmlMemory_v2


def __getattr__(name: str) -> Any:
    if name.startswith("nvml"):
        return getattr(_fake, name)
    raise AttributeError(name)
