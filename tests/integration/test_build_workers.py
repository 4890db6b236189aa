"""A sender worker builds its requests' text itself (soakd/workload/build.py): what the
server counts of each prompt a real worker process sent is what this process would have
built for the same seq, before and after a calibration the worker got mid-run in a
CALIBRATE frame, and after it was started again."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakd.config import TargetConfig, TokenLength, Workload
from soakd.model import Outcome, RequestSpec
from soakd.profiles import get_profile
from soakd.sim.server import start_sim
from soakd.workers.pool import WorkerPool
from soakd.workload.build import Builder
from soakd.workload.calibration import Calibration
from tests.waiting import until

pytestmark = pytest.mark.integration


async def test_a_worker_sends_the_text_this_process_would_build(tmp_path: Path) -> None:
    sim = await start_sim("127.0.0.1", 0, get_profile("fast"), "m")
    wl = Workload(seed=4, prompts={"input_tokens": TokenLength(dist="uniform", min=8, max=90)})  # type: ignore[arg-type]
    here = Builder(wl)
    pool = WorkerPool(
        1, [TargetConfig(name="s", base_url=sim.url, model="m")], "r", tmp_path, workload=wl
    )
    try:
        await pool.start()

        async def served(seqs: range) -> list[int | None]:
            out = []
            for seq in seqs:
                o = Outcome.planned(RequestSpec("s", "p", seq, "", 0, 2, 0.0, 0))
                await pool.send(0, RequestSpec("s", "p", seq, "", 0, 2, 0.0, 0), o)
                out.append(o.prompt_tokens)
            return out

        def words(seqs: range) -> list[int]:  # the simulator counts a word a token
            return [
                len(here.text(RequestSpec("s", "p", q, "", 0, 2, 0.0, 0)).split()) for q in seqs
            ]

        assert await served(range(8)) == words(range(8))
        # a correction from seq 4 on (two tokens a word: half the words), to both
        later = Calibration("usage", "s", None, 2.0, 0.0, 4)
        before = words(range(8))
        pool.calibrate(later)
        here.calibrate(later)
        after = words(range(8))
        assert after[:4] == before[:4]
        assert all(a < b for a, b in zip(after[4:], before[4:], strict=True))
        assert await served(range(8)) == after
        # a worker started again gets every calibration in its HELLO
        worker = pool.workers[0]
        assert worker.proc is not None
        old = worker.proc.pid
        worker.proc.kill()
        await until(lambda: pool.up and worker.proc and worker.proc.pid != old, 20, "a restart")
        assert await served(range(8)) == after
    finally:
        await pool.aclose()
        await sim.aclose()
