"""examples/edge-72h.yaml rehearsed: two simulators, a gateway in front of each, the three
stages switching the gateways' features phase by phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soakd.cli import main
from soakd.config import load_config
from soakd.journal import JournalReader, records
from soakd.run.app import RunOptions, Soak

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "edge-72h.yaml"


def test_check_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLE), "--rehearse", "3m"]) == 0
    out = capsys.readouterr().out
    assert "plain" in out
    assert "breaker" in out
    assert "adaptive" in out


async def test_rehearse_the_three_stages(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLE, {"SOAKD__WORKLOAD__MAX_TOKENS": "24"})  # short drains
    soak = Soak(
        cfg,
        RunOptions(
            run_dir=tmp_path / "run", rehearse_s=9.0, metrics_addr="127.0.0.1:0", console_logs=False
        ),
    )
    result = await soak.run()
    assert result.completed
    for name in ("edge", "cloud"):
        assert result.summary[name]["requests"] >= 5, result.summary[name]
    assert result.summary["cloud"]["errors"] == 0, result.summary["cloud"]
    # the edge server's VRAM passes 3.9 GB at 4 running: once the breaker is on (from 3 s)
    # and the 5 s hold is over, the guard's sheds may show; nothing else may
    assert set(result.summary["edge"]["errors_by_kind"]) <= {
        "shed_vram_breaker",
        "shed_queue_full",
        "shed_queue_timeout",
    }, result.summary

    with JournalReader(tmp_path / "run") as reader:
        modes = [e for e in reader.events() if isinstance(e.event, records.GatewayModes)]
    assert len(modes) == 6  # two gateways, three phases
    # each gateway applied every switch, ending with the adaptive stage's set
    for target, final in (
        ("edge", {"vram_breaker": True, "error_breaker": True, "adaptive": True}),
        ("cloud", {"vram_breaker": False, "error_breaker": True, "adaptive": True}),
    ):
        lines = (tmp_path / "run" / f"gateway-{target}.log").read_text().splitlines()
        changed = [json.loads(ln) for ln in lines if '"gateway_modes_changed"' in ln]
        assert len(changed) == 3
        assert {k: changed[-1][k] for k in final} == final

    # the report reads the stages: per phase and gateway, the features it had on, what its
    # breakers and its guard did (from the journaled gateway series and soakd's outcomes)
    from soakd.report import build_report, render_markdown

    rep = build_report(tmp_path / "run")
    rows = {(g.phase, g.target): g for g in rep.guard}
    assert set(rows) == {
        (p, t) for p in ("plain", "breaker", "adaptive") for t in ("edge", "cloud")
    }
    assert rows[("plain", "edge")].modes == "none"
    assert "vram_breaker" in rows[("breaker", "edge")].modes
    assert rows[("adaptive", "edge")].modes == "vram_breaker, error_breaker, adaptive"
    assert rows[("adaptive", "cloud")].limit_min is not None  # the limit was journaled
    # the gateway's own count (journaled at its scrapes, so it lags) never exceeds the
    # sheds soakd counted, and every opening of a breaker shows
    shed = sum(sum(g.shed.values()) for g in rep.guard)
    rejected = sum(sum(g.rejections.values()) for g in rep.guard)
    assert rejected <= shed, (rejected, shed)
    if shed:
        assert sum(sum(g.breaker_openings.values()) for g in rep.guard) >= 1
    assert "The guard, phase by phase" in render_markdown(rep)
