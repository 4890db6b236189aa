"""Bad config and CLI input, fuzzed with hypothesis: never a traceback, always one line
``soakd: error: ...`` naming the field (or the file and line), exit 2."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakd import cli
from soakd.config import ConfigError, config_from_dict, parse_duration

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=int(os.environ.get("SOAKD_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BASE: dict[str, Any] = {
    "run": {"name": "fz", "duration": "1h", "drain_timeout": "5s", "loop": False},
    "targets": [
        {
            "name": "a",
            "base_url": "http://127.0.0.1:8000",
            "api": "chat",
            "stream": True,
            "timeouts": {"connect": "1s", "ttft": "5s", "total": "30s"},
            "headers": {"X-Team": "soak"},
            "extra_body": {"top_p": 0.9},
            "max_connections": 8,
        },
        {"name": "b", "simulator": "fast", "model": "m"},
    ],
    "workload": {
        "max_tokens": 16,
        "temperature": 0.5,
        "seed": 1,
        "prompts": {
            "source": "synthetic",
            "input_tokens": {"dist": "normal", "mean": 64, "stddev": 8, "min": 1, "max": 256},
        },
    },
    "phases": [
        {"name": "warm", "duration": "5m", "load": {"mode": "closed", "concurrency": 2}},
        {
            "name": "ramp",
            "duration": "10m",
            "load": {"mode": "ramp", "rate": 1, "rate_end": 5, "max_in_flight": 8},
            "targets": {"b": {"mode": "poisson", "rate": 2}},
        },
        {"name": "night", "until": "0 6 * * *", "load": {"mode": "constant", "rate": 1}},
    ],
    "exporter": {"listen": "127.0.0.1:9464"},
    "slo": {"error_ratio": 0.01, "ttft_p99": "2s"},
    "gpu": {"source": "none", "interval": "1s", "leak_window": "1h"},
    "probes": {"scrape_interval": "5s", "health_interval": "5s"},
    "logging": {"level": "info", "format": "json"},
    "journal": {"synchronous": "full", "flush_interval": "250ms", "max_bytes": "1GB"},
}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*prefix, i))


PATHS = list(paths(BASE))

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "1e400",
            "1e400s",
            "nan",
            "inf",
            "-inf",
            "-5s",
            "0",
            "0s",
            "1e308h",
            "99999999999999999999d",
            "1h-5m",
            "5x",
            "",
            " ",
            "72h",
            "1.5.5s",
            "0 6 * * *",
            "61 25 * * 8",
            "2026-13-45T99:00",
            "1970-01-01T00:00:00Z",
            "http://",
            "ftp://x",
            "http://u:p@h/",
            "http://127.0.0.1:99999",
            "a\r\nInjected: 1",
            "127.0.0.1:99999",
            "[::1]:1",
            "a" * 300,
            "\x00",
            "é",
            "🙂",
            "${HOME}",
            "~",
            "/dev/null",
        ]
    ),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """cli.main in-process: (exit code, stdout, stderr). A run or sim that would start
    for real raises _Started instead (their inputs were all accepted)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except _Started:
            code = 0
    return code, out.getvalue(), err.getvalue()


class _Started(Exception):
    pass


def _start(*_: Any, **__: Any) -> None:
    raise _Started


@pytest.fixture(autouse=True)
def no_real_runs() -> Iterator[None]:
    with (
        mock.patch("soakd.run.app.Soak", side_effect=_start),
        mock.patch("soakd.sim.server.run_sim", side_effect=_start),
    ):
        yield


