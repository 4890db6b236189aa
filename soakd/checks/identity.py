"""Checks room, identity: what each target's answers say it is, and when that changes.

A kept answer (a check's, a conversation's turn) carries its ``model`` and
``system_fingerprint`` (``Outcome.identity``); no other request pays anything. The first
one seen per target is its identity at start; a different one later is a change (a proxy
that moved the same model name to another model), handed to ``on_change`` once."""

from __future__ import annotations

from collections.abc import Callable

Seen = tuple[str, str]
"""(model, system_fingerprint); "" where the answer carried none."""


class Identities:
    def __init__(self, on_change: Callable[[str, Seen, Seen | None], None]) -> None:
        self._now: dict[str, Seen] = {}
        self._on_change = on_change  # (target, now, before: None at the first)

    def seen(self, target: str, identity: Seen) -> None:
        before = self._now.get(target)
        if before == identity:
            return
        if before is not None and not identity[1] and identity[0] == before[0]:
            return  # the same model, this answer without a fingerprint: no change
        self._now[target] = identity
        self._on_change(target, identity, before)

    def current(self, target: str) -> Seen | None:
        return self._now.get(target)
