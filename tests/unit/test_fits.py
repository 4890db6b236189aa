"""The plan's longest request against each target's context (soakd/workload/fits.py): a
plan whose requests the server must refuse stops before the journal opens, with one line
naming the target, its context and where the long request comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.cli import main
from soakd.config import Config, ConfigError
from soakd.targets.preflight import _models_list
from soakd.workload.fits import check_fits, longest_request
from soakd.workload.prompts import make_prompt_source


def config(workload: dict[str, Any], **target: Any) -> Config:
    return Config.model_validate(
        {
            "targets": [
                {"name": "a", "simulator": "fast"},
                {"name": "b", "simulator": "fast", **target},
            ],
            "workload": workload,
            "phases": [{"name": "p", "duration": "1s"}],
        }
    )


def problems(cfg: Config, said: dict[str, int | None] | None = None) -> list[str]:
    longest = longest_request(cfg.workload, make_prompt_source(cfg.workload))
    with pytest.raises(ConfigError) as exc:
        check_fits(cfg, longest, said or {})
    return exc.value.problems


UNIFORM = {"prompts": {"input_tokens": {"dist": "uniform", "min": 16, "max": 4000}}}


def test_a_distributions_top_and_the_answer_cap_past_the_context() -> None:
    cfg = config({**UNIFORM, "max_tokens": 200}, max_model_len=4096)
    assert problems(cfg) == [
        "targets[1] (b): its context is 4,096 tokens (targets[1].max_model_len), but the plan's "
        "longest request is 4,200: a prompt of up to 4,000 (workload.prompts.input_tokens) and "
        "an answer of up to 200 (workload.max_tokens); shorten them, or set "
        "targets[1].max_model_len if the server takes more"
    ]
    # the same plan fits a context one token longer, and a target that says none is not held
    longest = longest_request(cfg.workload, make_prompt_source(cfg.workload))
    check_fits(config({**UNIFORM, "max_tokens": 200}, max_model_len=4200), longest, {})
    check_fits(config({**UNIFORM, "max_tokens": 200}), longest, {"a": None})


def test_the_models_list_says_the_context_and_the_config_overrides_it() -> None:
    cfg = config({**UNIFORM, "max_tokens": 200})
    (line,) = problems(cfg, {"a": 2048, "b": None})
    assert line.startswith("targets[0] (a): its context is 2,048 tokens (a's models list)")
    longest = longest_request(cfg.workload, make_prompt_source(cfg.workload))
    check_fits(config({**UNIFORM, "max_tokens": 200}, max_model_len=8192), longest, {"b": 2048})


def test_a_files_longest_record_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "w" * 400}, {"prompt": "w" * 8000, "output_tokens": 100}, {"prompt": "x"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    cfg = config({"prompts": {"source": "file", "file": str(path)}}, max_model_len=1024)
    (line,) = problems(cfg)
    assert f"workload.prompts.file: {path.name}:2, a prompt of 2,000 and an answer of 100" in line


def test_the_context_in_a_models_list() -> None:
    body = {"data": [{"id": "other", "max_model_len": 9}, {"id": "m", "max_model_len": 2048}]}
    assert _models_list(json.dumps(body).encode(), "m") == (["other", "m"], 2048)
    assert _models_list(json.dumps({"data": [{"id": "m"}]}).encode(), "m") == (["m"], None)
    bad = {"data": [{"id": "m", "max_model_len": "4k"}]}  # not a whole number: not said
    assert _models_list(json.dumps(bad).encode(), "m") == (["m"], None)
    assert _models_list(b"not json", "m") == (None, None)


def test_soakd_check_stops_a_plan_longer_than_a_configured_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "targets": [{"name": "edge", "simulator": "edge-4gb", "max_model_len": 2048}],
        "workload": {**UNIFORM, "max_tokens": 64},
        "phases": [{"name": "p", "duration": "1s"}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "targets[0] (edge): its context is 2,048 tokens" in err
    assert "the plan's longest request is 4,064" in err
