"""The live view on real terminal widths (80 and 120 columns, as tmux opens them): it fits,
says where the plan is and how long is left, marks what is past the SLO, names each
target's most frequent error, says when it drains and that a second Ctrl-C stops at once,
and says when soakd itself is the bottleneck."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

from soakd.run.live import live_panel
from soakd.run.status import GpuNow, Status
from soakd.workers.pool import WorkerNow
from soakd.workload.failing import FailingNow
from soakd.workload.sizing import PromptRow, PromptTokens


def status(**extra: Any) -> Status:
    row = {
        "rps": 12.34,
        "attempt_rps": 12.41,
        "output_tps": 1532.2,
        "ok": 123456,
        "errors": 3,
        "error_ratio": 0.004,
        "top_error": "http_5xx",
        "goodput": 0.9912,
        "shed": 0,
        "ttft_p50_ms": 45.2,
        "ttft_p99_ms": 9342.0,
        "e2e_p50_ms": 1234.0,
        "e2e_p99_ms": 14321.0,
        "itl_p50_ms": 0.8,
        "lag_p99_ms": 0.4,
    }
    fields: dict[str, Any] = dict(
        run_id="edge-72h-20261201-161200-ab12",
        version="test",
        node="edge-7",
        site=None,
        phase="steady",
        phase_index=1,
        phases=3,
        elapsed_s=125.0,
        remaining_s=3475.0,
        plan_scale=1.0,
        stopping=False,
        in_flight={"edge-vllm-4gb": 8, "cloud-gpt": 3},
        workers=None,
        missed={},
        failing={},
        no_reuse={},
        vram=(),
        lag_limit_s=0.1,
        drain_timeout_s=30.0,
        slo={},
        metrics_url="http://127.0.0.1:9464",
        targets={"edge-vllm-4gb": dict(row), "cloud-gpt": dict(row)},
        prompt_tokens=None,
    )
    return Status(**(fields | extra))


def screen(st: Status, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(live_panel(st, width))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 120, 160])
def test_fits_the_terminal_without_cutting_names_or_numbers(width: int) -> None:
    text = screen(status(), width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text  # no column squeezed to "tar…" / "14.…"
    for must in ("edge-vllm-4gb", "cloud-gpt", "ok/s", "errors", "err %", "goodput"):
        assert must in text
    for must in ("TTFT p99", "E2E p99", "steady 2/3", "57m55s left"):
        assert must in text
    assert "9.34 s" in text  # one unit rule: s above a second
    assert "14.32 s" in text


def test_wider_terminals_show_more_columns() -> None:
    assert "tok/s" not in screen(status(), 80)
    at_120 = screen(status(), 120)
    for column in ("tok/s", "not sent", "sent/s", "lag p99"):
        assert column in at_120
    assert "ITL p50" not in at_120
    assert "ITL p50" in screen(status(), 200)


@pytest.mark.parametrize("width", [80, 120])
def test_values_past_the_slo_are_marked(width: int) -> None:
    """Each target against its own SLO: edge's TTFT and error ratio are past its limits,
    cloud's limits are wider; a value within its limit and a target without one are not
    marked."""
    slo = {
        "edge-vllm-4gb": {"ttft_p99": 2.0, "e2e_p99": 30.0, "error_ratio": 0.003},
        "cloud-gpt": {"ttft_p99": 10.0, "error_ratio": 0.01},
    }
    text = screen(status(slo=slo), width)
    edge = next(line for line in text.splitlines() if "edge-vllm-4gb" in line)
    cloud = next(line for line in text.splitlines() if "cloud-gpt" in line)
    assert "9.34 s!" in edge
    assert "0.4 %!" in edge
    assert "14.32 s!" not in edge  # within its 30 s
    assert "!" not in cloud
    assert "! past the SLO" in text
    assert "!" not in screen(status(), width).replace("! past the SLO", "")


def test_the_most_frequent_error_of_each_target_is_named() -> None:
    st = status()
    st.targets["cloud-gpt"] |= {"errors": 812, "top_error": "http_auth", "error_ratio": 1.0}
    st.targets["edge-vllm-4gb"] |= {"errors": 0, "top_error": None}
    text = screen(st, 80)
    assert "cloud-gpt: http_auth (401/403: the API key) most often" in text
    assert "edge-vllm-4gb:" not in text
    assert "100 %" in text


def test_says_it_is_draining_and_that_a_second_ctrl_c_stops_at_once() -> None:
    assert "Ctrl-C" not in screen(status(), 80)
    text = screen(status(stopping=True, phase=None), 80)
    assert "draining" in text
    assert "phase -" not in text
    assert "stopping: finishing what is in flight (up to 30s); Ctrl-C again stops at once" in text
    assert "left" not in text.splitlines()[0]  # stopping: no time left to count down


def test_a_client_behind_its_plan_is_called_out() -> None:
    st = status()
    assert "CLIENT-LIMITED" not in screen(st, 80)
    st.targets["cloud-gpt"]["lag_p99_ms"] = 342.0  # past the 100 ms limit
    assert "CLIENT-LIMITED cloud-gpt" in screen(st, 80)
    st = status(missed={"edge-vllm-4gb": {"late": 12}})
    text = screen(st, 80)
    assert "CLIENT-LIMITED edge-vllm-4gb" in text
    row = next(line for line in text.splitlines() if line.startswith("│ edge-vllm-4gb"))
    assert "12" in row  # its sends not made are on its row


def test_the_edge_cards_vram_against_its_line() -> None:
    gpu = GpuNow(
        gpu="0", target="edge-vllm-4gb", used_bytes=3.95e9, peak_bytes=3.97e9, limit_bytes=3.9e9
    )
    text = screen(status(vram=(gpu,)), 80)
    assert "GPU 0 (edge-vllm-4gb): VRAM 3.95 GB, peak 3.97 GB, line 3.90 GB ABOVE" in text
    below = (replace(gpu, used_bytes=3.5e9),)
    assert "ABOVE" not in screen(status(vram=below), 80)
    assert "line 3.90 GB peak over" in screen(status(vram=below), 80)


def test_sender_workers_are_counted_and_a_down_one_is_said() -> None:
    up = [WorkerNow(worker=i, pid=1, up=True, in_flight=2) for i in range(3)]
    assert "workers" not in screen(status(), 80)  # one process: nothing to say
    assert "workers 3/3 up" in screen(status(workers=tuple(up)), 80)
    down = (up[0], replace(up[1], up=False))
    assert "workers 1/2 up" in screen(status(workers=down), 80)


@pytest.mark.parametrize("width", [80, 120])
def test_a_paused_failing_target_is_named_with_its_cause(width: int) -> None:
    assert "PAUSED" not in screen(status(), width)
    paused = FailingNow(cause="http_auth", detail="http 401", next_probe_s=12.4)
    text = " ".join(screen(status(failing={"cloud-gpt": paused}), width).split())  # rich wraps
    assert (
        "PAUSED cloud-gpt: every request failed: http_auth (http 401); next request in 12 s" in text
    )
    probing = {"cloud-gpt": replace(paused, next_probe_s=0)}
    assert "one request out" in screen(status(failing=probing), width)


def test_prompt_tokens_planned_against_served() -> None:
    """One line: each target's planned and served prompt tokens (its answers' usage, else
    its own count at start), the one more than 10 % off marked."""
    prompts = PromptTokens(
        calibration="edge-vllm-4gb's /tokenize: 1.945 tokens a word, word by word",
        checking=False,
        planned=300.0,
        targets={
            "edge-vllm-4gb": PromptRow(requests=40, planned=300.0, served=299.1, at_start=298.3),
            "cloud-gpt": PromptRow(requests=0, planned=None, served=None, at_start=146.0),
        },
    )
    text = screen(status(prompt_tokens=prompts), 100)
    line = next(x for x in text.splitlines() if x.startswith("prompt tokens"))
    assert "edge-vllm-4gb 300 -> 299 cloud-gpt" in line  # within 10 %: not marked
    assert "cloud-gpt 300 -> 146 at start (-51.3 %)" in line
    assert "prompt tokens" not in screen(status(), 100)  # nothing measured: no line
