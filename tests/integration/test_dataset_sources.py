"""Dataset sources end to end (issue 36): a small Mooncake trace, a ShareGPT file and a
BurstGPT CSV, made here, replayed against a simulator whose answers end at their own EOS
(``fast-eos``, asked with ``ignore_eos``). Each request's served prompt is its record's
planned length (the simulator counts words; Mooncake and BurstGPT prompts are sized by its
/tokenize, ShareGPT's text is sent as it is, its three-letter words planned at 4 characters
a token) and its answer the record's planned length, request by request and in the
report's planned-against-served tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from soakd.config import config_from_dict
from soakd.journal import JournalReader
from soakd.profiles import get_profile
from soakd.report import build_report
from soakd.report.export import records
from soakd.run.app import RunOptions, Soak
from soakd.sim.server import start_sim
from soakd.workload.prompts import Records, make_prompt_source
from tests import dataset_files

pytestmark = pytest.mark.integration

WRITERS = {
    "mooncake": (dataset_files.mooncake, "m.jsonl"),
    "sharegpt": (dataset_files.sharegpt, "s.json"),
    "burstgpt": (dataset_files.burstgpt, "b.csv"),
}


@pytest.mark.parametrize("source", list(WRITERS))
async def test_a_dataset_replays_its_planned_lengths(tmp_path: Path, source: str) -> None:
    write, name = WRITERS[source]
    path = write(tmp_path / name)
    sim = await start_sim("127.0.0.1", 0, get_profile("fast-eos"), "m")
    try:
        cfg = config_from_dict(
            {
                "run": {"name": source, "drain_timeout": "5s"},
                "targets": [{"name": "sim", "base_url": sim.url, "model": "m"}],
                "workload": {"seed": 5, "prompts": {"source": source, "file": str(path)}},
                "phases": [
                    {"name": "p", "duration": "2s", "load": {"mode": "closed", "concurrency": 4}}
                ],
            }
        )
        run_dir = tmp_path / "run"
        soak = Soak(
            cfg, RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False)
        )
        result = await soak.run()
        assert result.completed
    finally:
        await sim.aclose()
    plan = make_prompt_source(cfg.workload)
    assert isinstance(plan, Records)
    with sqlite3.connect(run_dir / "journal.db") as db:
        rows = db.execute(
            "SELECT seq, prompt_tokens, output_tokens FROM requests WHERE error IS NULL"
        ).fetchall()
    assert len(rows) >= 2 * len(plan)  # every record sent, twice at least
    planned_in = sum(plan.length(seq) for seq, _, _ in rows)
    served_in = sum(n for _, n, _ in rows)
    planned_out = sum(plan.output_tokens(seq) or 0 for seq, _, _ in rows)
    served_out = sum(n for _, _, n in rows)
    print(
        f"{source}: {len(rows)} answers; prompt tokens planned {planned_in}, served "
        f"{served_in}; output tokens planned {planned_out}, served {served_out}"
    )
    assert served_out == planned_out  # ignore_eos: each answer the record's length
    assert served_in == pytest.approx(planned_in, rel=0.02)
    report = build_report(run_dir)
    (prompts,) = report.prompt_tokens
    (answers,) = report.output_tokens
    assert prompts.off == pytest.approx(0.0, abs=0.02)
    assert answers.off == pytest.approx(0.0, abs=1e-9)
    assert report.tested is not None
    # the export names each request's record in the dataset, by its file and line
    exported = list(records(JournalReader(run_dir)))
    assert len(exported) >= len(rows)
    for rec in exported:
        assert rec["source_record"] == plan.label(plan.record_of(rec["seq"]))
    assert {r["source_record"] for r in exported} == {plan.label(i) for i in range(len(plan))}
