"""The run's stages: frozen values whose parts all exist (soakd/run/assemble.py)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest

from soakd.config import config_from_dict
from soakd.run.app import Soak
from soakd.run.assemble import Parts, Servers, Setup
from soakd.run.session import RunOptions


def config(**run: object) -> dict[str, object]:
    return {
        "targets": [{"name": "t", "base_url": "http://127.0.0.1:9", "model": "m"}],
        "phases": [{"name": "p", "duration": "10s", "load": {"mode": "poisson", "rate": 2}}],
        "run": {"name": "unit", **run},
    }


@pytest.mark.parametrize("stage", [Parts, Servers])
def test_a_stage_has_no_optional_part(stage: type) -> None:
    hints = typing.get_type_hints(stage)
    optional = [
        name
        for name, hint in hints.items()
        if isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    ]
    assert hints
    assert optional == []
    assert stage.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_parts_cannot_be_swapped_later() -> None:
    setup = Setup.open(config_from_dict(config()), RunOptions(run_dir=Path("/nonexistent/r")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.plan = setup.plan  # type: ignore[misc]


def test_setup_is_whole_before_anything_opens(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    setup = Setup.open(config_from_dict(config()), RunOptions(run_dir=run_dir, duration_s=4))
    assert setup.resume is None
    assert setup.config_changes == []
    assert setup.run_id.startswith("unit-")
    assert setup.run_dir == run_dir
    assert not run_dir.exists()
    assert setup.plan_options == {"rehearse_s": None, "duration_s": 4}
    assert setup.plan.duration_ns == 4_000_000_000  # the flag cut the plan
    assert setup.names == ["t"]
    assert set(setup.live_slo) == {"t"}


STATUS_KEYS = [
    "run_id",
    "version",
    "node",
    "site",
    "phase",
    "phase_index",
    "phases",
    "elapsed_s",
    "remaining_s",
    "plan_scale",
    "stopping",
    "in_flight",
    "workers",
    "missed",
    "failing",
    "no_reuse",
    "vram",
    "lag_limit_s",
    "drain_timeout_s",
    "slo",
    "metrics_url",
    "targets",
    "prompt_tokens",
    "shares",
]
"""/status's keys, in order."""


def test_soak_shows_no_parts_until_assembled(tmp_path: Path) -> None:
    soak = Soak(config_from_dict(config()), RunOptions(run_dir=tmp_path / "run"))
    assert soak.parts is None
    assert soak.runner is None
    assert soak.targets == {}
    status = soak.status()
    assert (status.workers, status.missed, status.failing, status.no_reuse) == (None, {}, {}, {})
    assert status.phase is None
    assert status.prompt_tokens is None
    doc = status.doc()  # /status: the same document as ever
    assert (doc["workers"], doc["missed"], doc["failing"], doc["no_reuse"]) == (None, {}, {}, {})
    assert list(doc) == STATUS_KEYS
