"""Workers room, connection reuse: the statuses after which each target closes its
connections without saying so, as every sender's pools learned them."""

from __future__ import annotations

from collections.abc import Callable


class NoReuse:
    """The statuses after which each target closes its connections without saying so, as
    the senders' pools learned them (soakd/targets/pool.py): this process's, or each
    worker's own (``sender`` is the worker's index). A status counts while any sender
    holds it; ``on_change(target, status, closes)`` hears when that changes."""

    def __init__(self, on_change: Callable[[str, int, bool], None] | None = None) -> None:
        self._held: dict[str, dict[int, set[int]]] = {}  # target -> status -> senders
        self._on_change = on_change

    def learned(self, target: str, sender: int, status: int, closes: bool) -> None:
        holders = self._held.setdefault(target, {}).setdefault(status, set())
        before = bool(holders)
        if closes:
            holders.add(sender)
        else:
            holders.discard(sender)
        if bool(holders) != before and self._on_change is not None:
            self._on_change(target, status, closes)

    def forget(self, sender: int) -> None:
        """A worker is gone: what its pools learned went with them (a new one learns again)."""
        for target, by_status in self._held.items():
            for status, holders in by_status.items():
                if sender in holders:
                    self.learned(target, sender, status, False)

    def status(self) -> dict[str, list[int]]:
        """For /status: per target that closes after some answers, those statuses."""
        out = {t: sorted(s for s, held in by.items() if held) for t, by in self._held.items()}
        return {t: statuses for t, statuses in out.items() if statuses}
