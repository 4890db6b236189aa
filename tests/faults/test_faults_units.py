"""Small, fast guards for the bugs the fault suite found (docs/faults.md, "Found and fixed")."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog

from soakd import logs
from soakd.config import ConfigError, config_from_dict, parse_duration
from soakd.model import Outcome, RequestSpec
from soakd.targets.errors import redact
from soakd.targets.sse import SSEDecoder, SSELineTooLong
from soakd.workload.plan import build_plan
from soakd.workload.prompts import make_prompt_source
from soakd.workload.runner import Runner
from tests.faults.conftest import KEY


def test_sse_event_of_many_short_lines_is_bounded() -> None:
    """100 MB of short ``data:`` lines and never a blank line: stopped at the line limit
    (it used to grow one event without end)."""
    dec = SSEDecoder(max_line=4096)
    line = b"data: " + b"y" * 100 + b"\n"

    def feed_100k() -> None:
        for _ in range(100):
            dec.feed(line * 10)

    with pytest.raises(SSELineTooLong, match="event longer"):
        feed_100k()
    ok = SSEDecoder(max_line=4096)  # an ordinary multi-line event still passes
    assert ok.feed(b"data: a\ndata: b\n\n") == ["a\nb"]


def test_a_key_cut_short_is_still_redacted() -> None:
    """A server echoing the key as an error type: ``_clean`` cuts it to 48 characters,
    which is no longer the whole key, and used to pass the scrub."""
    echoed = f"http 401 {KEY[:48]} {KEY[5:40]}x"
    out = redact(echoed, KEY)
    assert out == "http 401 *** ***"
    assert redact(f"ok {KEY} done", KEY) == "ok *** done"
    assert redact("http 429 rate_limit 429", KEY) == "http 429 rate_limit 429"


@pytest.mark.parametrize("text", ["1e400", "1e400s", "nan", "inf", "-inf", "1e308h"])
def test_non_finite_or_huge_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    from soakd.config import load_config

    path = tmp_path / "bad.yaml"
    path.write_bytes(b"targets: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


def test_bad_yaml_in_an_env_override_is_one_line() -> None:
    raw = {
        "targets": [{"name": "a", "base_url": "http://127.0.0.1:1"}],
        "phases": [{"name": "p", "duration": "1s"}],
    }
    with pytest.raises(ConfigError, match="SOAKD__RUN__NAME: not a YAML value"):
        config_from_dict(raw, {"SOAKD__RUN__NAME": "\x1f"})


def test_a_list_item_named_with_a_newline_is_named_by_index() -> None:
    raw = {
        "targets": [{"name": "a\nb", "base_url": "http://127.0.0.1:1"}],
        "phases": [{"name": "p", "duration": "1s"}],
    }
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("targets[0].name")


def test_log_file_on_a_full_disk_never_raises() -> None:
    """/dev/full: every write fails with ENOSPC, as on a full disk under the run dir."""
    before = logs.dropped_lines
    logs.setup_logging("info", "json", log_file=Path("/dev/full"), console=False)
    try:
        structlog.get_logger().error("journal_write_failed", note="must not raise")
    finally:
        logs.close_logging()
    assert logs.dropped_lines == before + 1


class _Instant:
    name = "t"

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        out = outcome if outcome is not None else Outcome.planned(spec)
        out.sent_ns = out.end_ns = time.perf_counter_ns()
        return out


class _Collect:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, o: Outcome) -> None:
        self.outcomes.append(o)


async def test_open_loop_sends_the_first_instant_of_a_late_started_phase() -> None:
    """The loop is blocked for 50 ms as the phase starts: the instants it missed go out
    late (and their lag is measured) instead of being skipped, as before the fix."""
    cfg = config_from_dict(
        {
            "targets": [{"name": "t", "base_url": "http://127.0.0.1:1"}],
            "phases": [
                {"name": "p", "duration": "500ms", "load": {"mode": "constant", "rate": 100}}
            ],
        }
    )
    plan = build_plan(cfg, datetime.now(UTC))
    sink = _Collect()
    runner = Runner(
        plan,
        {"t": _Instant()},
        make_prompt_source(cfg.workload),
        [sink],
        max_tokens=8,
        temperature=0.0,
        on_phase=lambda p: time.sleep(0.05) if p else None,
    )
    await runner.run()
    await runner.drain(1)
    assert len(sink.outcomes) == 50
    assert max(o.dispatch_lag_ns for o in sink.outcomes) >= 40_000_000
    await asyncio.sleep(0)