def assert_one_line_error(code: int, err: str, *, argv: bool = False) -> str:
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    # argparse echoes a bad argument as given (a CR in it included): lines are "\n" there
    lines = [ln for ln in (err.split("\n") if argv else err.splitlines()) if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, err
    assert all(ln.startswith("usage:") or ln.startswith(" ") or "error:" in ln for ln in lines), (
        err
    )  # argparse adds its usage line, nothing else
    return errors[0]


def name_of(path: tuple[Any, ...]) -> list[str]:
    """How an error line may name this path: its keys (list items by name or index)."""
    names = []
    node: Any = BASE
    for part in path:
        if isinstance(part, int):
            item = node[part]
            names.append(str(item.get("name", part)) if isinstance(item, dict) else str(part))
        else:
            names.append(part)
        node = node[part]
    return names


def set_path(doc: dict[str, Any], path: tuple[Any, ...], value: Any, delete: bool) -> None:
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


@FUZZ
@given(path=st.sampled_from(PATHS), value=junk, delete=st.booleans())
def test_mutated_config_is_one_line_naming_the_field(
    tmp_path: Path, path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    doc = copy.deepcopy(BASE)
    set_path(doc, path, value, delete)
    cfg = tmp_path / "fuzz.yaml"
    cfg.write_text(yaml.safe_dump(doc, allow_unicode=True))
    code, _, err = run_cli(["check", str(cfg)])
    if code == 0:
        return  # still a valid config (check printed the plan)
    line = assert_one_line_error(code, err)
    names = name_of(path)
    # the field, or the section it sits in when a rule spans several fields
    assert any(str(n) in line for n in names[:3]) or str(cfg) in line, (path, line)


@FUZZ
@given(
    key=st.text(alphabet="abcxyz_", min_size=1, max_size=8),
    where=st.sampled_from([p for p in PATHS if isinstance(p[-1], str)]),
)
def test_unknown_keys_are_named(tmp_path: Path, key: str, where: tuple[Any, ...]) -> None:
    doc = copy.deepcopy(BASE)
    node: Any = doc
    for part in where[:-1]:
        node = node[part]
    if (
        not isinstance(node, dict)
        or key in node
        or where[:-1]
        in (("targets", 0, "headers"), ("targets", 0, "extra_body"), ("phases", 1, "targets"))
    ):
        return
    node["zz" + key] = 1
    cfg = tmp_path / "fuzz.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    code, _, err = run_cli(["check", str(cfg)])
    line = assert_one_line_error(code, err)
    assert "zz" + key in line, line
    assert "unknown key" in line, line


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_garbage_files_are_one_line(tmp_path: Path, data: bytes) -> None:
    cfg = tmp_path / "garbage.yaml"
    cfg.write_bytes(data)
    code, _, err = run_cli(["check", str(cfg)])
    if code == 0:
        return
    assert_one_line_error(code, err)


@FUZZ
@given(
    env=st.dictionaries(
        st.sampled_from(
            [
                "SOAKD__RUN__DURATION",
                "SOAKD__TARGETS__A__BASE_URL",
                "SOAKD__TARGETS__9",
                "SOAKD__TARGETS__\u00b2__MODEL",  # str.isdigit() takes it, int() does not
                "SOAKD__TARGETS__0__TIMEOUTS__TTFT",
                "SOAKD__PHASES__WARM__LOAD__RATE",
                "SOAKD__EXPORTER__LISTEN",
                "SOAKD__GPU",
                "SOAKD__",
                "SOAKD____X",
                "SOAKD__RUN__NAME__X",
                "SOAKD__JOURNAL__MAX_BYTES",
                "SOAKD__NOPE",
            ]
        ),
        st.text(max_size=12) | st.sampled_from(["1e400s", "[1, 2]", "{a: 1}", "null", "- x"]),
        max_size=3,
    )
)
def test_env_overrides_are_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    cfg = tmp_path / "base.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    if any("\x00" in v for v in env.values()):
        return  # no such environment can exist
    with mock.patch.dict("os.environ", env):
        code, _, err = run_cli(["check", str(cfg)])
    if code == 0:
        return
    line = assert_one_line_error(code, err)
    sections = {next((p for p in k[7:].split("__") if p), "").lower() for k in env}
    assert any(k in line for k in env) or any(s and s in line for s in sections), line


@pytest.fixture(scope="module")
def valid_config() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ok.yaml"
        path.write_text(yaml.safe_dump(BASE))
        (Path(tmp) / "empty").mkdir()
        (Path(tmp) / "junk").mkdir()
        (Path(tmp) / "junk" / "journal.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
        yield path


FLAGS = [
    "--duration",
    "--rehearse",
    "--metrics-addr",
    "--run-dir",
    "--force",
    "--live",
    "--no-live",
    "--format",
    "-o",
    "--output",
    "--energy-price",
    "--itl",
    "--port",
    "--profile",
    "--host",
    "--model",
    "--version",
    "-h",
]
VALUES = [
    "1e400s",
    "nan",
    "inf",
    "-5s",
    "0",
    "0s",
    "10m",
    "72h",
    "x",
    "",
    "127.0.0.1:0",
    "localhost:99999",
    "[::1]:9464",
    ":80",
    "md",
    "csv",
    "pdf",
    "-1",
    "1e999",
    "/nonexistent/dir",
    "fast",
    "edge-4gb",
    "nope",
    "🙂",
]


@FUZZ
@given(data=st.data())
def test_cli_arguments_are_one_line(valid_config: Path, data: st.DataObject) -> None:
    tmp = valid_config.parent
    command = data.draw(st.sampled_from(["run", "check", "report", "export", "sim", "bogus"]))
    positional = data.draw(
        st.sampled_from(
            [
                str(valid_config),
                str(tmp / "missing.yaml"),
                str(tmp / "empty"),
                str(tmp / "junk"),
                str(tmp),
                "-",
                "",
            ]
        )
    )
    argv = [command] + ([positional] if command != "sim" else [])
    for _ in range(data.draw(st.integers(0, 4))):
        argv.append(data.draw(st.sampled_from(FLAGS)))
        if data.draw(st.booleans()):
            # (no control characters: argparse echoes a bad argument as given)
            printable = st.text(st.characters(blacklist_categories=("Cc", "Zl", "Zp")), max_size=6)
            argv.append(data.draw(st.sampled_from(VALUES) | printable))
    if "-o" in argv or "--output" in argv:
        return  # writes files wherever the fuzzer says: not here
    if "-h" in argv or "--version" in argv:
        return  # prints help and exits 0
    code, _, err = run_cli(argv)
    if code == 0:
        return
    assert_one_line_error(code, err, argv=True)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
def test_parse_duration_is_finite_or_valueerror(value: Any) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert math.isfinite(seconds)
    assert seconds >= 0


def test_duration_overflow_is_named() -> None:
    raw = copy.deepcopy(BASE)
    raw["phases"][0]["duration"] = "1e400s"
    with pytest.raises(ConfigError, match=r"phases\[warm\]\.duration"):
        config_from_dict(raw)
