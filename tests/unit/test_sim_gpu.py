"""The simulated card (VRAM, power, heat) and its dcgm-exporter page, in virtual time."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from soakd.profiles import MIB, get_profile
from soakd.sim.exposition import CardIdentity, render_dcgm
from soakd.sim.gpu import GpuModel

EDGE = get_profile("edge-4gb")


def test_vram_is_flat_by_design_and_grows_only_a_little_with_the_batch() -> None:
    gpu = GpuModel(EDGE, now=0.0)
    idle = gpu.sample(0.0, running=0)
    assert idle.fb_used_mib == pytest.approx(3686.4)
    assert idle.fb_used_mib + idle.fb_free_mib == pytest.approx(4096.0)
    full = gpu.sample(72 * 3600.0, running=16)  # three days later, full batch
    assert full.fb_used_mib - idle.fb_used_mib == pytest.approx(16 * 1.5)
    assert not gpu.vram_exhausted(72 * 3600.0, 16)


def test_a_leak_grows_used_memory_until_it_runs_out() -> None:
    gpu = GpuModel(dataclasses.replace(EDGE, vram_leak_bytes_per_hour=32 * MIB), now=100.0)
    one_hour = gpu.sample(3700.0, running=0)
    assert one_hour.fb_used_mib == pytest.approx(3686.4 + 32.0)
    assert not gpu.vram_exhausted(100.0 + 11 * 3600, 1)
    assert gpu.vram_exhausted(100.0 + 13 * 3600, 1)
    late = gpu.sample(100.0 + 20 * 3600, running=1)
    assert late.fb_used_mib == 4096.0  # reported used never exceeds the card
    assert late.fb_free_mib == 0.0


def test_power_temperature_and_clock_follow_load() -> None:
    gpu = GpuModel(EDGE, now=0.0)
    idle = gpu.sample(10.0, running=0)
    assert idle.power_w == pytest.approx(EDGE.power_idle_w)
    assert idle.gpu_util_pct == 0.0
    assert idle.sm_clock_mhz == EDGE.sm_clock_idle_mhz
    gpu.set_activity(10.0, running=16, busy=True)
    hot = gpu.sample(310.0, running=16)  # five minutes at full batch
    assert hot.gpu_util_pct == pytest.approx(100.0)
    assert hot.power_w == pytest.approx(EDGE.power_max_w)
    assert hot.gpu_temp_c == pytest.approx(EDGE.temp_max_c, abs=0.5)
    assert hot.sm_clock_mhz == EDGE.sm_clock_max_mhz
    # energy: 10 s idle + 300 s at full power, in mJ
    assert hot.total_energy_mj == pytest.approx(
        (10 * EDGE.power_idle_w + 300 * EDGE.power_max_w) * 1000
    )
    gpu.set_activity(310.0, running=0, busy=False)
    cooled = gpu.sample(610.0, running=0)
    assert cooled.gpu_temp_c < hot.gpu_temp_c
    assert cooled.total_energy_mj > hot.total_energy_mj


def test_one_sequence_draws_less_than_a_full_batch() -> None:
    one, full = GpuModel(EDGE, now=0.0), GpuModel(EDGE, now=0.0)
    one.set_activity(0.0, running=1, busy=True)
    full.set_activity(0.0, running=16, busy=True)
    assert one.sample(60.0, 1).power_w < full.sample(60.0, 16).power_w


def test_dcgm_page_parses_with_the_exporters_names_and_labels() -> None:
    gpu = GpuModel(EDGE, now=0.0)
    card = CardIdentity.for_profile(EDGE)
    text = render_dcgm(gpu.sample(5.0, running=0), card)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
    }
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    used = families["DCGM_FI_DEV_FB_USED"].samples[0]
    assert used.value == 3686
    assert used.labels == {
        "gpu": "0",
        "UUID": card.uuid,
        "pci_bus_id": "00000000:01:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA GeForce RTX 3050 Laptop GPU",
        "Hostname": card.hostname,
    }
    # As dcgm-exporter writes it: a counter without a _total suffix.
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert card.uuid.startswith("GPU-")
    assert CardIdentity.for_profile(EDGE) == card  # stable across restarts
