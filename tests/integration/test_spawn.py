"""soakd's own children (soakd/spawn.py): up and answering, a child that exits, one that
never answers; each leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from soakd.sim.spawn import spawn_sim
from soakd.spawn import SpawnError, free_port, spawn_soakd

pytestmark = pytest.mark.integration


async def test_a_spawned_simulator_answers_and_stops(tmp_path: Path) -> None:
    sim = await spawn_sim("fast", "m", tmp_path / "sim.log")
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(sim.base_url + "/v1/models") as resp,
        ):
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "m"
    finally:
        await sim.aclose()
    assert sim.proc.returncode is not None
    await sim.aclose()  # twice: nothing left to stop


async def test_a_child_that_exits_fails_the_spawn_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(SpawnError, match=r"simulator exited \(2\): .*no-such-profile"):
        await spawn_sim("no-such-profile", "m", tmp_path / "sim.log")


async def test_a_child_that_never_answers_is_stopped(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(SpawnError, match="did not answer"):
        await spawn_soakd(
            ["sim", "--host", "127.0.0.1", "--port", str(port), "--profile", "fast"],
            what="simulator",
            url=f"http://127.0.0.1:{port}",
            ready_path="/no-such-page",  # 404 for ever
            log_path=tmp_path / "sim.log",
            timeout_s=3.0,
        )
    # it was stopped: the port is free again
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(f"http://127.0.0.1:{port}/health")
