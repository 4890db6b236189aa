"""The report's rows are made of values (soakd/report/rows.py, decisions.py): each part is a
function of its inputs, none fills a row another part made, so a part may be asked in any
order, or twice, with the same answer. Checked on the fixed journal of the golden report."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from soakd.journal import JournalReader
from soakd.journal.stored import StoredConfig
from soakd.measure.goodput import Tally
from soakd.report.decisions import Verdicts, judging, verdicts, with_goodput
from soakd.report.model import Row
from soakd.report.rows import (
    REHEARSAL_NOTE,
    Counts,
    Frame,
    Money,
    Rows,
    measured,
    request_rows,
)
from soakd.report.samples import Vram

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "report-golden"


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Rows:
    d = tmp_path_factory.mktemp("rows")
    for name in ("journal.db", "journal.mark"):
        shutil.copy(GOLDEN / name, d / name)
    with JournalReader(d) as reader:
        span_ns = reader.span_ns()
        rollups, totals, missed = reader.rollups(span_ns=span_ns), reader.totals(), reader.missed()
    halves = {"warm": 1800.0, "hot": 1800.0}
    frame = Frame(["alpha", "beta"], ["warm", "hot"], 3600.0, halves, 300.0, span_ns / 1e9)
    first = request_rows(frame, rollups, totals, missed)
    assert request_rows(frame, rollups, totals, missed) == first  # asked twice: the same
    return first


def test_offered_is_sent_and_not_made_from_one_function(rows: Rows) -> None:
    for row in rows:
        assert row.missed == sum(row.missed_by_reason.values())
        assert row.offered == row.requests + row.missed
    for target in ("alpha", "beta"):
        whole, *phases = rows.of(target)
        assert whole.missed == sum(p.missed for p in phases)
    assert rows.overall["beta"].missed_by_reason == {
        "in_flight_cap": 11,
        "spend_cap": 9,
        "no_worker": 2,
    }


def test_a_row_is_made_new_never_filled(rows: Rows) -> None:
    before = copy.deepcopy(rows)
    counts = Counts(restarts=1, oom_events=0)
    vram = Vram(4e9, 5e6, None)
    money = Money(10.0, False, 2.0, 1.5, "2/h", 0.1, 99.0)
    row = rows.overall["alpha"]
    made = measured(row, counts, vram, money, rehearsal=False)
    assert made is not row
    assert (made.restarts, made.vram_peak_bytes, made.cost_per_month) == (1, 4e9, 99.0)
    assert (made.requests, made.offered) == (row.requests, row.offered)
    rehearsed = measured(row, counts, vram, money, rehearsal=True)
    assert rehearsed.cost_per_month is None  # a month of a compressed plan: made up
    assert (rehearsed.leak_bytes_per_hour, rehearsed.leak_note) == (None, REHEARSAL_NOTE)
    assert rows == before  # nothing written into the rows it was made from


def test_verdicts_are_a_function_of_the_rows(rows: Rows) -> None:
    config = StoredConfig.model_validate(
        {"targets": [{"name": "alpha"}, {"name": "beta"}], "slo": {"e2e_p99": "9s"}}
    )
    judged = judging(config, ["alpha", "beta"])
    tallies = {t: (Tally(sent=10, ok=9, good=8), {}) for t in ("alpha", "beta")}
    once: Verdicts = verdicts(rows, ["alpha", "beta"], judged.slos, tallies)
    assert verdicts(rows, ["alpha", "beta"], judged.slos, tallies) == once
    final = rows.map(lambda r: with_goodput(r, once.of(r)))
    assert all(r.goodput is None for r in rows)  # the rows judged are left as they were
    row: Row = final.overall["alpha"]
    assert row.goodput == once.whole["alpha"].goodput == 0.8
    assert list(final.by_phase) == list(rows.by_phase)  # the report's order kept
