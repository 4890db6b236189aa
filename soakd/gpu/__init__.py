"""GPU room: GPU readings (pure) and the NVML driver, importable without soakd's probes,
config or logging, so the process that samples NVML stays small.

- ``readings``: what a GPU source reads (``GpuReading``, in base units), pure;
- ``procfs``: which target a GPU process belongs to (``/proc``);
- ``nvml``: ``NvmlSource``, the driver's calls, in threads of the process that runs it;
- ``sampler``: ``python -m soakd.gpu.sampler``, the process soakd reads NVML through
  (soakd/probes/gpu/nvml.py is its other end): NVML's threads, its GIL holds and its
  ~28 MB are not in the process that times tokens.

``soakd/probes/gpu`` turns readings into gauges and re-exports these names.
"""
