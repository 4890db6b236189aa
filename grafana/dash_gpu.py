"""The GPU dashboard (soakd-gpu): VRAM against the limit, per process, the card's health."""

from __future__ import annotations

from grafana.panels import (
    BOX,
    NVML,
    Dashboard,
    F,
    G,
    boxes_seen,
    per_box,
    q,
    stat,
    state_timeline,
    table,
    timeseries,
)


def gpu() -> Dashboard:
    d = Dashboard(
        "soakd-gpu",
        "soakd / GPU",
        "VRAM against the limit, per process, leak slope, and the card's health.",
    )
    d.row("Memory")
    d.add(
        timeseries(
            "VRAM used vs limit",
            [
                q(f"soakd_gpu_memory_used_bytes{{{G}}}", "{{node}} GPU {{gpu}} used"),
                q(f"soakd_gpu_memory_total_bytes{{{G}}}", "{{node}} GPU {{gpu}} total"),
                q(per_box("soakd_vram_limit_bytes"), "{{node}} limit"),
            ],
            "decbytes",
            limit_series="limit",
            desc="VramAboveLimit fires when the median of 10s stays above the limit for 5s, "
            "and stays until it has been below for a minute (docs/alerting.md: what the "
            "line means under vLLM's reservation).",
        ),
        12,
    )
    d.add(
        timeseries(
            "VRAM per process",
            [
                q(f"soakd_gpu_process_memory_bytes{{{G}}}", "{{node}} GPU {{gpu}} {{target}}"),
            ],
            "decbytes",
            stack=True,
            desc=NVML + "Per process, named by the soakd target it belongs to ('other' for "
            "the rest).",
        ),
        12,
    )
    d.add(
        stat(
            "Headroom to the limit",
            [
                q(
                    f"soakd_vram_limit_bytes{{{F}}} - on ({BOX}, job, instance) group_right "
                    f"soakd_gpu_memory_used_bytes{{{G}}}",
                    "{{node}} GPU {{gpu}}",
                ),
            ],
            "decbytes",
            thresholds=[(None, "red"), (0, "orange"), (200e6, "green")],
        ),
        6,
        5,
    )
    d.add(
        stat(
            "Peak VRAM this run",
            [
                q(f"soakd_gpu_memory_used_peak_bytes{{{G}}}", "{{node}} GPU {{gpu}}"),
            ],
            "decbytes",
        ),
        6,
        5,
    )
    d.add(
        stat(
            "Reserved by the driver",
            [
                q(f"soakd_gpu_memory_reserved_bytes{{{G}}}", "{{node}} GPU {{gpu}}"),
            ],
            "decbytes",
            desc=NVML + "Memory the driver keeps for itself (NVML's memory info v2).",
        ),
        6,
        5,
    )
    d.add(
        stat(
            "GPU source up",
            [q(f"soakd_gpu_probe_up{{{F}}}", "{{node}} {{source}}")],
            thresholds=[(None, "red"), (1, "green")],
            desc="0: soakd reads no GPU (no driver, or the DCGM source fails).",
        ),
        6,
        5,
    )
    d.add(
        timeseries(
            "VRAM leak slope (bytes per hour)",
            [
                q(f"soakd_gpu_memory_leak_slope_bytes_per_hour{{{G}}}", "{{node}} GPU {{gpu}}"),
                q(per_box("soakd_vram_leak_limit_bytes_per_hour"), "{{node}} limit"),
            ],
            "decbytes",
            min_=None,
            limit_series="limit",
            desc="Robust slope of VRAM used per GPU over soakd's leak window; VramLeak "
            "compares it with the limit once the window is 80 % full.",
        ),
        12,
    )
    d.add(
        timeseries(
            "VRAM leak slope per process (bytes per hour)",
            [
                q(
                    f"soakd_gpu_process_memory_leak_slope_bytes_per_hour{{{G}}}",
                    "{{node}} GPU {{gpu}} {{target}}",
                ),
            ],
            "decbytes",
            min_=None,
            desc=NVML + "The same slope for each target's GPU processes.",
        ),
        12,
    )
    d.row("Health")
    d.add(
        timeseries(
            "Temperature",
            [
                q(f"soakd_gpu_temperature_celsius{{{G}}}", "{{node}} GPU {{gpu}}"),
            ],
            "celsius",
            min_=None,
        ),
        8,
    )
    d.add(
        timeseries(
            "Power",
            [
                q(f"soakd_gpu_power_watts{{{G}}}", "{{node}} GPU {{gpu}} draw"),
                q(
                    f"rate(soakd_gpu_energy_joules_total{{{G}}}[$__rate_interval])",
                    "{{node}} GPU {{gpu}} from energy",
                ),
            ],
            "watt",
        ),
        8,
    )
    d.add(
        timeseries(
            "Utilization",
            [
                q(f"soakd_gpu_utilization_ratio{{{G}}}", "{{node}} GPU {{gpu}}"),
            ],
            "percentunit",
            max_=1,
        ),
        8,
    )
    d.add(
        timeseries(
            "Clocks",
            [
                q(f"soakd_gpu_sm_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}} SM"),
                q(f"soakd_gpu_memory_clock_hertz{{{G}}}", "{{node}} GPU {{gpu}} memory"),
            ],
            "hertz",
        ),
        8,
    )
    d.add(
        state_timeline(
            "Throttle reasons",
            [
                q(
                    f"max by ({BOX}, gpu, reason) (soakd_gpu_throttle_active{{{G}}})",
                    "{{node}} GPU {{gpu}} {{reason}}",
                ),
            ],
            desc=NVML + "Why the clocks are held back; GpuThrottling warns on the thermal "
            "and hardware reasons.",
            mapping={"0": ("no", "green"), "1": ("active", "orange")},
        ),
        16,
    )
    d.add(
        stat(
            "XID errors in range",
            [
                q(
                    f"sum by ({BOX}) (increase(soakd_gpu_xid_errors_total{{{G}}}[$__range]))"
                    f" or {boxes_seen()}",
                    "{{node}}",
                ),
            ],
            thresholds=[(None, "green"), (1, "red")],
        ),
        6,
        4,
    )
    d.add(
        table(
            "XID errors by code (this run)",
            [
                q(
                    f"sum by ({BOX}, gpu, xid) (soakd_gpu_xid_errors_total{{{G}}})",
                    instant=True,
                    fmt="table",
                ),
            ],
            rename={"Value": "errors"},
        ),
        6,
        4,
    )
    d.add(
        table(
            "GPUs",
            [q(f"soakd_gpu_info{{{G}}}", instant=True, fmt="table")],
            rename={"Value": "present"},
        ),
        12,
        4,
    )
    return d
