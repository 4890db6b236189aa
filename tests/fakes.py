"""The runner's fakes: a target that answers after a delay, a sink that keeps every
outcome, a prompt source of fixed prompts, and plans built from (name, ms, loads).

Used by tests/unit/test_runner.py, test_runner_gates.py and test_runner_overload.py.
No network: a request is an ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import time

from soakd.model import Outcome, Phase, Plan, RequestSpec
from soakd.shapes import LoadShape
from soakd.workload.prompts import PromptSource

MS = 1_000_000


class FakeTarget:
    """Answers every request after ``delay_s``; remembers what it saw, not the bodies."""

    def __init__(self, name: str, delay_s: float = 0.01) -> None:
        self.name = name
        self.delay_s = delay_s
        self.active = 0
        self.peak = 0
        self.seqs: list[int] = []

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = outcome or Outcome.planned(spec)
        o.sent_ns = time.perf_counter_ns()
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.seqs.append(spec.seq)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.active -= 1
        o.first_token_ns = o.end_ns = time.perf_counter_ns()
        o.status, o.output_tokens = 200, 1
        return o

    async def aclose(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


class Prompts(PromptSource):
    def spec_fields(self, seq: int) -> tuple[str, int]:
        return f"prompt {seq}", 2

    def length(self, seq: int) -> int:
        return 2


def plan_of(*phases: tuple[str, int, dict[str, LoadShape]]) -> Plan:
    out, start = [], 0
    for i, (name, dur_ms, loads) in enumerate(phases):
        out.append(Phase(i, name, start, start + dur_ms * MS, loads))
        start += dur_ms * MS
    return Plan(tuple(out))
