"""``soakd check``: several files at once, every problem of each on its own line with its
field path written one way, a hint for a misspelled key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from soakd.cli import main

GOOD = {
    "targets": [{"name": "sim", "simulator": "fast"}],
    "phases": [{"name": "p", "duration": "1m"}],
}


def write(path: Path, doc: dict) -> Path:  # type: ignore[type-arg]
    path.write_text(yaml.safe_dump(doc))
    return path


def test_several_files_each_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a.yaml", GOOD)
    b = write(tmp_path / "b.yaml", GOOD)
    assert main(["check", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"{a}: ok" in out
    assert f"{b}: ok" in out


def test_every_problem_on_its_own_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(
        tmp_path / "bad.yaml",
        {
            "targets": [
                {
                    "name": "cloud",
                    "base_url": "http://127.0.0.1:1",
                    "modle": "m",
                    "timeouts": {"ttft": "0s"},
                }
            ],
            "phases": [{"name": "steady", "duration": "72x"}],
        },
    )
    good = write(tmp_path / "good.yaml", GOOD)
    assert main(["check", str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{good}: ok" in captured.out
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith(f"soakd: error: {bad}: ")
    assert all(line.startswith("  ") for line in lines[1:])  # one error, its problems under it
    text = captured.err
    assert "targets[cloud].modle: unknown key (did you mean 'model'?)" in text
    assert "targets[cloud].timeouts.ttft" in text
    assert "phases[steady].duration" in text
    assert len(lines) == 3


def test_a_missing_key_reference_uses_the_same_path_style(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SOAKD_TEST_NO_SUCH_KEY", raising=False)
    cfg = write(
        tmp_path / "c.yaml",
        {
            "targets": [
                {
                    "name": "cloud",
                    "base_url": "http://127.0.0.1:1",
                    "api_key_env": "SOAKD_TEST_NO_SUCH_KEY",
                }
            ],
            "phases": [{"name": "p", "duration": "1m"}],
        },
    )
    assert main(["check", str(cfg)]) == 2
    assert "targets[cloud].api_key_env: environment variable SOAKD_TEST_NO_SUCH_KEY" in (
        capsys.readouterr().err
    )


def test_prompt_sizing_is_shown_and_a_bad_tokenizer_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tokenizers")
    from tests.tiny_tokenizer import train

    tok = train(tmp_path)
    sized = write(
        tmp_path / "sized.yaml",
        GOOD | {"workload": {"tokenizer": str(tok), "prompts": {"input_tokens": {"mean": 300}}}},
    )
    assert main(["check", str(sized)]) == 0
    out = capsys.readouterr().out
    assert "prompts: synthetic, fixed 300 tokens, seed 0" in out
    assert f"sizing: tokenizer {tok}: " in out
    assert "planned 300 -> " in out
    off = write(tmp_path / "off.yaml", GOOD | {"workload": {"calibrate": "off"}})
    assert main(["check", str(off)]) == 0
    assert "sizing: off (workload.calibrate): a word a token" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    bad = write(tmp_path / "bad.yaml", GOOD | {"workload": {"tokenizer": str(broken)}})
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"soakd: error: workload.tokenizer: {broken} is not a tokenizer.json")
    wrong = write(tmp_path / "wrong.yaml", GOOD | {"workload": {"calibrate": "sometimes"}})
    assert main(["check", str(wrong)]) == 2
    assert "workload.calibrate" in capsys.readouterr().err


# --- check and run agree (issue 30): what run reads before it starts, check reads too ----


def starts_with(tmp_path: Path, target: dict, **more: object) -> Path:  # type: ignore[type-arg]
    doc = {
        "targets": [{"name": "cloud", "base_url": "https://127.0.0.1:8443", **target}],
        "phases": [{"name": "p", "duration": "1m"}],
        "gpu": {"source": "none"},
        **more,
    }
    return write(tmp_path / "c.yaml", doc)


def check_and_run(cfg: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The error lines of `soakd check` and of `soakd run` (which must not touch its run dir)."""
    assert main(["check", str(cfg)]) == 2
    checked = capsys.readouterr().err
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["run", str(cfg), "--run-dir", str(run_dir), "--no-live"])
    assert info.value.code == 2
    ran = capsys.readouterr().err
    assert checked == ran  # the same lines, word for word
    assert not run_dir.exists()  # refused before a journal could be made (and "resumed")
    return ran.strip().splitlines()


