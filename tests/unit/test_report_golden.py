"""The report of a fixed journal, byte for byte: refactoring the journal's vocabulary, the
report's build or the modules' rooms must not change one character a user reads.

tests/data/report-golden holds a journal (tests/report_golden.py wrote it: two sessions,
every event kind the report reads, sends not made for every reason, probe samples) and the
JSON reports ``soakd report`` made of it then. Only the run directories' paths in the fleet
report depend on where the test runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from soakd.cli import main
from tests.report_golden import REPORTS, fleet_args, report_args

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "report-golden"
FILES = ("journal.db", "journal.mark", "judge.yaml")


def copy_run(d: Path) -> Path:
    """The fixed journal, copied (a reader of a WAL journal needs to write beside it)."""
    d.mkdir(parents=True)
    for name in FILES:
        shutil.copy(GOLDEN / name, d / name)
    return d


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_the_report_of_a_fixed_journal_is_unchanged(tmp_path: Path, name: str) -> None:
    run_dir = copy_run(tmp_path / "run")
    out = tmp_path / name
    assert main(report_args(name, run_dir, out)) == 0
    assert out.read_text(encoding="utf-8") == (GOLDEN / name).read_text(encoding="utf-8")


def test_the_fleet_report_of_fixed_journals_is_unchanged(tmp_path: Path) -> None:
    run_dir, twin = copy_run(tmp_path / "run"), copy_run(tmp_path / "twin")
    out = tmp_path / "fleet.json"
    assert main(fleet_args([run_dir, twin], out)) == 0
    text = out.read_text(encoding="utf-8")
    text = text.replace(f'"{twin}"', '"TWIN_DIR"').replace(f'"{run_dir}"', '"RUN_DIR"')
    assert text == (GOLDEN / "fleet.json").read_text(encoding="utf-8")
