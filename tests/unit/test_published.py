"""What the exporter's thread reads of a run: only the frozen RunState the run loop last
published on the Board (soakd/run/status.py, soakd/http.py), never the run's objects."""

from __future__ import annotations

import time
from dataclasses import FrozenInstanceError, replace

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from soakd.http import Board, start_http
from soakd.run.status import STALL_S, RunState, Status
from tests.unit.test_live import status


def state(st: Status, *, ready: bool = True, ticked: float | None = None) -> RunState:
    return RunState(st, ready, ticked)


def test_a_published_state_is_frozen_and_its_document_shares_nothing() -> None:
    published = state(status())
    with pytest.raises(FrozenInstanceError):
        published.ready = False  # type: ignore[misc]
    doc = published.status_doc()
    doc["in_flight"]["edge-vllm-4gb"] = 0
    doc["targets"]["cloud-gpt"]["errors"] = 99
    assert published.status.in_flight["edge-vllm-4gb"] == 8
    assert published.status.targets["cloud-gpt"]["errors"] == 3


def test_healthz_says_stalled_from_the_last_tick_the_state_carries() -> None:
    assert state(status(), ticked=None).stalled() is None  # starting: not ticking yet
    assert state(status(), ticked=time.monotonic()).stalled() is None
    old = state(status(), ticked=time.monotonic() - STALL_S - 5)
    assert (old.stalled() or "").startswith("run loop stalled for 3")


async def test_the_exporter_serves_the_last_published_state() -> None:
    board = Board(state(status(), ready=False))
    http = await start_http("127.0.0.1", 0, CollectorRegistry(), board)
    try:
        async with aiohttp.ClientSession() as session:

            async def get(path: str) -> tuple[int, str]:
                async with session.get(http.url + path) as resp:
                    return resp.status, await resp.text()

            assert (await get("/readyz"))[0] == 503
            async with session.get(http.url + "/status") as resp:
                assert (await resp.json())["elapsed_s"] == 125.0
            board.publish(state(replace(status(), elapsed_s=126.0), ready=True))
            assert (await get("/readyz"))[0] == 200
            async with session.get(http.url + "/status") as resp:
                doc = await resp.json()
            assert doc["elapsed_s"] == 126.0
            assert list(doc) == [f for f in Status.__dataclass_fields__]
            board.publish(state(status(), ticked=time.monotonic() - STALL_S - 1))
            code, text = await get("/healthz")
            assert code == 503
            assert text.startswith("run loop stalled")
    finally:
        await http.aclose()