def test_a_missing_ca_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = starts_with(tmp_path, {"tls": {"ca_file": str(tmp_path / "ca.pem")}})
    (line,) = check_and_run(cfg, tmp_path, capsys)
    assert line == (
        f"soakd: error: targets[cloud].tls.ca_file: cannot load {tmp_path / 'ca.pem'}: "
        "No such file or directory"
    )


def test_a_missing_prompt_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = {"source": "file", "file": str(tmp_path / "p.jsonl")}
    cfg = starts_with(tmp_path, {}, workload={"prompts": prompts})
    (line,) = check_and_run(cfg, tmp_path, capsys)
    assert line.startswith("soakd: error: workload.prompts.file: cannot read ")


def test_a_prompt_past_the_longest_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n{"prompt": "' + "word " * 900_000 + '"}\n')
    cfg = starts_with(tmp_path, {}, workload={"prompts": {"source": "file", "file": str(path)}})
    (line,) = check_and_run(cfg, tmp_path, capsys)
    assert line == (
        f"soakd: error: workload.prompts.file: {path}:2: a prompt of 4,500,000 characters, "
        "~1,125,000 tokens (at most 1,048,576)"
    )


def test_a_key_no_header_can_carry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOAKD_TEST_KEY", "sk-abc\r\nX-Injected: 1")
    key_file = tmp_path / "key"
    key_file.write_bytes(b"\xff\xfesk")
    cfg = write(
        tmp_path / "c.yaml",
        {
            "targets": [
                {"name": "a", "base_url": "http://127.0.0.1:1", "api_key_env": "SOAKD_TEST_KEY"},
                {"name": "b", "base_url": "http://127.0.0.1:1", "api_key_file": str(key_file)},
            ],
            "phases": [{"name": "p", "duration": "1m"}],
        },
    )
    lines = check_and_run(cfg, tmp_path, capsys)
    assert lines == [
        "soakd: error: targets[a].api_key_env: the key in environment variable SOAKD_TEST_KEY "
        "holds a carriage return (CR) at position 7: no header can carry it",
        f"  targets[b].api_key_file: cannot read {key_file}: not UTF-8 text",
    ]
    assert "sk-abc" not in "".join(lines)


@pytest.mark.parametrize("proxy", ["http://[bad", "http://proxy.example:99999", "notaurl"])
def test_a_proxy_from_the_environment_that_cannot_be_used(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    proxy: str,
) -> None:
    """Before: a traceback at the first request ([bad, :99999), or a run that never ends
    ("notaurl": every request failed without the loop ever turning, deaf to SIGTERM)."""
    for var in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    cfg = starts_with(tmp_path, {})
    (line,) = check_and_run(cfg, tmp_path, capsys)
    assert line.startswith(
        "soakd: error: targets[cloud]: the proxy the environment names for it "
        "(HTTP_PROXY, HTTPS_PROXY) cannot be used: "
    )


def test_an_oom_log_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: check ok, then the run's OOM probe failed every 5 s with a traceback."""
    cfg = starts_with(tmp_path, {"oom_log": str(tmp_path)})
    (line,) = check_and_run(cfg, tmp_path, capsys)
    assert line == f"soakd: error: targets[cloud].oom_log: {tmp_path} is a directory"


def test_a_rehearsal_longer_than_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(tmp_path / "c.yaml", GOOD)
    expected = (
        "soakd: error: --rehearse: 5m is longer than the plan (1m): a rehearsal compresses "
        "the plan; run it as it is, or rehearse in less time\n"
    )
    assert main(["check", str(cfg), "--rehearse", "5m"]) == 2
    assert capsys.readouterr().err == expected
    with pytest.raises(SystemExit):
        main(["run", str(cfg), "--rehearse", "5m", "--run-dir", str(tmp_path / "r"), "--no-live"])
    assert capsys.readouterr().err == expected
    assert not (tmp_path / "r").exists()
    assert main(["check", str(cfg), "--rehearse", "1m"]) == 0  # as long as the plan: fine
