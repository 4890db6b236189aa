"""``soakd capacity``'s pure parts and its bad input: which load the search tries next, when
a queue is steady, and the config problems that stop a sweep before it starts (one line
naming the field, exit 2, at ``soakd check`` and ``soakd capacity``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soakd.capacity.result import read_result
from soakd.capacity.search import Search, steady
from soakd.cli import main
from soakd.config import ConfigError


def exit_code(argv: list[str]) -> int | str | None:
    """``soakd ARGV``'s exit status, returned or raised."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def drive(search: Search, capacity: float) -> list[float]:
    """Run the search against a server that holds every load up to ``capacity``."""
    tried = []
    while (load := search.next()) is not None:
        tried.append(load)
        search.record(load, load <= capacity)
        assert len(tried) < 50
    return tried


def test_ramp_then_bisection_to_precision() -> None:
    s = Search(start=1, factor=2, ceiling=1000, precision=0.05)
    tried = drive(s, 13.0)
    assert tried[:5] == [1, 2, 4, 8, 16]  # geometric until the first failure
    assert s.passed is not None
    assert s.failed is not None
    assert s.passed <= 13.0 < s.failed
    assert s.failed - s.passed <= 0.05 * s.passed
    assert s.knee == s.passed
    assert 13.0 * 0.95 <= s.knee <= 13.0


def test_held_up_to_the_ceiling() -> None:
    s = Search(start=10, factor=3, ceiling=50, precision=0.05)
    assert drive(s, 1e9) == [10, 30, 50]
    assert s.at_ceiling
    assert s.knee == 50


def test_concurrency_is_whole_and_stops_between_neighbours() -> None:
    s = Search(start=1, factor=2, ceiling=256, precision=0.01, whole=True)
    tried = drive(s, 11)
    assert all(t == int(t) for t in tried)
    assert s.knee == 11
    assert s.failed == 12


def test_a_first_step_that_fails_steps_down_then_gives_up() -> None:
    s = Search(start=8, factor=2, ceiling=100, precision=0.05)
    assert drive(s, 2.5)[:3] == [8, 4, 2]
    assert s.knee is not None
    assert 2 <= s.knee <= 2.5
    none = Search(start=8, factor=2, ceiling=100, precision=0.05)
    assert drive(none, 0.01) == [8, 4, 2, 1]
    assert none.knee is None


def test_steady_judges_the_last_third_against_the_middle() -> None:
    flat = [(t / 4, 3.0) for t in range(40)]
    rising = [(t / 4, t * 0.5) for t in range(40)]
    warm_up_then_flat = [(t / 4, min(t, 8) * 1.0) for t in range(40)]
    assert steady(flat, 0.1) is True
    assert steady(rising, 0.1) is False
    assert steady(warm_up_then_flat, 0.1) is True  # the first third is the warm-up
    assert steady([(0.0, 1.0), (0.25, 2.0)], 0.1) is None  # too few to tell
    assert steady([], 0.1) is None


