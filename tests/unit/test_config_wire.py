"""Config values that cannot go on the wire, or that would end a run in a crash, are config
errors: one line naming the field (``soakd check`` and ``soakd run`` alike, exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from soakd.config import MAX_TOKENS, ConfigError, config_from_dict, load_config


def base(**target: Any) -> dict[str, Any]:
    return {
        "targets": [
            {"name": "local", "base_url": "http://127.0.0.1:8000", "model": "tiny", **target}
        ],
        "phases": [{"name": "steady", "duration": "1h"}],
    }


def error_of(raw: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, environ)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("a\r\nInjected: 1", "a carriage return (CR) at position 2"),
        ("a\nb", "a line feed (LF) at position 2"),
        ("a\x00b", "a NUL at position 2"),
        ("ab\x1bc", "a control character (U+001B) at position 3"),
        ("caf\u00e9", "a non-ASCII character (U+00E9) at position 4"),
        ("\u20ac5", "a non-ASCII character (U+20AC) at position 1"),
        ("a\x7f", "a DEL at position 2"),
    ],
)
def test_a_header_value_that_cannot_go_on_the_wire(value: str, said: str) -> None:
    line = error_of(base(headers={"X-Team": value}))
    assert line.startswith("targets[local].headers: header X-Team: its value holds ")
    assert said in line
    assert value not in line  # a value is never echoed (it may hold a secret)


@pytest.mark.parametrize("name", ["X Team", "X:Team", "", "X\u00e9", "X\r\nY"])
def test_a_header_name_that_is_not_a_token(name: str) -> None:
    line = error_of(base(headers={name: "v"}))
    assert line.startswith("targets[local].headers")
    assert "is not an HTTP token" in line


def test_tabs_spaces_and_printable_ascii_are_fine() -> None:
    cfg = config_from_dict(base(headers={"X-Team": "soak team\t#1 (a/b); q=0.5"}))
    assert cfg.targets[0].headers["X-Team"] == "soak team\t#1 (a/b); q=0.5"


@pytest.mark.parametrize("field", ["organization", "project"])
def test_the_openai_headers_too(field: str) -> None:
    line = error_of(base(**{field: "org\r\nX: 1"}))
    assert line.startswith(f"targets[local].{field}: header OpenAI-")
    assert "carriage return" in line


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:0", "port must be within 1-65535, got 0"),
        ("http://user@127.0.0.1:8000", "must not carry user info"),
        ("http://user:pw@127.0.0.1:8000", "must not carry user info"),
        ("ftp://127.0.0.1:8000", "scheme must be http or https"),
        ("http://127.0.0.1:8000/v1?key=1", "takes no query or fragment"),
        ("http://127.0.0.1:8000/#x", "takes no query or fragment"),
        ("http://127.0.0.1:8000/\r\nX: 1", "a carriage return (CR)"),
        ("http://my host:8000", "a space"),
        ("http://[::1:8000", "Invalid IPv6 URL"),
    ],
)
def test_a_base_url_the_client_cannot_ask(url: str, said: str) -> None:
    line = error_of(base(base_url=url))
    assert line.startswith("targets[local].base_url: ")
    assert said in line
    assert "pw" not in line


def test_other_urls_may_take_a_query_but_not_a_bad_port() -> None:
    cfg = config_from_dict(base(metrics_url="http://127.0.0.1:8000/metrics?format=text"))
    assert cfg.targets[0].metrics_url is not None
    line = error_of(base(proxy="http://127.0.0.1:99999"))
    assert line.startswith("targets[local].proxy: ")


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("", "the model name is empty"),
        ("   ", "the model name is empty"),
        ("m\nx", "control character (U+000A)"),
        ("m" * 1025, "a model name of 1025 characters"),
    ],
)
def test_model_names(model: str, said: str) -> None:
    line = error_of(base(model=model))
    assert line.startswith("targets[local].model: ")
    assert said in line


def test_a_model_that_azure_would_put_in_the_url_path() -> None:
    azure = {"kind": "azure", "api_version": "2024-06-01"}
    line = error_of(base(model="org/model name?x", **azure))
    assert "kind 'azure' puts the deployment in the URL path" in line
    ok = config_from_dict(base(model="org/model name?x", deployment="gpt4o", **azure))
    assert "/deployments/gpt4o/" in ok.targets[0].endpoint
    assert config_from_dict(base(model="meta-llama/Llama-3-8B")).targets[0].model


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"seed_date": "DATE"}, "Object of type date is not JSON serializable"),
        ({"top_p": float("nan")}, "Out of range float values are not JSON compliant"),
        ({"blob": "x" * (1 << 20)}, "bytes as JSON, sent with every request (at most 1,048,576)"),
    ],
)
def test_extra_body_must_be_json_every_request_can_carry(extra: dict[str, Any], said: str) -> None:
    import datetime

    extra = {k: datetime.date(2024, 1, 1) if v == "DATE" else v for k, v in extra.items()}
    line = error_of(base(extra_body=extra))
    assert line.startswith("targets[local].extra_body: ")
    assert said in line


def test_an_unknown_simulator_profile_is_a_config_error() -> None:
    raw = {"targets": [{"name": "s", "simulator": "nope"}], "phases": base()["phases"]}
    line = error_of(raw)
    assert line.startswith("targets[s].simulator: unknown simulator profile 'nope' (known: ")


@pytest.mark.parametrize("field", ["mean", "max", "min"])
def test_token_lengths_past_a_million_are_refused(field: str) -> None:
    raw = base()
    raw["workload"] = {"prompts": {"input_tokens": {"dist": "uniform", field: 10**9}}}
    line = error_of(raw)
    assert line.startswith(f"workload.prompts.input_tokens.{field}: ")
    assert f"{MAX_TOKENS}" in line
    raw["workload"] = {"max_tokens": 5_000_000_000}  # the workers' wire packs 32 bits
    assert error_of(raw).startswith("workload.max_tokens: ")


def test_a_rate_past_any_client_is_refused() -> None:
    """1e308 req/s: check and run ended in OverflowError (a plan's expected count)."""
    raw = base()
    raw["phases"] = [{"name": "p", "duration": "2h", "load": {"mode": "poisson", "rate": 1e308}}]
    assert error_of(raw).startswith("phases[p].load.rate: ")
    raw["phases"][0]["load"]["rate"] = 1e9  # the overload tests' rate: fine
    assert config_from_dict(raw).phases[0].load.rate == 1e9


def test_an_infinite_stddev_is_refused() -> None:
    raw = base()
    raw["workload"] = {"prompts": {"input_tokens": {"dist": "normal", "stddev": float("inf")}}}
    assert error_of(raw).startswith("workload.prompts.input_tokens.stddev: ")


def test_an_env_index_that_is_a_digit_only_to_unicode() -> None:
    # str.isdigit() says yes to '²' and int('²') raises: a traceback in `soakd check`
    for index in ("\u00b2", "\u0663", "\u2460"):
        line = error_of(base(), {f"SOAKD__TARGETS__{index}__MODEL": "x"})
        assert line == f"SOAKD__TARGETS__{index}__MODEL: no list item {index!r} in targets"
    cfg = config_from_dict(base(), {"SOAKD__TARGETS__0__MODEL": "x"})
    assert cfg.targets[0].model == "x"


def bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    body = "\n".join("      " + line for line in lines)
    return f"""targets:
  - name: t
    base_url: http://127.0.0.1:8000
    extra_body:
{body}
phases: [{{name: p, duration: 1m}}]
"""


def test_a_yaml_alias_bomb_is_refused_before_anything_expands_it(tmp_path: Path) -> None:
    """Nine levels of ten aliases: 10^9 strings once expanded (the JSON of every request,
    the journal's copy of the config): MemoryError before; now one line, in well under
    a second and a few MB (the count stops at its limit)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(9))
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    line = str(info.value)
    assert line.startswith(f"{path}: targets.0.extra_body.a9...: over 100,000 values once")
    assert "YAML aliases are expanded" in line
    path.write_text(bomb(3))  # 10^4 values: a config may use aliases
    assert load_config(path, {}).targets[0].extra_body["a3"][0][0][0][0] == "lol"


def test_an_alias_that_holds_itself(tmp_path: Path) -> None:
    path = tmp_path / "cycle.yaml"
    path.write_text(
        "targets:\n  - {name: t, base_url: 'http://127.0.0.1:8000', extra_body: {x: &a [1, *a]}}\n"
        "phases: [{name: p, duration: 1m}]\n"
    )
    with pytest.raises(ConfigError, match=r"targets\.0\.extra_body\.x\.\.\.: over 100,000"):
        load_config(path, {})


def test_an_env_value_bomb_names_the_variable() -> None:
    value = "[" + ", ".join(["&a [1,2,3,4,5,6,7,8,9,10]"] + ["*a"] * 20000) + "]"
    line = error_of(base(), {"SOAKD__TARGETS__0__EXTRA_BODY__X": value})
    assert line.startswith("SOAKD__TARGETS__0__EXTRA_BODY__X: ")
    assert "over 100,000 values once its YAML aliases are expanded" in line
