"""OOM events by source: error bodies, error bursts before a restart, log lines (and rotation)."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.metrics.run import ProbeMetrics
from soakd.model import ErrorKind, Outcome, Sample
from soakd.probes.oom import OOM_LINE, LogTail, OomWatch, scrub


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watch() -> tuple[OomWatch, CollectorRegistry, Clock, list[Sample]]:
    reg = CollectorRegistry()
    clock = Clock()
    samples: list[Sample] = []
    return OomWatch(ProbeMetrics(reg), ["a", "b"], samples.append, clock=clock), reg, clock, samples


def events(reg: CollectorRegistry, target: str, source: str) -> float | None:
    return reg.get_sample_value(
        "soakd_target_oom_events_total", {"target": target, "source": source}
    )


def failed(target: str, error: ErrorKind, *, oom: bool = False, status: int = 500) -> Outcome:
    return Outcome(
        target=target,
        phase="p",
        seq=1,
        scheduled_ns=0,
        status=status,
        error=error,
        oom=oom,
        error_detail="InternalServerError",
    )


def test_every_counted_source_starts_at_zero_and_xid_is_never_one() -> None:
    _, reg, _, _ = watch()
    for source in ("error_body", "restart_after_errors", "process_vanished", "log"):
        assert events(reg, "a", source) == 0
    assert events(reg, "a", "xid") is None


def test_oom_error_bodies_of_one_crash_are_one_event() -> None:
    w, reg, clock, samples = watch()
    with capture_logs() as logs:
        for _ in range(8):  # every request in flight fails at once
            w.record(failed("a", ErrorKind.HTTP_5XX, oom=True))
        clock.t += 60
        w.record(failed("a", ErrorKind.BAD_RESPONSE, oom=True, status=200))
    assert events(reg, "a", "error_body") == 2
    assert events(reg, "b", "error_body") == 0
    assert [e["event"] for e in logs] == ["oom_event", "oom_event"]
    assert logs[0]["status"] == 500
    assert logs[0]["detail"] == "InternalServerError"
    assert samples[-1] == Sample(
        samples[-1].wall,
        "soakd_target_oom_events_total",
        2.0,
        (("source", "error_body"), ("target", "a")),
    )


def test_error_burst_then_restart() -> None:
    w, reg, clock, _ = watch()
    for _ in range(4):
        w.record(failed("a", ErrorKind.HTTP_5XX))
        clock.t += 1
    w.record(failed("a", ErrorKind.STREAM_TRUNCATED, status=200))
    down = clock.t
    clock.t += 90  # the server reloads its model
    w.on_restart("a", "start_time_changed", down)
    assert events(reg, "a", "restart_after_errors") == 1
    w.on_restart("a", "start_time_changed", clock.t)  # the burst is used up
    assert events(reg, "a", "restart_after_errors") == 1


def test_restart_without_burst_is_no_oom() -> None:
    w, reg, clock, _ = watch()
    w.record(failed("a", ErrorKind.HTTP_5XX))
    w.record(failed("a", ErrorKind.HTTP_429, status=429))
    w.record(failed("a", ErrorKind.CONNECT_REFUSED, status=0))
    w.on_restart("a", "down_then_up", clock.t)
    for _ in range(5):  # a burst long before the down does not count either
        w.record(failed("a", ErrorKind.HTTP_5XX))
    clock.t += 600
    w.on_restart("a", "down_then_up", clock.t)
    assert events(reg, "a", "restart_after_errors") == 0


def test_oom_lines() -> None:
    for line in (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: HIP out of memory",
        "kernel: Out of memory: Killed process 4242 (python3) total-vm:1234kB",
        "kernel: python3 invoked oom-killer: gfp_mask=0x100cca",
        "systemd[1]: vllm.service: A process of this unit has been killed by the OOM killer.",
        "memory cgroup: oom_kill_process+0x10",
    ):
        assert OOM_LINE.search(line), line
    for line in ("INFO: 200 OK", "KV cache usage 95%", "freed memory"):
        assert not OOM_LINE.search(line), line


def test_scrub_masks_keys_and_trims() -> None:
    line = "auth failed Authorization: Bearer sk-abc123XYZ api_key=hunter2 " + "x" * 400
    out = scrub(line)
    assert "abc123" not in out
    assert "hunter2" not in out
    assert len(out) <= 240


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def test_tail_starts_at_the_end_and_follows(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("CUDA out of memory (an old one)\n")
    tail = LogTail(log)
    assert tail.poll() == []
    append(log, "line 1\npartial")
    assert tail.poll() == ["line 1"]
    append(log, " line\n")
    assert tail.poll() == ["partial line"]
    tail.close()


def test_tail_follows_rename_rotation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    tail = LogTail(log)
    tail.poll()
    append(log, "before rotation\n")
    os.rename(log, tmp_path / "server.log.1")
    append(tmp_path / "server.log.1", "last words\n")
    log.write_text("first of the new file\n")
    assert tail.poll() == ["before rotation", "last words", "first of the new file"]
    append(log, "next\n")
    assert tail.poll() == ["next"]
    tail.close()


def test_tail_follows_copytruncate_and_late_files(tmp_path: Path) -> None:
    log = tmp_path / "late.log"
    tail = LogTail(log)
    assert tail.poll() == []  # not there yet
    log.write_text("hello\n")
    assert tail.poll() == ["hello"]  # a new file is read from its start
    append(log, "more text\n")
    assert tail.poll() == ["more text"]
    log.write_text("")  # truncated in place
    tail.poll()
    append(log, "after\n")
    assert tail.poll() == ["after"]
    tail.close()


def test_a_storm_of_oom_replies_counts_once_per_coalesce_window() -> None:
    w, reg, clock, _ = watch()
    for _ in range(30):  # an OOM reply every 0.4 s for 12 s
        w.record(failed("b", ErrorKind.HTTP_5XX, oom=True))
        clock.t += 0.4
    assert events(reg, "b", "error_body") == 3  # at 0, 5.2 and 10.4 s
