"""``soakd capacity`` against simulators whose capacity is known from their profile: the knee
found is within 10 % of it, for three profiles; and a sweep never runs past its bound."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from soakd.capacity.result import read_result
from soakd.capacity.sweep import sweep
from soakd.cli import main
from soakd.config import config_from_dict
from soakd.profiles import get_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ANSWER = 32  # tokens an answer, every one served whole (the profiles have no EOS)
PROFILES = ("cap-4", "cap-8", "cap-32")


def capacity_of(name: str, answer: int = ANSWER) -> float:
    """Requests a second the profile serves at most (docs/capacity.md): a full batch of
    ``max_num_seqs``, each answer holding its slot for ``answer`` steps."""
    p = get_profile(name)
    seqs = p.max_num_seqs
    step = p.decode_s_per_step * (1 + p.decode_slowdown_per_seq * (seqs - 1))
    return seqs / (answer * step)


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def sweep_config(profiles: tuple[str, ...], **capacity: Any) -> dict[str, Any]:
    return {
        "run": {"name": "cap"},
        "targets": [{"name": p, "simulator": p, "model": "m"} for p in profiles],
        "workload": {"max_tokens": ANSWER, "prompts": {"input_tokens": {"mean": 16}}},
        "phases": [{"name": "p", "duration": "1m", "load": {"mode": "constant", "rate": 1}}],
        # loose enough that the queue decides: past capacity it rises without end
        "slo": {"e2e_p99": "30s", "error_ratio": 0.01},
        "capacity": {
            "start": 4,
            "min_step": "4s",
            "max_step": "6s",
            "min_requests": 20,
            **capacity,
        },
        "gpu": {"source": "none"},
    }


def test_knee_within_ten_percent_of_each_profiles_capacity(tmp_path: Path) -> None:
    cfg = config_from_dict(sweep_config(PROFILES, max_time="6m"))
    result = asyncio.run(sweep(cfg, tmp_path / "sweep", metrics_addr=_port()))
    for name in PROFILES:  # -s shows the figures
        knee = result.targets[name]
        expected = capacity_of(name)
        print(f"{name}: knee {knee.knee} against {expected:.2f} req/s, {knee.seconds:.0f} s")
        assert knee.knee is not None, knee
        assert abs(knee.knee - expected) <= 0.10 * expected, (name, knee.knee, expected)
        assert knee.by == "rate"
        # the curve: below the knee every step held, and what failed above it is named
        held = [p for p in knee.steps if p.passed]
        assert max(p.load for p in held) == knee.knee
        assert all(p.achieved_rps > 0 and p.e2e_p99_ms for p in held)
        assert knee.limit in {"queue_rising", "e2e_p99", "offered_not_sent"}
        # the simulator's own queue judged it, and its KV cache was read
        assert all(p.queue_source == "server" and p.kv_cache_max is not None for p in knee.steps)
    assert result.seconds <= 6 * 60


def test_a_closed_loop_knee_is_the_batch(tmp_path: Path) -> None:
    """By concurrency, the SLO decides: up to ``max_num_seqs`` streams every answer takes
    ``ANSWER`` steps (432 ms for cap-8 at a full batch); one stream more waits a whole
    answer for a slot, past an E2E P99 of 600 ms. The knee is the batch."""
    raw = sweep_config(("cap-8",), by="concurrency", start=2, max_time="90s")
    raw["slo"] = {"e2e_p99": "600ms"}
    raw["capacity"] |= {"min_step": "3s", "max_step": "5s", "min_requests": 50}
    result = asyncio.run(sweep(config_from_dict(raw), tmp_path / "sweep", metrics_addr=_port()))
    knee = result.targets["cap-8"]
    assert knee.by == "concurrency"
    assert knee.knee == get_profile("cap-8").max_num_seqs
    assert knee.limit == "e2e_p99"
    assert all(p.load == int(p.load) for p in knee.steps)


def test_never_past_its_time_bound_and_the_cli_writes_the_result(tmp_path: Path) -> None:
    """A bound too short to finish: the sweep stops at it, says so, and the JSON is whole;
    ``--check`` against a floor the knee cannot reach exits 1."""
    raw = sweep_config(("cap-8",), max_time="9s", floor={"cap-8": 500})
    raw["capacity"]["ceiling"] = 1000
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps(raw))
    out = tmp_path / "knee.json"
    code = main(
        [
            "capacity",
            str(cfg_file),
            "--out",
            str(out),
            "--run-dir",
            str(tmp_path / "sweep"),
            "--metrics-addr",
            _port(),
            "--check",
        ]
    )
    assert code == 1  # below its floor
    doc = json.loads(out.read_text())
    knee = doc["targets"]["cap-8"]
    assert doc["seconds"] <= 9.0
    assert knee["ended"] == "time bound reached"
    assert sum(s["seconds"] for s in knee["steps"]) <= 9.0
    assert (tmp_path / "sweep" / "capacity.json").exists()
    page = (tmp_path / "sweep" / "capacity.html").read_text()
    assert "<svg" in page
    assert "achieved req/s" in page
    assert read_result(out) == {"cap-8": ("rate", knee["knee"])}


def test_run_measures_the_knee_first_and_soaks_at_its_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``capacity.measure: true``: ``soakd run`` sweeps first, then runs the plan at 50 %
    of the knee found; the run's stored config keeps the share and the knee."""
    import yaml

    monkeypatch.chdir(tmp_path)  # the sweep's directory: runs/<name>-capacity-<time>
    raw = sweep_config(("cap-32",), measure=True, max_time="14s", start=16)
    raw["capacity"] |= {"min_step": "2s", "max_step": "3s"}
    raw["phases"] = [
        {"name": "steady", "duration": "2s", "load": {"mode": "constant", "rate": "50%"}}
    ]
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps(raw))
    run_dir = tmp_path / "run"
    argv = ["run", str(cfg_file), "--run-dir", str(run_dir), "--no-live"]
    assert main([*argv, "--metrics-addr", _port()]) == 0
    err = capsys.readouterr().err
    (sweep_dir,) = (tmp_path / "runs").glob("cap-capacity-*")
    knee = read_result(sweep_dir)["cap-32"]
    assert knee[0] == "rate"
    assert f"phase steady, cap-32: rate 50% of the knee {knee[1]:.4g} req/s" in err
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    load = stored["phases"][0]["targets"]["cap-32"]
    assert load["rate"] == pytest.approx(knee[1] / 2)
    assert (load["share"], load["share_of"], load["knee"]) == (0.5, "rate", knee[1])
    # the report: the knees the shares resolved against, drawn, and each share said
    assert read_result(run_dir) == {"cap-32": knee}
    report = tmp_path / "report.html"
    assert main(["report", str(run_dir), "--format", "html", "-o", str(report)]) == 0
    page = report.read_text()
    assert "Capacity: latency against throughput" in page
    assert f"phase steady, cap-32: rate 50% of the knee {knee[1]:.4g} req/s" in page
