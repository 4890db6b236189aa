"""One GPU-source factory for the probes and the gateway: which source, which DCGM URL, and
the read timeout (the interval, within 1-5 s)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from soakd.config import GpuConfig
from soakd.probes.gpu import DcgmSource, NvmlSampler, NvmlSource, make_gpu_source


def gpu(**kw: object) -> GpuConfig:
    return GpuConfig.model_validate(kw)


def test_none_is_no_source() -> None:
    assert make_gpu_source(gpu(source="none"), dcgm_base="http://127.0.0.1:1") is None


@pytest.mark.parametrize(("source", "required"), [("auto", False), ("nvml", True)])
def test_auto_and_nvml_read_nvml_in_the_sampler(source: str, required: bool) -> None:
    s = make_gpu_source(gpu(source=source))
    assert isinstance(s, NvmlSampler)  # soakd/gpu/sampler.py: not in this process
    assert s.required is required  # asked for NVML: an absent GPU is a warning


def test_a_fake_nvml_is_read_in_this_process() -> None:
    s = make_gpu_source(gpu(source="auto"), nvml=object())  # type: ignore[arg-type]
    assert isinstance(s, NvmlSource)


def test_dcgm_reads_its_url_or_the_base_servers_metrics() -> None:
    s = make_gpu_source(gpu(source="dcgm"), dcgm_base="http://127.0.0.1:8000/v1")
    assert isinstance(s, DcgmSource)
    assert s.ep.url == "http://127.0.0.1:8000/metrics"
    url = "http://dcgm:9400/metrics"
    s = make_gpu_source(gpu(source="dcgm", dcgm_url=url), dcgm_base="http://127.0.0.1:8000")
    assert isinstance(s, DcgmSource)
    assert s.ep.url == url


def test_dcgm_with_nothing_to_read_is_one_error_line() -> None:
    with capture_logs() as logs:
        assert make_gpu_source(gpu(source="dcgm")) is None
    assert [e["event"] for e in logs] == ["gpu_probe_absent"]
    assert logs[0]["log_level"] == "error"


@pytest.mark.parametrize(("interval", "timeout"), [("250ms", 1.0), ("2s", 2.0), ("30s", 5.0)])
def test_dcgm_read_timeout_is_the_interval_within_one_to_five_seconds(
    interval: str, timeout: float
) -> None:
    s = make_gpu_source(gpu(source="dcgm", interval=interval), dcgm_base="http://127.0.0.1:1")
    assert isinstance(s, DcgmSource)
    assert s.timeout_s == timeout
