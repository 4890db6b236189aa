"""What the report and a resume read of the run a journal stored (soakd/journal/stored.py):
an old stored config still reads (its keys upgraded), a newer one's extra keys are
ignored, a key the report cannot do without is a clear error, never an empty report, and
a key an older soakd did not write takes its documented default."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.cli import main
from soakd.config import JournalConfig, Workload
from soakd.config.slo import DISPATCH_LAG_S, AlertLimits
from soakd.journal import JournalError, read_resume_state
from soakd.journal.records import CalibrationStage, PromptCalibration
from soakd.journal.stored import (
    StoredConfig,
    StoredJournal,
    StoredRun,
    StoredWorkload,
    read_core,
    read_stored,
    upgrade,
)
from soakd.report import build_report
from tests.journal_fixtures import FakeClock, config, open_test_journal

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "report-golden"

Doc = dict[str, Any]


def golden_meta() -> Doc:
    """The fixed journal's meta, read in place (immutable: no -wal or -shm file beside it)."""
    conn = sqlite3.connect(f"file:{GOLDEN / 'journal.db'}?mode=ro&immutable=1", uri=True)
    try:
        return {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    finally:
        conn.close()


def copy_golden(d: Path, change: Callable[[Doc], None] | None = None) -> Path:
    """The fixed journal of the golden report, its stored config changed by ``change``."""
    d.mkdir(parents=True)
    for name in ("journal.db", "journal.mark"):
        shutil.copy(GOLDEN / name, d / name)
    if change is not None:
        rewrite_config(d / "journal.db", change)
    return d


def rewrite_config(db: Path, change: Callable[[Doc], None]) -> None:
    conn = sqlite3.connect(db)
    try:
        (text,) = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
        doc = json.loads(text)
        change(doc)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'config'", (json.dumps(doc),))
        conn.commit()
    finally:
        conn.close()


def v1_config(doc: Doc) -> None:
    """The config as a soakd of journal schema v1 stored it: the alert lines in
    exporter.thresholds, no slo, alert_limits or compare, none of the keys added since."""
    for key in ("slo", "alert_limits", "compare"):
        doc.pop(key)
    doc["exporter"]["thresholds"] = {
        "vram_limit_bytes": 3.9e9,
        "vram_leak_bytes_per_hour": 50e6,
        "error_ratio": 0.003,
        "jitter_ratio": 0.15,
        "dispatch_lag_seconds": 0.001,
    }
    doc["workload"].pop("calibrate")
    doc["run"].pop("site")
    for t in doc["targets"]:
        for key in ("slo", "gateway", "kind", "deployment", "traceparent", "failing"):
            t.pop(key, None)


def test_the_golden_journal_reads_typed() -> None:
    stored = read_stored(golden_meta())
    assert stored.run_id == "golden-1"
    assert [t.name for t in stored.config.targets] == ["alpha", "beta"]
    assert [t.guarded for t in stored.config.targets] == [False, True]
    assert stored.config.alert_limits.dispatch_lag == 0.05
    assert stored.config.workload.prompts.input_tokens.mean == 120
    assert stored.config.workload.calibrate == "auto"
    assert [p.name for p in stored.plan.phases] == ["warm", "hot"]
    assert stored.plan.phases[1].loads["beta"].rate_end == 6.0
    assert stored.plan.end_s == 3600.0


def test_keys_a_newer_soakd_adds_are_ignored() -> None:
    meta = golden_meta()
    meta["config"]["targets"][0]["a_later_key"] = {"x": 1}
    meta["config"]["a_later_section"] = [1, 2]
    meta["a_later_meta_key"] = 3
    stored = read_stored(meta)
    assert stored.config.targets[0].name == "alpha"


def test_an_old_stored_config_still_reads_upgraded() -> None:
    """v1: ``exporter.thresholds.dispatch_lag_seconds`` is ``alert_limits.dispatch_lag``
    now; the other thresholds become no SLO; the keys added since take their defaults."""
    meta = golden_meta()
    v1_config(meta["config"])
    stored = read_stored(meta)
    assert stored.config.alert_limits.dispatch_lag == 0.001
    assert stored.config.slo is None
    assert stored.config.compare is None
    assert stored.config.workload.calibrate is None  # goes on as it ran (app.py)
    assert stored.config.run.site is None
    assert [t.kind for t in stored.config.targets] == ["openai", "openai"]
    assert not any(t.guarded for t in stored.config.targets)
    assert "alert_limits" not in meta["config"]  # a copy is upgraded, never the document
    assert upgrade(upgrade(meta["config"])) == upgrade(meta["config"])  # a step runs once


def test_the_report_of_an_old_stored_config(tmp_path: Path) -> None:
    """The report of a v1 config: the migrated dispatch lag makes both targets
    client-limited (1 ms), no verdicts (no slo), the figures as before."""
    golden = build_report(copy_golden(tmp_path / "now"))
    old = build_report(copy_golden(tmp_path / "v1", v1_config))
    assert old.overall["alpha"].requests == golden.overall["alpha"].requests
    assert old.overall["beta"].latency_ms == golden.overall["beta"].latency_ms
    assert old.targets == golden.targets
    assert sum("CLIENT-LIMITED" in n and "limit 1.00 ms" in n for n in old.notes) == 2
    assert old.passed is None  # nothing judged
    assert old.comparison is None
    assert old.tested is not None
    assert [x.gateway for x in old.tested.targets] == [False, False]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda doc: doc.__setitem__("target", doc.pop("targets")), "config.targets"),
        (lambda doc: doc["targets"][1].pop("name"), "config.targets.1.name"),
    ],
)
def test_a_renamed_or_missing_key_is_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[Doc], None],
    named: str,
) -> None:
    """Not silently an empty report ("no verdicts"): the key, in one line, exit 2."""
    run_dir = copy_golden(tmp_path / "run", change)
    with pytest.raises(JournalError, match=f"{named}: Field required"):
        build_report(run_dir)
    with pytest.raises(SystemExit) as exc:
        main(["report", str(run_dir), "--format", "json"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the run it stored cannot be read by this soakd" in err
    assert named in err


def test_a_missing_section_takes_its_documented_default(tmp_path: Path) -> None:
    def older(doc: Doc) -> None:
        for key in ("alert_limits", "report", "gpu", "run"):
            doc.pop(key)

    meta = golden_meta()
    older(meta["config"])
    stored = read_stored(meta)
    assert stored.config.alert_limits.dispatch_lag is None  # DISPATCH_LAG_S, 100 ms
    assert stored.config.gpu.source == "auto"
    rep = build_report(copy_golden(tmp_path / "run", older))
    assert rep.currency == "$"
    assert rep.tested is not None
    assert rep.tested.run_name == ""
    assert rep.tested.node == ""
    assert rep.tested.site is None
    golden = build_report(copy_golden(tmp_path / "golden"))
    assert rep.overall == golden.overall
    assert rep.notes == golden.notes  # no lag near 50 ms or 100 ms
    assert DISPATCH_LAG_S == AlertLimits().dispatch_lag == 0.1


def test_what_the_export_fleet_slowest_and_salvage_read_is_typed() -> None:
    """The keys the export (journal.itl), the trace ids (traceparent), the costs
    (cost.gpus), a fleet (the whole workload) and a salvage (run id, targets, phases,
    window) read, through the model: with the config's defaults where a key is absent."""
    meta = golden_meta()
    stored = read_stored(meta)
    assert stored.config.journal == StoredJournal(**meta["config"]["journal"])
    assert StoredJournal() == StoredJournal(
        itl=JournalConfig().itl, itl_gaps=JournalConfig().itl_gaps
    )
    # every key of the config's workload, in its order: a fleet compares it whole
    assert list(StoredWorkload.model_fields) == list(Workload.model_fields)
    assert stored.config.workload.model_dump(exclude_unset=True) == meta["config"]["workload"]
    traced = {t["name"] for t in meta["config"]["targets"] if t.get("traceparent") is not False}
    assert stored.config.traced() == traced
    core = read_core(meta)
    assert (core.run_id, core.window_ns, core.plan) == (
        stored.run_id,
        stored.window_ns,
        stored.plan,
    )
    assert stored.config_document == meta["config"]  # as stored, for a resume to compare
    del meta["plan"]
    with pytest.raises(ValueError, match="plan: Field required"):
        read_core(meta)


@pytest.mark.parametrize(
    ("cost", "gpus"),
    [
        (None, None),
        ({"per_hour": 2.0}, None),
        ({"gpus": ["0", "1"]}, ["0", "1"]),
        ({"gpus": [0, 1]}, ["0", "1"]),  # written as numbers: the same labels
        ({"gpus": "0"}, None),  # not a list: where its process ran
    ],
)
def test_the_gpus_charged_to_a_target_are_read_typed(
    cost: dict[str, Any] | None, gpus: list[str] | None
) -> None:
    config = StoredConfig.model_validate({"targets": [{"name": "t", "cost": cost}]})
    assert config.targets[0].charged_gpus == gpus
    assert config.targets[0].cost == cost  # the document decisions.py judges by


def test_a_resume_reads_the_stored_run(tmp_path: Path) -> None:
    cfg = config()
    j = open_test_journal(tmp_path / "run", cfg, FakeClock(offset_s=10.0))
    sized = PromptCalibration(CalibrationStage.START, planned=256.0, failed={"alpha": "404"})
    j.event(sized)
    j.close(completed=False)
    db = tmp_path / "run" / "journal.db"
    state = read_resume_state(db)
    assert state is not None
    assert isinstance(state.stored, StoredRun)
    assert state.stored.run_id == state.run_id == "syn-1"
    assert [t.name for t in state.stored.config.targets] == ["alpha", "beta"]
    assert state.created_wall == state.stored.created_wall
    assert state.calibrations == [sized]  # the prompts' sizing, read typed
    rewrite_config(db, lambda doc: doc.pop("targets"))
    with pytest.raises(JournalError, match=r"journal\.db: the run it stored .*config\.targets"):
        read_resume_state(db)


# --- soakd report --config ---------------------------------------------------------------------


def test_report_config_without_a_report_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config`` with only an slo: judged by it, the report section's defaults (as in
    ``Decisions``); through the API too, a document without ``report`` (it raised
    AttributeError there before)."""
    run_dir = copy_golden(tmp_path / "run")
    path = tmp_path / "slo.yaml"
    path.write_text(yaml.safe_dump({"slo": {"e2e_p99": "1ms"}}))
    assert main(["report", str(run_dir), "--config", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["currency"] == "$"
    assert doc["passed"] is False  # 1 ms: every target fails
    assert doc["comparison"] is None  # the file has no compare: none
    rep = build_report(run_dir, judge_by={"slo": {"e2e_p99": 0.001}})
    assert rep.currency == "$"
    assert rep.passed is False
    assert rep.overall["alpha"].cost_basis is None  # the file costs nothing
