"""The top of every report says what was tested: targets (model, redacted endpoint, api,
stream), the plan, prompt and output sizes planned and served, soakd, host, node, dates;
a rehearsal is stamped as one and projects nothing monthly. Every expected value is read
here from the config the test wrote or counted from the journal's rows."""

from __future__ import annotations

import json
import random
import socket
import statistics
import time
from pathlib import Path

import pytest
from rich.console import Console

from soakd import __version__
from soakd.journal import JournalReader
from soakd.model import Sample
from soakd.report import (
    build_report,
    render_html,
    render_json,
    render_markdown,
    terminal_summary,
)
from tests.journal_fixtures import HOUR, FakeClock, config, open_test_journal, outcome

SECRET = "hunter2-in-the-config"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two targets, one with a key in its metrics URL's query and in a header (a base URL
    takes no query: paths are appended to it), two phases."""
    d = tmp_path_factory.mktemp("tested")
    cfg = config(
        run={"name": "syn", "node": "edge-box-7", "site": "lab-7"},
        targets=[
            {
                "name": "alpha",
                "base_url": "http://127.0.0.1:1/v1",
                "metrics_url": f"http://127.0.0.1:1/metrics?api-key={SECRET}",
                "headers": {"X-Session-Token": SECRET},
                "model": "tiny-1b",
            },
            {
                "name": "beta",
                "base_url": "http://127.0.0.1:2",
                "api": "completions",
                "stream": False,
            },
        ],
        workload={
            "max_tokens": 64,
            "prompts": {"input_tokens": {"dist": "normal", "mean": 200, "stddev": 50, "max": 400}},
        },
    )
    clock = FakeClock(offset_s=HOUR + 1)
    j = open_test_journal(d, cfg, clock)
    rng = random.Random(3)
    for i in range(300):
        end = 1 + i * HOUR / 300
        phase = "warm" if end < HOUR / 2 else "hot"
        for target in ("alpha", "beta"):
            j.record(outcome(rng, clock, target, phase, i, end))
    j.close(completed=True)
    return d


def served(run_dir: Path, target: str) -> tuple[float, float]:
    with JournalReader(run_dir) as r:
        rows = [dict(x) for x in r.request_rows() if x["target"] == target and not x["error"]]
    return (
        statistics.fmean(r["prompt_tokens"] for r in rows),
        statistics.fmean(r["output_tokens"] for r in rows),
    )


def test_the_report_knows_what_was_tested(run_dir: Path) -> None:
    rep = build_report(run_dir)
    t = rep.tested
    assert t is not None
    assert (t.run_name, t.node, t.hosts) == ("syn", "edge-box-7", [socket.gethostname()])
    assert not t.rehearsal
    assert t.configured_plan_s == HOUR
    alpha, beta = t.targets
    assert (alpha.name, alpha.model, alpha.api, alpha.stream) == (
        "alpha",
        "tiny-1b",
        "openai chat",
        True,
    )
    assert (beta.api, beta.stream) == ("openai completions", False)
    assert SECRET not in alpha.endpoint
    assert alpha.endpoint == "http://127.0.0.1:1/v1"
    assert alpha.prompt_tokens_planned == "normal 200 ± 50 (1-400)"
    assert alpha.max_tokens == 64
    for target in (alpha, beta):
        mean_in, mean_out = served(run_dir, target.name)
        assert target.prompt_tokens_served == pytest.approx(mean_in)
        assert target.output_tokens_served == pytest.approx(mean_out)
    assert [(p.name, p.start_s, p.duration_s, p.times) for p in t.phases] == [
        ("warm", 0.0, HOUR / 2, 1),
        ("hot", HOUR / 2, HOUR / 2, 1),
    ]
    assert t.phases[0].loads == {
        "alpha": "closed loop, 2 concurrent",
        "beta": "closed loop, 2 concurrent",
    }
    assert t.phases[1].loads["alpha"] == "poisson 5 req/s"


def test_every_format_says_it_at_the_top(run_dir: Path) -> None:
    rep = build_report(run_dir)
    mean_in, _ = served(run_dir, "alpha")
    md = render_markdown(rep)
    top = md.split("## Verdict")[0].split("## Targets side by side")[0]
    assert f"soakd {__version__} on {socket.gethostname()} (node edge-box-7, site lab-7)" in top
    assert (
        "| alpha | tiny-1b | http://127.0.0.1:1/v1 | "
        f"openai chat | yes | normal 200 ± 50 (1-400) / {mean_in:,.0f} |"
    ) in top
    assert "| beta | soakd-sim | http://127.0.0.1:2 | openai completions | no |" in top
    assert "| warm | 0s | 30m | closed loop, 2 concurrent | closed loop, 2 concurrent |" in top
    assert "| hot | 30m | 30m | poisson 5 req/s | poisson 5 req/s |" in top
    page = render_html(rep)
    head = page.split("Targets side by side")[0]
    assert "What was tested" in head
    assert "tiny-1b" in head
    assert "poisson 5 req/s" in head
    doc = json.loads(render_json(rep))
    assert (doc["tested"]["node"], doc["tested"]["site"]) == ("edge-box-7", "lab-7")
    assert doc["tested"]["targets"][0]["model"] == "tiny-1b"
    assert doc["tested"]["phases"][1]["loads"]["beta"] == "poisson 5 req/s"
    console = Console(width=200, record=True, color_system=None)
    for part in terminal_summary(rep):
        console.print(part)
    text = console.export_text()
    assert "What was tested" in text
    assert "tiny-1b" in text
    for out in (md, page, json.dumps(doc), text):
        assert SECRET not in out


def test_a_rehearsal_is_stamped_and_projects_nothing_monthly(tmp_path: Path) -> None:
    """The hour's plan rehearsed in 2 minutes: stamped everywhere; no cost per month and no
    leak slope from its compressed time (alpha is priced per hour and its GPU memory grows)."""
    cfg = config()
    clock = FakeClock(offset_s=121)
    j = open_test_journal(tmp_path, cfg, clock, rehearse_s=120.0)
    rng = random.Random(5)
    base_wall = time.time() - 121
    for i in range(120):
        phase = "warm" if i < 60 else "hot"
        for target in ("alpha", "beta"):
            j.record(outcome(rng, clock, target, phase, i, 0.5 + i))
        j.sample(
            Sample(
                base_wall + i,
                "soakd_gpu_process_memory_bytes",
                2e9 + 1e6 * i,
                (("gpu", "0"), ("target", "alpha")),
            )
        )
        j.sample(
            Sample(base_wall + i, "soakd_gpu_memory_used_bytes", 2.5e9 + 1e6 * i, (("gpu", "0"),))
        )
    j.close(completed=True)
    rep = build_report(tmp_path)
    assert rep.tested is not None
    assert rep.tested.rehearsal
    assert rep.tested.scale == pytest.approx(120 / HOUR)
    alpha = rep.overall["alpha"]
    assert alpha.cost is not None  # the run's own cost is measured...
    assert alpha.cost_per_month is None  # ...and not projected to a month
    assert alpha.leak_bytes_per_hour is None
    assert alpha.leak_note == "a rehearsal: not projected"
    assert all(g.leak_bytes_per_hour is None for g in rep.gpus)
    md = render_markdown(rep)
    assert md.startswith(f"# soakd report: {rep.run_id} (rehearsal)")
    assert "- REHEARSAL: the 1h plan compressed into 2m00s (1 s stands for 30s" in md
    assert "| warm | 0s | 30m | 1m00s |" in md  # configured, as run
    assert "| cost per month at this load | - | - |" in md
    assert "(rehearsal)</h1>" in render_html(rep)
    assert json.loads(render_json(rep))["tested"]["rehearsal"] is True
