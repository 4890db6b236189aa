"""Seams: only Protocols live here, so code depends on a capability, not a class."""

from __future__ import annotations

from typing import Protocol

from soakd.model import Finished, MissReason, Outcome, RequestSpec


class Target(Protocol):
    """Something that turns a RequestSpec into an Outcome. It never raises: every
    failure is data (``Outcome.error``). It fills ``outcome`` in place as the request
    runs, so a caller cancelling it still holds what arrived. A request that never left
    soakd raises ``NotSent``."""

    name: str

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome: ...

    async def aclose(self) -> None: ...


class NotSent(Exception):
    """What a Target raises when the request never left soakd (no sender process was up):
    the runner counts it as a send not made, under ``reason``, never as an outcome."""

    def __init__(self, reason: MissReason) -> None:
        super().__init__(reason)
        self.reason = reason


class SendGate(Protocol):
    """Whether a target may be sent to now (spend caps, Retry-After pauses). The runner
    asks before every send and reports what it did, in the same step (no await between)."""

    def delay_s(self) -> float:
        """0: send now; else seconds until it may (``inf``: not in this run)."""
        ...

    def sent(self) -> None: ...

    @property
    def pause_reason(self) -> MissReason:
        """Why the target is paused now: the reason an open-loop send not made during the
        pause is counted under."""
        ...


class OutcomeSink(Protocol):
    """A reader of finished requests (the guards, goodput, the probes, the notes, the
    prompt lengths). ``record`` is called on the event loop for every finished request:
    it must not block or do IO. It reads the ``Finished`` view: no ITL gaps, whether a
    sender worker timed the request or soakd did (soakd/model.py)."""

    def record(self, outcome: Finished) -> None: ...


class OutcomeRecorder(Protocol):
    """The one reader of the whole ``Outcome``, ITL gaps and record included: the
    journal (soakd/journal/), which keeps every request. Same rules as an OutcomeSink."""

    def record(self, outcome: Outcome) -> None: ...
