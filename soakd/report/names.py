"""Report room, names: every metric name the report reads from the journal's samples.

The report's one door to ``soakd.metrics.names``: the rest of the package says
``names.GPU_ENERGY``. ``SAMPLE_NAMES`` lists them all (re-exported as
``soakd.report.SAMPLE_NAMES``; ``tests/unit/test_metric_names.py`` checks each is registered).
"""

from __future__ import annotations

from soakd.metrics import names as mn

GPU_MEMORY_USED = mn.GPU_MEMORY_USED_BYTES
GPU_PROCESS_MEMORY = mn.GPU_PROCESS_MEMORY_BYTES
GPU_ENERGY = mn.GPU_ENERGY_JOULES_TOTAL
GPU_POWER = mn.GPU_POWER_WATTS
TARGET_RESTARTS = mn.TARGET_RESTARTS_TOTAL
TARGET_OOM_EVENTS = mn.TARGET_OOM_EVENTS_TOTAL
# the guard gateways soakd ran (soakd/probes/gateways.py journals them on change)
GATEWAY_BREAKER_TRANSITIONS = mn.GATEWAY_BREAKER_TRANSITIONS_TOTAL
GATEWAY_CONCURRENCY_LIMIT = mn.GATEWAY_CONCURRENCY_LIMIT
GATEWAY_REJECTIONS = mn.GATEWAY_REJECTIONS_TOTAL
# the server's prefix cache, in prompt tokens (soakd/probes/server.py)
SERVER_PREFIX_CACHE_QUERIES = mn.SERVER_PREFIX_CACHE_QUERIES_TOTAL
SERVER_PREFIX_CACHE_HITS = mn.SERVER_PREFIX_CACHE_HITS_TOTAL

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
    SERVER_PREFIX_CACHE_QUERIES,
    SERVER_PREFIX_CACHE_HITS,
)
"""Every sample series the report reads from the journal."""
