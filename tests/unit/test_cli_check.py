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
