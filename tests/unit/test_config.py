"""Config errors name the field and the value, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from soakd.cli import main
from soakd.config import ConfigError, config_from_dict, load_config, parse_duration


def base() -> dict:
    return {
        "targets": [{"name": "local", "base_url": "http://127.0.0.1:8000", "model": "tiny"}],
        "phases": [
            {"name": "steady", "duration": "1h", "load": {"mode": "closed", "concurrency": 4}}
        ],
    }


def error_of(raw: dict, environ: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, environ)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("72h", 259200),
        ("1h30m", 5400),
        ("500ms", 0.5),
        ("2.5s", 2.5),
        ("90", 90),
        (15, 15),
        ("1d", 86400),
    ],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["72x", "h", "1h30", "-5m", "", "5 mins"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_valid_config_has_defaults() -> None:
    cfg = config_from_dict(base())
    assert cfg.workload.max_tokens == 512
    assert cfg.workload.temperature == 0.7
    assert cfg.exporter.listen == "127.0.0.1:9464"
    assert cfg.phases[0].duration == 3600
    assert cfg.targets[0].endpoint == "http://127.0.0.1:8000/v1/chat/completions"


def test_typo_names_the_key() -> None:
    raw = base()
    raw["targets"][0]["modle"] = "x"
    assert error_of(raw) == "targets[local].modle: unknown key (did you mean 'model'?)"
    raw["targets"][0].pop("modle")
    raw["targets"][0]["xyzzy"] = "x"  # nothing close: the plain hint
    assert error_of(raw) == "targets[local].xyzzy: unknown key (check the spelling)"


def test_bad_duration_names_field_and_value() -> None:
    raw = base()
    raw["phases"][0]["duration"] = "72x"
    msg = error_of(raw)
    assert msg.startswith("phases[steady].duration:")
    assert "'72x'" in msg


def test_negative_rate_names_field() -> None:
    raw = base()
    raw["phases"][0]["load"] = {"mode": "poisson", "rate": -3}
    msg = error_of(raw)
    assert msg.startswith("phases[steady].load.rate:")
    assert "-3" in msg


def test_bad_url_scheme() -> None:
    raw = base()
    raw["targets"][0]["base_url"] = "ftp://example.com"
    msg = error_of(raw)
    assert msg.startswith("targets[local].base_url:")
    assert "ftp://example.com" in msg


def test_inline_secret_header_refused() -> None:
    raw = base()
    raw["targets"][0]["headers"] = {"Authorization": "Bearer sk-123"}
    msg = error_of(raw)
    assert "api_key_env" in msg
    assert "sk-123" not in msg


def test_unknown_target_in_phase() -> None:
    raw = base()
    raw["phases"][0]["targets"] = {"cloud": {"mode": "closed", "concurrency": 1}}
    assert "unknown target(s) cloud" in error_of(raw)


def test_missing_required() -> None:
    raw = base()
    del raw["phases"]
    assert error_of(raw) == "phases: required, but missing"


def test_env_overrides_by_section_and_by_name() -> None:
    env = {
        "SOAKD__EXPORTER__LISTEN": "0.0.0.0:9999",
        "SOAKD__TARGETS__LOCAL__MAX_CONNECTIONS": "16",
        "SOAKD__TARGETS__0__MODEL": "other",
        "SOAKD__WORKLOAD__MAX_TOKENS": "128",
        "UNRELATED": "x",
    }
    cfg = config_from_dict(base(), env)
    assert cfg.exporter.listen == "0.0.0.0:9999"
    assert cfg.targets[0].max_connections == 16
    assert cfg.targets[0].model == "other"
    assert cfg.workload.max_tokens == 128


def test_node_and_site_from_the_config_or_the_environment() -> None:
    """run.node and run.site name the box and its site (soakd_build_info, the report,
    summary.json); compose sets them from SOAKD_NODE / SOAKD_SITE."""
    raw = base()
    raw["run"] = {"node": "edge-7", "site": "lab 3"}
    cfg = config_from_dict(raw)
    assert (cfg.run.node, cfg.run.site) == ("edge-7", "lab 3")
    env = {"SOAKD__RUN__NODE": "edge-9", "SOAKD__RUN__SITE": "berlin"}
    cfg = config_from_dict(base(), env)
    assert (cfg.run.node, cfg.run.site) == ("edge-9", "berlin")
    assert config_from_dict(base()).run.site is None
    assert config_from_dict(base(), {"SOAKD__RUN__SITE": ""}).run.site is None  # unset
    raw = base()
    raw["run"] = {"node": "a\x1b[2Jb"}  # it goes into label values and reports
    assert error_of(raw).startswith("run.node:")
    raw["run"] = {"node": ""}
    assert error_of(raw).startswith("run.node:")


def test_env_override_error_names_field() -> None:
    msg = error_of(base(), {"SOAKD__WORKLOAD__MAX_TOKENS": "lots"})
    assert msg.startswith("workload.max_tokens:")
    assert "lots" in msg


def test_api_key_by_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = base()
    raw["targets"][0]["api_key_env"] = "SOAKD_TEST_KEY"
    cfg = config_from_dict(raw)
    with pytest.raises(ConfigError, match="SOAKD_TEST_KEY is not set"):
        cfg.targets[0].api_key()
    monkeypatch.setenv("SOAKD_TEST_KEY", "sk-secret-value")
    key = cfg.targets[0].api_key()
    assert key is not None
    assert key.get_secret_value() == "sk-secret-value"
    assert "sk-secret-value" not in repr(key)
    assert "sk-secret-value" not in repr(cfg)

    keyfile = tmp_path / "key"
    keyfile.write_text("sk-from-file\n")
    raw["targets"][0] = {**raw["targets"][0], "api_key_env": None, "api_key_file": str(keyfile)}
    key = config_from_dict(raw).targets[0].api_key()
    assert key is not None
    assert key.get_secret_value() == "sk-from-file"


def test_load_config_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy)


def test_demo_config_is_valid() -> None:
    cfg = load_config(Path(__file__).parents[2] / "examples" / "demo.yaml", environ={})
    assert [t.name for t in cfg.targets] == ["edge-4gb", "datacenter"]


def test_odd_key_is_quoted_on_one_line() -> None:
    raw = base()
    raw["run"] = {"\r": 0}  # found by the fuzzer: a bare CR split the message in two
    assert error_of(raw) == "run.'\\r': unknown key (check the spelling)"


@pytest.mark.timeout(60)
def test_a_config_of_forty_thousand_targets_is_checked_in_linear_time() -> None:
    """20k targets took 12.7 s in an O(n^2) duplicate check; 40k never finished."""
    raw = base()
    template = raw["targets"][0]
    raw["targets"] = [{**template, "name": f"t{i}"} for i in range(40_000)]
    cfg = config_from_dict(raw)
    assert len(cfg.targets) == 40_000
    raw["targets"].append({**template, "name": "t7"})
    with pytest.raises(
        ConfigError,
        match=r"^config: targets\[40000\]: duplicate name 't7' \(targets\[7\] has it\)$",
    ):
        config_from_dict(raw)


def test_two_phases_of_one_name_name_the_second_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They passed `check` and ran, and the report merged them: one line naming the second
    by its place in phases, exit 2 from `check` and from `run` (before any run directory)."""
    raw = base()
    steady = raw["phases"][0]
    raw["phases"] = [steady, {**steady, "name": "peak"}, {**steady, "duration": "2h"}]
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(raw))
    line = f"soakd: error: {path}: phases[2]: duplicate name 'steady' (phases[0] has it)"
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--run-dir", str(run_dir), "--no-live"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert not run_dir.exists()
    # the same rule as the targets', and without a file the whole config is named
    assert error_of(raw) == "config: phases[2]: duplicate name 'steady' (phases[0] has it)"
    raw["phases"][2]["name"] = "cool"
    assert config_from_dict(raw).phases[2].name == "cool"
    path.write_text(yaml.safe_dump(raw))
    assert main(["check", str(path)]) == 0
    capsys.readouterr()
    raw["targets"].append(raw["targets"][0])
    path.write_text(yaml.safe_dump(raw))
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"soakd: error: {path}: targets[1]: duplicate name 'local' (targets[0] has it)"
    ]


@pytest.mark.parametrize("value", [0, -1, 257, 2.5, True, "x", ""])
def test_workers_out_of_range_is_one_line_naming_the_key(value: object) -> None:
    raw = base()
    raw["run"] = {"workers": value}
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert str(err.value).startswith("run.workers: a number of sender processes from 1 to 256")
    assert len(str(err.value).splitlines()) == 1


def test_workers_take_auto_a_number_or_the_environment() -> None:
    raw = base()
    raw["run"] = {"workers": "auto"}
    assert config_from_dict(raw).run.workers == "auto"
    assert config_from_dict(base()).run.workers == "auto"  # default: as the plan needs
    assert config_from_dict(base(), {"SOAKD__RUN__WORKERS": "4"}).run.workers == 4