BASE = """
targets:
  - {name: a, simulator: fast, model: m}
phases:
  - {name: p, duration: 1m}
"""


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("capacity: {max_time: 1m}\n", "targets[a].slo: no SLO to judge a capacity step by"),
        (
            "slo: {e2e_p99: 1s}\ncapacity: {ceiling: 10, floor: {a: 20}}\n",
            "capacity: floor.a: 20 is above ceiling (10)",
        ),
        ("slo: {e2e_p99: 1s}\ncapacity: {floor: {b: 2}}\n", "capacity.floor.b: unknown target"),
        (
            "slo: {e2e_p99: 1s}\ncapacity: {min_step: 1m, max_step: 10s}\n",
            "capacity: min_step (60s) is above max_step (10s)",
        ),
    ],
)
@pytest.mark.parametrize("command", ["check", "capacity"])
def test_bad_capacity_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, said: str, command: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + extra)
    assert exit_code([command, str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err
    assert len(err.splitlines()) == 1


def test_capacity_without_a_capacity_block_still_needs_an_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``soakd check`` of a config that never sweeps says nothing; ``soakd capacity`` of it
    stops before any server starts or directory is made."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE)
    assert main(["check", str(cfg)]) == 0
    capsys.readouterr()
    assert exit_code(["capacity", str(cfg), "--run-dir", str(tmp_path / "sweep")]) == 2
    assert "targets[a].slo: no SLO" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


def test_a_result_that_cannot_be_read_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "knee.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"^capacity.result: .*knee.json: cannot be read"):
        read_result(bad)
    bad.write_text(json.dumps({"format": 99}))
    with pytest.raises(ConfigError, match="not a soakd capacity result"):
        read_result(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_result(tmp_path / "missing.json")
    good = {"format": 1, "targets": {"a": {"by": "rate", "knee": 9.5}, "b": {"knee": None}}}
    bad.write_text(json.dumps(good))
    assert read_result(bad) == {"a": ("rate", 9.5)}
    (tmp_path / "capacity.json").write_text(json.dumps(good))
    assert read_result(tmp_path) == {"a": ("rate", 9.5)}


SHARES = """
targets:
  - {name: a, simulator: fast, model: m}
  - {name: b, simulator: fast, model: m}
phases:
  - {name: warm, duration: 1m, load: {mode: closed, concurrency: 2}}
  - name: steady
    duration: 1h
    load: {mode: poisson, rate: 70%}
    targets: {b: {mode: closed, concurrency: 50%}}
  - {name: over, duration: 1m, load: {mode: constant, rate: 120%}}
slo: {e2e_p99: 30s}
"""


def knees_file(tmp_path: Path, knees: dict[str, tuple[str, float]]) -> Path:
    path = tmp_path / "knees.json"
    targets = {name: {"by": by, "knee": knee} for name, (by, knee) in knees.items()}
    path.write_text(json.dumps({"format": 1, "targets": targets}))
    return path


def test_shares_of_the_knee_resolve_from_a_stored_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rate: 70%`` and ``concurrency: 50%``: the plan shows the numbers, and what each
    share resolved to is said; a run stores the share and the knee with its load."""
    from soakd.config import load_config
    from soakd.run.app import RunOptions, Soak

    knees = knees_file(tmp_path, {"a": ("rate", 10.0), "b": ("rate", 20.0)})
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(SHARES + f"capacity: {{result: {knees}}}\n")
    assert exit_code(["check", str(cfg_file)]) == 2  # b's concurrency share: no such knee
    assert "phases[steady].targets.b.concurrency: capacity.result" in capsys.readouterr().err
    knees_file(tmp_path, {"a": ("rate", 10.0), "b": ("concurrency", 8.0)})
    assert exit_code(["check", str(cfg_file)]) == 2  # b's rate share (over): no such knee
    assert "phases[over].load.rate: capacity.result" in capsys.readouterr().err
    cfg_file.write_text(
        SHARES.replace("rate: 120%", "rate: 2") + f"capacity: {{result: {knees}}}\n"
    )
    assert exit_code(["check", str(cfg_file)]) == 0
    out = capsys.readouterr().out
    assert "poisson 7 req/s" in out  # a: 70 % of 10
    assert "phase steady, a: rate 70% of the knee 10 req/s = 7 req/s" in out
    assert "phase steady, b: concurrency 50% of the knee 8 = 4" in out
    from soakd.capacity.shares import from_result

    cfg = from_result(load_config(cfg_file))
    status = Soak(cfg, RunOptions(run_dir=tmp_path / "run")).status()
    assert status.shares["steady"]["a"] == "rate 70% of the knee 10 req/s = 7 req/s"
    assert status.doc()["shares"]["steady"]["b"] == "concurrency 50% of the knee 8 = 4"
    assert "over" not in status.shares


def test_a_share_with_no_result_and_no_measurement_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(SHARES)
    for argv in (["check"], ["run", "--run-dir", str(tmp_path / "r")]):
        assert exit_code([*argv, str(cfg_file)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(
            "phases[steady].load.rate: a share of the knee needs capacity.result (a soakd "
            "capacity result) or capacity.measure: true"
        )
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_the_example_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "capacity.yaml"
    assert exit_code(["check", str(example)]) == 0
    assert "slo cap-32: e2e_p99 30s, error_ratio 1 %" in capsys.readouterr().out


def test_a_sweep_phase_is_planned_and_needs_an_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    sweeps = """
targets:
  - {name: a, simulator: fast, model: m}
phases:
  - {name: knee-0, duration: 10m, load: {mode: sweep}}
  - {name: soak, duration: 24h, load: {mode: poisson, rate: 2}}
  - {name: knee-1, duration: 10m, load: {mode: sweep}}
"""
    cfg.write_text(sweeps)
    assert exit_code(["check", str(cfg)]) == 2
    assert "targets[a].slo: no SLO to judge a capacity step by" in capsys.readouterr().err
    cfg.write_text(sweeps + "slo: {e2e_p99: 10s}\n")
    assert exit_code(["check", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.count("capacity sweep") == 2
