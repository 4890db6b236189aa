"""Workload, conversations driven: one conversation's turns, sent one after another.

The runner (soakd/workload/runner.py) decides when a conversation starts: a closed-loop
worker starts the next as soon as its last ended, an open-loop arrival starts one. From
there ``Talks`` sends its turns: each turn is one request with its own seq (the target's
counter), its history the answers its server gave, sent the think time after the last
answer; a failed turn ends the conversation or is kept as far as it got, as configured, and
each end is counted (``ConversationTally``; ``soakd_conversations_total``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from soakd.model import Outcome, Phase, RequestSpec
from soakd.types import SendGate
from soakd.workload.conversations import Conversations, ConversationTally, conversation_key

now_ns = time.perf_counter_ns


class Talks:
    """Sends conversations for the runner, whose counters and sends it shares."""

    def __init__(
        self,
        plan: Conversations,
        *,
        seqs: dict[str, int],
        busy: dict[str, int],
        gates: Mapping[str, SendGate],
        one: Callable[[str, RequestSpec], Awaitable[Outcome | None]],
        sleep_until: Callable[[int], Awaitable[bool]],
        stopping: Callable[[], bool],
        max_tokens: int,
        temperature: float,
        on_failure: str = "end",
        on_event: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.plan = plan
        self._seq = seqs
        self._busy = busy
        self._gates = gates
        self._one = one
        self._sleep_until = sleep_until
        self._stopping = stopping
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._end_on_failure = on_failure == "end"
        self._on_event = on_event
        self.counts: dict[str, ConversationTally] = {}
        for name in busy:
            self._seq.setdefault(conversation_key(name), 0)
            self.counts[name] = ConversationTally()

    def spec(
        self,
        name: str,
        phase: Phase,
        conv: int,
        turn: int,
        history: tuple[str, ...],
        context: int,
        scheduled_ns: int,
        deadline_ns: int = 0,
    ) -> RequestSpec:
        """One turn's request: numbered by the target's seq, its text left to the sender's
        builder (the user turns from (conv, turn), the answers in ``history``)."""
        seq = self._seq[name]
        self._seq[name] = seq + 1
        plan = self.plan
        answer = plan.answer_tokens(conv, turn)
        return RequestSpec(
            name,
            phase.name,
            seq,
            "",
            context,
            answer or self.max_tokens,
            self.temperature,
            scheduled_ns,
            deadline_ns,
            answer is not None,
            conv,
            turn,
            turn + 1 < plan.turns(conv),  # the next turn holds this answer
            history,
        )

    async def run(
        self, name: str, current: Callable[[], Phase | None], first_ns: int, deadline_ns: int = 0
    ) -> Outcome | None:
        """Run the target's next conversation, turn after turn. Returns the last turn's
        outcome (None: not sent). ``current()``: the phase the next turn is sent in (None:
        the load it belongs to has ended); the first turn is due at ``first_ns`` (by
        ``deadline_ns``: an open-loop arrival's), each later one the think time after the
        answer before it."""
        phase = current()
        if phase is None:  # its load ended before its first turn went: none started
            return None
        key = conversation_key(name)
        conv = self._seq[key]
        self._seq[key] = conv + 1
        self._count(name, "started", "")
        try:
            outcome, ended = await self._turns(name, conv, current, phase, first_ns, deadline_ns)
        except asyncio.CancelledError:  # the drain deadline cut a turn: counted, then gone
            self._count(name, "ended_early", "stopped")
            raise
        self._count(name, "ended_early" if ended else "finished", ended)
        return outcome

    async def _turns(
        self,
        name: str,
        conv: int,
        current: Callable[[], Phase | None],
        phase: Phase,
        scheduled: int,
        deadline_ns: int,
    ) -> tuple[Outcome | None, str]:
        """Send the conversation's turns: its last outcome, and why it ended early ("":
        every turn sent)."""
        plan = self.plan
        gate = self._gates.get(name)
        history: list[str] = []
        context = 0  # the planned prompt tokens: the user turns, and the answers served
        outcome: Outcome | None = None
        ended = ""
        for turn in range(plan.turns(conv)):
            if turn:
                await self._sleep_until(now_ns() + int(plan.think_s(conv, turn) * 1e9))
                while gate is not None and (wait := gate.delay_s()) > 0 and not self._stopping():
                    await self._sleep_until(now_ns() + int(min(wait, 1.0) * 1e9))
                now = current()
                if self._stopping() or now is None:
                    ended = "stopped" if self._stopping() else "phase_ended"
                    break
                phase = now
                if gate is not None:
                    gate.sent()
                scheduled, deadline_ns = now_ns(), 0
            context += plan.user_tokens(conv, turn)
            spec = self.spec(
                name, phase, conv, turn, tuple(history), context, scheduled, deadline_ns
            )
            self._busy[name] += 1
            try:
                outcome = await self._one(name, spec)
            finally:
                self._busy[name] -= 1
            if outcome is None:
                ended = "not_sent"
                break
            if outcome.error is not None and self._end_on_failure:
                ended = outcome.error.value
                break
            history.append(outcome.answer or "")
            context += outcome.output_tokens or 0
        return outcome, ended

    def _count(self, name: str, event: str, reason: str) -> None:
        tally = self.counts[name]
        if event == "started":
            tally.started += 1
        elif event == "finished":
            tally.finished += 1
        else:
            tally.ended[reason] = tally.ended.get(reason, 0) + 1
        if self._on_event is not None:
            self._on_event(name, event, reason)
