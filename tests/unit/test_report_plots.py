"""The plots and the units they share with the tables: phase boundaries and SLO lines drawn,
nothing past the plan time the run reached, one byte unit (decimal GB) in the verdict, the
tables and the plots, regressions as percentages against the allowed one."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from soakd.measure.verdicts import Delta
from soakd.model import Sample
from soakd.report import build_report, render_html, render_markdown
from soakd.report.table import fmt_allowed, fmt_bytes, fmt_change
from tests.journal_fixtures import HOUR, FakeClock, config, open_test_journal, outcome

PEAK = 3.62 * 2**30  # 3.89 GB: the example, once read as 3.62 GiB


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hour's plan in two phases with an E2E and TTFT SLO (beta's own TTFT limit) and a
    VRAM line; the drain's last answers (slow: 50 s each) and two minutes of probe readings
    land after the plan's end."""
    d = tmp_path_factory.mktemp("plots")
    cfg = config(
        slo={"e2e_p99": "30s", "ttft_p99": "2s", "vram_peak": "3.9GB"},
        targets=[
            {"name": "alpha", "base_url": "http://127.0.0.1:1"},
            {"name": "beta", "base_url": "http://127.0.0.1:2", "slo": {"ttft_p99": "1s"}},
        ],
    )
    clock = FakeClock(offset_s=HOUR + 120)
    j = open_test_journal(d, cfg, clock)
    rng = random.Random(9)
    for i in range(240):
        end = 1 + i * HOUR / 240
        for target in ("alpha", "beta"):
            j.record(outcome(rng, clock, target, "warm" if end < HOUR / 2 else "hot", i, end))
    for i in range(5):  # answered during the drain, after the plan's end
        j.record(outcome(rng, clock, "alpha", "hot", 1000 + i, HOUR + 30 + i, slow=200.0))
    base_wall = time.time() - (time.perf_counter_ns() - clock.origin_ns) / 1e9
    for t in range(0, round(HOUR) + 120, 60):
        used = PEAK if t == 1800 else 3.0e9
        used = 3.5e9 if t > HOUR else used
        gpu = (("gpu", "0"),)
        j.sample(Sample(base_wall + t + 0.5, "soakd_gpu_memory_used_bytes", used, gpu))
        j.sample(
            Sample(
                base_wall + t + 0.5,
                "soakd_gpu_process_memory_bytes",
                used,
                (*gpu, ("target", "alpha")),
            )
        )
    j.close(completed=True)
    return d


def test_nothing_is_plotted_past_the_plans_end(run_dir: Path) -> None:
    rep = build_report(run_dir)
    assert rep.active_s == HOUR
    for key, lines in rep.plots.items():
        for s in lines:
            xs = [x for x, y in s.points if y is not None]
            assert max(xs) <= 1.0, (key, s.label)
    e2e = [y for s in rep.plots["latency"] for _, y in s.points if y is not None]
    assert max(e2e) < 20_000  # ms: the drain's 50 s answers are not drawn


def test_phase_boundaries_and_slo_lines(run_dir: Path) -> None:
    rep = build_report(run_dir)
    assert rep.plot_phases == [(0.0, "warm"), (0.5, "hot")]
    assert rep.plot_limits["latency"] == [("SLO e2e_p99", 30_000.0)]
    assert rep.plot_limits["ttft"] == [
        ("SLO ttft_p99 alpha", 2000.0),
        ("SLO ttft_p99 beta", 1000.0),
    ]
    [(label, gb)] = rep.plot_limits["vram"]
    assert (label, gb) == ("SLO vram_peak", pytest.approx(3.9))  # in the plot's GB
    page = render_html(rep)
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    by_title = {re.search(r'aria-label="([^"]+)"', s).group(1): s for s in svgs}  # type: ignore[union-attr]
    latency = by_title["End-to-end latency"]
    # the boundary of phase hot, in the middle of the plot's 60 minutes, named
    [phase_line] = re.findall(r'<line class="phase" x1="([\d.]+)"', latency)
    assert float(phase_line) == pytest.approx(60 + (520 - 60 - 24) / 2, abs=0.2)
    assert ">hot</text>" in latency
    assert ">warm</text>" in latency
    assert latency.count('class="slo"') == 1
    assert ">SLO e2e_p99</text>" in latency
    assert by_title["TTFT and ITL, p99"].count('class="slo"') == 2
    assert ">SLO vram_peak</text>" in by_title["GPU memory"]
    assert "(GB)" in page
    assert "GiB" not in page


def test_one_byte_unit_in_the_verdict_tables_and_plots(run_dir: Path) -> None:
    rep = build_report(run_dir)
    assert rep.overall["alpha"].vram_peak_bytes == pytest.approx(PEAK)
    md = render_markdown(rep)
    assert "| alpha | vram_peak | 3.89 GB | 3.90 GB | pass |" in md
    assert re.search(r"\| VRAM peak \| 3\.89 GB \|", md)
    assert "| 0 | 3.89 GB |" in md  # the GPU table
    assert "GiB" not in md
    assert fmt_bytes(3.62 * 2**30) == "3.89 GB"
    assert fmt_bytes(5e6, signed=True) == "+5.00 MB"


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (
            Delta("ttft_p99", 0.1, 2.185, 2.085, 20.85, "relative", 0.1, 20.85, False),
            "+2,085 % (allowed +10 %)",
        ),
        (
            Delta("output_tps", 50.0, 46.0, -4.0, -0.08, "relative", 0.05, 0.08, False),
            "-8.0 % (allowed -5 %)",
        ),
        (
            Delta("error_ratio", 0.001, 0.003, 0.002, 2.0, "absolute", 0.001, 0.002, False),
            "+0.2 points (allowed +0.1 points)",
        ),
        (
            Delta("e2e_p50", 1.0, 1.3, 0.3, 0.3, "absolute", 0.2, 0.3, False),
            "+300 ms (allowed +200 ms)",
        ),
    ],
)
def test_a_regression_reads_as_a_change_against_the_allowed_one(delta: Delta, text: str) -> None:
    assert f"{fmt_change(delta)} (allowed {fmt_allowed(delta)})" == text
