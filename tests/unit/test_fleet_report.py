"""`soakd report --fleet`: several boxes' runs of one plan side by side, the worst first,
on synthetic journals whose verdicts the test decides (one box passes, one fails one
target, one fails both); runs of another plan are refused with one line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.journal import config_doc
from soakd.model import ErrorKind
from soakd.report import build_report, render_markdown
from soakd.report.fleet import PlanMismatch, build_fleet
from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome

HOUR = 3600.0
SLO = {"error_ratio": 0.05, "ttft_p99": "1s"}
# box -> target -> share of its requests answered 5xx (the SLO allows 5 %)
SHARES = {
    "edge-a": {"alpha": 0.0, "beta": 0.0},
    "edge-b": {"alpha": 0.3, "beta": 0.0},
    "edge-c": {"alpha": 0.1, "beta": 0.2},
}


def write_box(run_dir: Path, node: str, site: str, shares: dict[str, float], **cfg: Any) -> Path:
    """One hour of the default plan (two 30-minute phases, targets alpha and beta) as box
    ``node`` at ``site`` ran it; a request every 20 s per target, the given share 5xx."""
    clock = FakeClock(offset_s=HOUR + 1)
    cfg = {"run": {"name": "syn", "node": node, "site": site}, "slo": SLO, **cfg}
    j = open_test_journal(run_dir, config(**cfg), clock)
    rng = random.Random(node)
    for target, share in shares.items():
        for seq, end in enumerate(range(10, 3600, 20)):
            error = ErrorKind.HTTP_5XX if rng.random() < share else None
            phase = "warm" if end < 1800 else "hot"
            j.record(outcome(rng, clock, target, phase, seq, float(end), error=error))
    j.close(completed=True)
    return run_dir


@pytest.fixture(scope="module")
def fleet_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("fleet")
    return [
        write_box(root / node, node, f"lab-{node[-1]}", shares) for node, shares in SHARES.items()
    ]


def test_boxes_side_by_side_worst_first(fleet_dirs: list[Path]) -> None:
    fr = build_fleet(fleet_dirs)
    # c fails both targets, b one, a none
    assert [b.node for b in fr.boxes] == ["edge-c", "edge-b", "edge-a"]
    assert [b.site for b in fr.boxes] == ["lab-c", "lab-b", "lab-a"]
    assert [b.passed for b in fr.boxes] == [False, False, True]
    assert fr.passed is False
    for box in fr.boxes:  # each box's figures are its own report's
        rep = build_report(Path(box.run_dir), slowest_n=0)
        assert rep.tested is not None
        assert (rep.tested.node, rep.tested.site) == (box.node, box.site)
        assert box.downtime_s == rep.downtime_s
        for row in box.targets:
            mine = rep.overall[row.target]
            assert row.passed == rep.verdicts[row.target].passed
            assert row.goodput == mine.goodput
            assert row.error_ratio == mine.error_ratio
            assert row.e2e_p99_ms == mine.latency_ms["e2e"]["p99"]
            assert row.ttft_p99_ms == mine.latency_ms["ttft"]["p99"]
            assert row.oom_responses == mine.oom_responses
            failing = SHARES[box.node][row.target] > 0
            assert row.passed is not failing
            assert bool(row.failed) is failing
            if failing:
                assert row.failed[0].startswith("error_ratio ")


def test_markdown_and_json(fleet_dirs: list[Path]) -> None:
    from soakd.report.fleet import render_fleet_json, render_fleet_markdown

    fr = build_fleet(fleet_dirs)
    text = render_fleet_markdown(fr)
    assert "3 boxes, one plan: targets alpha, beta; phases warm 30m00s, hot 30m00s" in text
    assert "verdict: 2 of 3 judged FAIL" in text
    table = [line for line in text.splitlines() if line.startswith("| edge-")]
    assert [line.split(" | ")[0] for line in table] == ["| edge-c"] * 2 + ["| edge-b"] * 2 + [
        "| edge-a"
    ] * 2
    assert "| edge-b | lab-b | alpha | FAIL |" in text
    assert "| edge-a | lab-a | alpha | pass |" in text
    doc = json.loads(render_fleet_json(fr))
    assert [b["node"] for b in doc["boxes"]] == ["edge-c", "edge-b", "edge-a"]
    assert doc["passed"] is False


def test_cli_fleet_check_and_glob(
    fleet_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *map(str, fleet_dirs), "--fleet", "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "verdict: 2 of 3 judged FAIL"
    assert out[1].startswith("edge-c (lab-c): FAIL: alpha: error_ratio ")
    assert "; beta: error_ratio " in out[1]
    assert out[2].startswith("edge-b (lab-b): FAIL: alpha: error_ratio ")
    assert len(out) == 3
    # a quoted glob, written to a file
    pattern = str(fleet_dirs[0].parent / "edge-*")
    report = tmp_path / "fleet.html"
    assert main(["report", pattern, "--fleet", "--format", "html", "-o", str(report)]) == 0
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.index(">edge-c<") < html.index(">edge-b<") < html.index(">edge-a<")
    # only the passing box, twice over (a copy of its run on another box): exit 0
    twin = write_box(tmp_path / "edge-d", "edge-d", "lab-a", SHARES["edge-a"])
    assert main(["report", str(fleet_dirs[0]), str(twin), "--fleet", "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "verdict: all pass"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (
            {
                "phases": [
                    {
                        "name": "warm",
                        "duration": "20m",
                        "load": {"mode": "closed", "concurrency": 2},
                    },
                    {"name": "hot", "duration": "30m", "load": {"mode": "poisson", "rate": 5}},
                ]
            },
            "phases[warm].duration_s: 1200.0 here, 1800.0 there",
        ),
        ({"workload": {"max_tokens": 99}}, "workload.max_tokens: 99 here, 512 there"),
        (
            {"slo": {"error_ratio": 0.01, "ttft_p99": "1s"}},
            "slo.error_ratio: 0.01 here, 0.05 there",
        ),
    ],
)
def test_runs_of_another_plan_are_refused(
    fleet_dirs: list[Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    where: str,
) -> None:
    other = write_box(tmp_path / "other", "edge-x", "lab-x", SHARES["edge-a"], **change)
    with pytest.raises(PlanMismatch, match="a fleet report compares one plan"):
        build_fleet([fleet_dirs[0], other])
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(fleet_dirs[0]), str(other), "--fleet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"soakd: error: {other}: not the plan of {fleet_dirs[0]} (")
    assert where in err


def test_what_may_differ_between_boxes(fleet_dirs: list[Path], tmp_path: Path) -> None:
    """Addresses (and node, site) differ from box to box; an SLO given with --config
    judges every run alike, so their own SLOs need not agree then."""
    other = write_box(
        tmp_path / "moved",
        "edge-y",
        "lab-y",
        SHARES["edge-a"],
        targets=[
            {"name": "alpha", "base_url": "http://10.0.0.9:1"},
            {"name": "beta", "base_url": "http://10.0.0.9:2"},
        ],
        slo={"error_ratio": 0.01},
    )
    with pytest.raises(PlanMismatch):
        build_fleet([fleet_dirs[0], other])
    fr = build_fleet([fleet_dirs[0], other], judge_by=config_doc(config(slo=SLO)))
    assert {b.node for b in fr.boxes} == {"edge-a", "edge-y"}
    assert fr.passed is True  # both answered every request, judged by the same SLO


def test_usage_errors_are_one_line(
    fleet_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, says in (
        ([str(fleet_dirs[0]), str(fleet_dirs[1])], "add --fleet"),
        ([str(fleet_dirs[0]), "--fleet"], "two or more run directories"),
        ([str(tmp_path / "nothing-*"), "--fleet"], "no run directory matches"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["report", *argv])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert says in err


def test_a_single_report_names_its_box(fleet_dirs: list[Path]) -> None:
    text = render_markdown(build_report(fleet_dirs[1], slowest_n=0))
    assert "(node edge-b, site lab-b)\n" in text
