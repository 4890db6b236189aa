"""The first minute against real servers. The preflight: the simulator, the hostile server,
a closed port, a name that does not resolve, and (briefly) a real vLLM; each first-run
mistake is one line naming the field, the server sees one request of one token, `soakd
run` ends before the journal opens, and `check --probe` says the same. During the run: a
target failing every request is paused, probed and resumed, and a run in which one never
succeeded exits 3."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from soakd import cli
from soakd.config import TargetConfig, config_from_dict
from soakd.journal import JournalReader, records
from soakd.model import PauseReason
from soakd.profiles import get_profile
from soakd.report import build_report
from soakd.run.app import RunOptions, Soak, StoppedBeforeStart
from soakd.sim.server import SimServer, start_sim
from soakd.sim.spawn import free_port
from soakd.targets.preflight import preflight_one
from tests.hostile_server import HostileServer, serve_hostile
from tests.vllm_server import VllmServer, sum_samples
from tests.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "SOAKD_TEST_PREFLIGHT_KEY"


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = await start_sim("127.0.0.1", 0, get_profile("fast"), "real-model")
    try:
        yield server
    finally:
        await server.aclose()


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with serve_hostile() as server:
        yield server


def target(base_url: str, model: str = "real-model", **extra: Any) -> TargetConfig:
    return TargetConfig(name="t", base_url=base_url, model=model, **extra)


async def served(sim: SimServer) -> tuple[float, float]:
    """The simulator's own count of finished requests and of tokens generated."""
    async with aiohttp.ClientSession() as session, session.get(sim.url + "/metrics") as r:
        text = await r.text()
    finished = sum(
        sum_samples(text, "vllm:request_success_total", finished_reason=why)
        for why in ("stop", "length")
    )
    return finished, sum_samples(text, "vllm:generation_tokens_total")


async def test_a_good_target_passes_with_one_request_of_one_token(sim: SimServer) -> None:
    # a token cap in extra_body would raise the one token: the preflight sets it to 1
    r = await preflight_one(target(sim.url, extra_body={"max_tokens": 64}))
    assert r.ok
    assert not r.warning
    assert r.line.startswith("targets[t]: ok, one token in ")
    assert await served(sim) == (1.0, 1.0)


async def test_a_wrong_model_names_the_field_and_what_the_server_lists(sim: SimServer) -> None:
    r = await preflight_one(target(sim.url, model="real-modle"))
    assert not r.ok
    assert r.line == (
        "targets[t].model: unknown model 'real-modle' (http 404 NotFoundError 404); "
        "the server lists: real-model (did you mean 'real-model'?)"
    )


async def test_nothing_listening() -> None:
    port = free_port()
    r = await preflight_one(target(f"http://127.0.0.1:{port}"))
    assert not r.ok
    assert r.unreached
    assert r.line == (
        f"targets[t].base_url: connection refused at 127.0.0.1:{port}: nothing listens "
        "there (--no-preflight if it comes up later)"
    )


async def test_a_name_that_does_not_resolve() -> None:
    r = await preflight_one(target("http://soakd-preflight.invalid:8000"))
    assert not r.ok
    assert r.line.startswith("targets[t].base_url: cannot resolve soakd-preflight.invalid")


async def test_https_to_a_plain_http_port(sim: SimServer) -> None:
    r = await preflight_one(target(sim.url.replace("http://", "https://")))
    assert not r.ok
    assert r.line.startswith("targets[t].tls: tls handshake failed at 127.0.0.1:")


