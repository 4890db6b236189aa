"""Report room, names: every metric name the report reads from the journal's samples.

The one place the report spells a metric name, so that moving to ``soakd.metrics``'
constants is a change to this file alone. ``SAMPLE_NAMES`` lists them all (re-exported
as ``soakd.report.SAMPLE_NAMES``, for a test that checks each one is registered).
"""

from __future__ import annotations

GPU_MEMORY_USED = "soakd_gpu_memory_used_bytes"
GPU_PROCESS_MEMORY = "soakd_gpu_process_memory_bytes"
GPU_ENERGY = "soakd_gpu_energy_joules_total"
GPU_POWER = "soakd_gpu_power_watts"
TARGET_RESTARTS = "soakd_target_restarts_total"
TARGET_OOM_EVENTS = "soakd_target_oom_events_total"
# the guard gateways soakd ran (soakd/probes/gateways.py journals them on change)
GATEWAY_BREAKER_TRANSITIONS = "soakd_gateway_breaker_transitions_total"
GATEWAY_CONCURRENCY_LIMIT = "soakd_gateway_concurrency_limit"
GATEWAY_REJECTIONS = "soakd_gateway_rejections_total"

GPU_NAMES = (GPU_MEMORY_USED, GPU_ENERGY, GPU_POWER, GPU_PROCESS_MEMORY)
"""The series a GPU of the report's GPU table is found in."""

SAMPLE_NAMES = (
    GPU_MEMORY_USED,
    GPU_PROCESS_MEMORY,
    GPU_ENERGY,
    GPU_POWER,
    TARGET_RESTARTS,
    TARGET_OOM_EVENTS,
    GATEWAY_BREAKER_TRANSITIONS,
    GATEWAY_CONCURRENCY_LIMIT,
    GATEWAY_REJECTIONS,
)
"""Every sample series the report reads from the journal."""