async def test_a_refused_key_names_where_it_comes_from_never_the_key(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-preflight-" + "x" * 24
    monkeypatch.setenv(KEY_ENV, key)
    before = hostile.stats.requests["echo_key"]
    r = await preflight_one(target(hostile.url("echo_key"), api_key_env=KEY_ENV))
    assert not r.ok
    assert r.line.startswith(
        f"targets[t].api_key_env: POST {hostile.url('echo_key')}/v1/chat/completions "
        f"refused the key in ${KEY_ENV} (http 401"
    )
    assert key[:12] not in r.line  # the server echoed it: scrubbed
    assert hostile.stats.requests["echo_key"] - before == 2  # the models list, one request


@pytest.mark.parametrize(
    ("mode", "line"),
    [
        ("wrong_ctype", "targets[t].api: not an OpenAI answer from POST {url}: expected "
         "text/event-stream, got text/html"),
        ("garbage", "targets[t].api: not an OpenAI answer from POST {url}: invalid http "
         "response: BadStatusLine"),
        ("no_such_mode", "targets[t].model: POST {url} answered http 404: an unknown model "
         "'real-model', or a wrong path in base_url (the server has no models list to "
         "tell which)"),
    ],
)  # fmt: skip
async def test_not_an_openai_server(hostile: HostileServer, mode: str, line: str) -> None:
    r = await preflight_one(target(hostile.url(mode)))
    assert not r.ok
    assert r.line == line.format(url=hostile.url(mode) + "/v1/chat/completions")


@pytest.mark.parametrize("mode", ["s503", "s429", "reset", "stall"])
async def test_the_servers_own_trouble_is_a_warning_not_a_problem(
    hostile: HostileServer, mode: str
) -> None:
    timeouts = {"ttft": "1s", "total": "2s"}
    r = await preflight_one(target(hostile.url(mode), timeouts=timeouts))
    assert r.ok
    assert r.warning
    assert "the server's own trouble, not a setup problem" in r.line


@pytest.mark.parametrize(
    ("mode", "stream", "seen"),
    [
        ("error_200", False, "error body server_error 500"),
        ("error_200", True, "error body server_error 500"),  # JSON where a stream was asked
        ("error_in_stream", True, "stream error server_error 500"),  # after a first token
    ],
)
async def test_an_error_object_coded_500_is_the_servers_own_trouble(
    hostile: HostileServer, mode: str, stream: bool, seen: str
) -> None:
    """A server that sent its 200 before it failed can only say so in the body: code 500
    is a warning, as a 500 status is (it was "not an OpenAI answer", exit 2)."""
    r = await preflight_one(target(hostile.url(mode), stream=stream))
    assert r.ok, r.line
    assert r.warning
    assert r.line == f"targets[t]: {seen}: the server's own trouble, not a setup problem"


@pytest.mark.parametrize(
    ("mode", "stream", "seen"),
    [
        ("error_200_404", False, "error body NotFoundError 404"),
        ("error_200_404", True, "error body NotFoundError 404"),
        ("error_in_stream_404", True, "stream error NotFoundError 404"),
    ],
)
async def test_an_error_object_coded_404_is_an_unknown_model(
    hostile: HostileServer, mode: str, stream: bool, seen: str
) -> None:
    """Coded 404, it is what a 404 status is: a problem naming the model."""
    r = await preflight_one(target(hostile.url(mode), stream=stream))
    assert not r.ok
    url = hostile.url(mode) + "/v1/chat/completions"
    assert r.line == (
        f"targets[t].model: POST {url} answered {seen}: an unknown model 'real-model', or a "
        "wrong path in base_url (the server has no models list to tell which)"
    )


def run_cli(cfg: dict[str, Any], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run(
        [sys.executable, "-m", "soakd", "run", str(path), "--no-live", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def one_target(base_url: str, model: str = "real-model", **extra: Any) -> dict[str, Any]:
    return {
        "run": {"name": "pf", "drain_timeout": "2s"},
        "targets": [{"name": "t", "base_url": base_url, "model": model, **extra}],
        "workload": {"max_tokens": 4, "prompts": {"input_tokens": {"mean": 8}}},
        "gpu": {"source": "none"},
        "exporter": {"listen": "127.0.0.1:0"},
        "phases": [{"name": "p", "duration": "4s", "load": {"mode": "closed", "concurrency": 4}}],
    }


def test_run_ends_before_the_journal_in_one_line(tmp_path: Path) -> None:
    """Nothing listening: one line, exit 2 within seconds, and no run directory a rerun
    could "resume" (the default runs/<id> is not left behind either)."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    done = run_cli(
        one_target(f"http://127.0.0.1:{free_port()}"), tmp_path, "--run-dir", str(run_dir)
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("soakd: error:")]
    assert len(errors) == 1
    assert errors[0].startswith("soakd: error: targets[t].base_url: connection refused at ")
    assert "Traceback" not in done.stderr
    assert not run_dir.exists()
    print(f"\nrefused: exit {done.returncode} after {took:.1f} s")


def test_a_missing_ca_file_ends_the_run_before_anything_starts(tmp_path: Path) -> None:
    """It used to fail once the journal was open: the same command again "resumed" it."""
    run_dir = tmp_path / "run"
    cfg = one_target("https://127.0.0.1:1", tls={"ca_file": str(tmp_path / "ca.pem")})
    done = run_cli(cfg, tmp_path, "--run-dir", str(run_dir))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"soakd: error: targets[t].tls.ca_file: cannot load {tmp_path / 'ca.pem'}: "
        "No such file or directory"
    )
    assert not run_dir.exists()


async def test_run_counts_none_of_the_preflight_and_the_server_saw_one_more(
    sim: SimServer, tmp_path: Path
) -> None:
    """The preflight's request is no outcome: the journal's rows and soakd's counts are
    the run's, the server's count is theirs plus one."""
    run_dir = tmp_path / "run"
    proc = await _run_async(one_target(sim.url), tmp_path, run_dir)
    assert proc[0] == 0, proc[2][-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = summary["targets"]["t"]["requests"]
    assert requests > 0
    finished, _ = await served(sim)
    assert finished == requests + 1
    with JournalReader(run_dir) as journal:
        assert {r["phase"] for r in journal.request_rows(itl=False)} == {"p"}
        pre = [e.event for e in journal.events() if isinstance(e.event, records.Preflight)]
    assert [(p.target, p.ok) for p in pre] == [("t", True)]


async def _run_async(
    cfg: dict[str, Any], tmp_path: Path, run_dir: Path, *args: str
) -> tuple[int, str, str]:
    """`soakd run` as a process, without blocking the loop the simulator runs on."""
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "soakd", "run", str(path), "--no-live", "--run-dir", str(run_dir),
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def test_check_probe_says_what_run_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    cfg = one_target(f"http://127.0.0.1:{port}")
    cfg["targets"].append({"name": "sim", "simulator": "fast", "model": "m"})
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check", str(path), "--probe"]) == 2
    out, err = capsys.readouterr()
    assert f"{path}: ok" in out  # the config itself is fine
    assert "targets[sim]: the simulator soakd starts" in out
    assert err.strip() == (
        f"soakd: error: targets[t].base_url: connection refused at 127.0.0.1:{port}: "
        "nothing listens there (--no-preflight if it comes up later)"
    )
    cfg["targets"][0]["expect_failure"] = True  # meant to fail: said, not fatal
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check", str(path), "--probe"]) == 0
    assert "warning: targets[t].base_url: connection refused" in capsys.readouterr().out


async def test_a_real_vllm_says_404_for_an_unknown_model(vllm: VllmServer) -> None:
    """vLLM's own answers: its models list and a 404 for a model it does not serve."""
    good = await preflight_one(target(vllm.base_url, model=vllm.model))
    assert good.ok, good.line
    assert not good.warning, good.line
    bad = await preflight_one(target(vllm.base_url, model="tiny-llama"))
    assert not bad.ok
    assert bad.line.startswith("targets[t].model: unknown model 'tiny-llama' (http 404")
    assert bad.line.endswith(f"the server lists: {vllm.model}")


# --- during the run: a target failing every request is paused, probed and resumed ----------


async def test_a_target_that_comes_up_later_is_paused_then_resumed(tmp_path: Path) -> None:
    """--no-preflight, nothing listening yet: after failing.after of refused connects the
    target is paused (open-loop sends counted `failing`, named in /status and on
    /metrics), one request at a time probes it, and once a server listens it resumes.
    Every request the server saw is an outcome."""
    port = free_port()
    cfg = one_target(f"http://127.0.0.1:{port}", failing={"after": "0.5s", "max_pause": "1s"})
    cfg["phases"] = [{"name": "p", "duration": "8s", "load": {"mode": "poisson", "rate": 20}}]
    soak = Soak(
        config_from_dict(cfg),
        RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False),
    )
    run = asyncio.create_task(soak.run())
    registry = soak.metrics.registry

    def gauge(cause: str) -> float | None:
        return registry.get_sample_value("soakd_target_failing", {"target": "t", "cause": cause})

    sim = None
    try:
        await until(lambda: "t" in soak.status().failing, 20, "the pause")
        assert soak.status().failing["t"].cause == "connect_refused"
        assert gauge("connect_refused") == 1
        sim = await start_sim("127.0.0.1", port, get_profile("fast"), "real-model")
        await until(lambda: not soak.status().failing, 20, "the resume")
        assert gauge("connect_refused") == 0
        result = await asyncio.wait_for(run, 60)
        finished, _ = await served(sim)
    finally:
        if not run.done():
            run.cancel()
        if sim is not None:
            await sim.aclose()
    assert result.completed
    row = result.summary["t"]
    assert row["ok"] > 0
    assert row["missed_by_reason"]["failing"] > 0
    assert row["offered"] == row["requests"] + row["missed"]
    assert finished == row["ok"]  # nothing sent twice, nothing lost
    with JournalReader(tmp_path / "run") as journal:
        kinds = [
            (type(e.event), e.event.reason)
            for e in journal.events()
            if isinstance(e.event, records.TargetPaused | records.TargetResumed)
        ]
    assert (records.TargetPaused, PauseReason.FAILING) in kinds
    assert (records.TargetResumed, PauseReason.FAILING) in kinds
    rep = build_report(tmp_path / "run")
    assert any(n.startswith("t: paused as failing (connect_refused") for n in rep.notes)


async def test_a_run_where_a_target_never_succeeded_exits_3(sim: SimServer, tmp_path: Path) -> None:
    """A wrong model with --no-preflight: the loop backs off and pauses it, the report says
    it never answered, and `soakd run` exits 3 (0 when the config expects it)."""
    cfg = one_target(sim.url, model="wrong-model", failing={"after": "1s", "max_pause": "1s"})
    code, out, err = await _run_async(cfg, tmp_path, tmp_path / "run", "--no-preflight")
    assert code == 3, err[-2000:]
    assert "soakd: targets[t] never answered a request successfully (http_4xx " in err
    assert "note: t: never answered a request successfully" in out
    assert "paused as failing (http_404" in out
    sent = json.loads((tmp_path / "run" / "summary.json").read_text())["targets"]["t"]
    assert sent["requests"] < 100  # 4 workers backing off, then one probe at a time
    cfg["targets"][0]["expect_failure"] = True
    code, _, err = await _run_async(cfg, tmp_path, tmp_path / "run2", "--no-preflight")
    assert code == 0, err[-2000:]


async def test_a_stop_during_the_preflight_records_nothing(
    hostile: HostileServer, tmp_path: Path
) -> None:
    """A server that reads the request and never answers: a signal during the preflight
    ends the start at once, with no journal and no run directory."""
    run_dir = tmp_path / "run"
    cfg = one_target(hostile.url("no_headers"))
    soak = Soak(
        config_from_dict(cfg),
        RunOptions(run_dir=run_dir, metrics_addr="127.0.0.1:0", console_logs=False, preflight=True),
    )
    before = hostile.stats.requests["no_headers"]
    run = asyncio.create_task(soak.run())
    await until(lambda: hostile.stats.requests["no_headers"] > before, 20, "the models list asked")
    soak._on_signal(signal.SIGTERM)
    with pytest.raises(StoppedBeforeStart):
        await asyncio.wait_for(run, 10)
    assert not run_dir.exists()
