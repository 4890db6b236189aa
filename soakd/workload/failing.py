"""Workload room, failing targets: one that fails every request in a way no next request can
fix is paused, probed one request at a time, and resumed on the first real answer.

Such a failure says the target cannot serve this run at all: nothing listens (refused),
no connection (DNS, TLS, unreachable, a connect timeout), the key is refused (401/403), or
the model or path is unknown (404). Other failures (5xx, timeouts, cut streams, a 400 for
one prompt) are the server's answers, which a soak measures: they never pause it.

A streak of nothing but such failures for ``failing.after`` pauses the target (``failing``:
open-loop sends not made are counted under it, closed-loop workers wait). When a pause
ends, one request goes (the probe: planned, sent and recorded like any other) and the
target stays paused until its outcome: any answer that is not such a failure resumes the
target; another one pauses it again, twice as long, up to ``failing.max_pause``. The guard
(guard.py) owns one ``FailingWatch`` per target and logs, journals and exports each change.

Pure apart from the clock, which the caller passes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from soakd.config import Failing
from soakd.model import ErrorKind, Finished

__all__ = ["Change", "FailingNow", "FailingWatch", "failing_cause"]

FIRST_PAUSE_S: Final = 2.0
PROBE_WAIT_S: Final = 1.0
"""While the probe is out: how soon a waiting sender looks again."""

_BY_KIND: Final = {
    ErrorKind.CONNECT_REFUSED: "connect_refused",
    ErrorKind.CONNECT_ERROR: "connect_error",
    ErrorKind.TIMEOUT_CONNECT: "timeout_connect",
    ErrorKind.HTTP_AUTH: "http_auth",
}


def failing_cause(o: Finished) -> str | None:
    """The cause when ``o`` is a failure no next request can fix; else None."""
    if o.error is ErrorKind.HTTP_4XX and o.status == 404:
        return "http_404"
    return _BY_KIND.get(o.error) if o.error is not None else None


@dataclass(frozen=True, slots=True)
class Change:
    """A pause that began (``paused``) or ended, for the guard to log and journal."""

    paused: bool
    cause: str
    detail: str  # the last failure's error detail: secret-free, short
    failures: int  # in the streak so far
    seconds: float  # paused: how long the streak lasted; resumed: how long it was paused


@dataclass(frozen=True, slots=True)
class FailingNow:
    """A target paused as failing, as /status and the live view show it."""

    cause: str
    detail: str  # the last failure's error detail: secret-free, short
    next_probe_s: float  # until the next probing request goes (0: it is out)


class FailingWatch:
    """One target's streak of such failures and its pause. See the module docstring."""

    def __init__(self, cfg: Failing) -> None:
        self.after = cfg.after
        self.max_pause = cfg.max_pause
        self.paused = False
        self.cause = ""
        self.detail = ""
        self.failures = 0  # in the current streak
        self.pauses = 0  # pauses begun, whole session
        self._since: float | None = None  # the streak's first failure
        self._paused_at = 0.0
        self._until = 0.0  # the pause ends here; then one probe goes
        self._pause_s = 0.0
        self._probe_out = False

    def delay_s(self, now: float) -> float:
        """0 when a request may go now (none paused, or the probe's turn)."""
        if not self.paused:
            return 0.0
        if self._probe_out:
            return PROBE_WAIT_S
        return max(0.0, self._until - now)

    def next_probe_s(self, now: float) -> float | None:
        """Seconds until the next probe goes (0: it is out); None when not paused."""
        if not self.paused:
            return None
        return 0.0 if self._probe_out else max(0.0, self._until - now)

    def sent(self, now: float) -> None:
        if self.paused and not self._probe_out and now >= self._until:
            self._probe_out = True  # this send is the probe: the others wait for its answer

    def record(self, o: Finished, now: float) -> Change | None:
        cause = failing_cause(o)
        if cause is None:
            self._since = None
            self.failures = 0
            if not self.paused:
                return None
            self.paused = self._probe_out = False
            return Change(False, self.cause, self.detail, 0, now - self._paused_at)
        self.cause, self.detail = cause, o.error_detail
        self.failures += 1
        if self.paused:
            if self._probe_out:  # the probe failed as well: wait twice as long
                self._probe_out = False
                self._pause_s = min(self.max_pause, self._pause_s * 2)
                self._until = now + self._pause_s
            return None  # else one sent before the pause: it says nothing new
        if self._since is None:
            self._since = now
        if self.after is None or now - self._since < self.after:
            return None
        self.paused, self.pauses = True, self.pauses + 1
        self._paused_at = now
        self._pause_s = min(self.max_pause, FIRST_PAUSE_S)
        self._until = now + self._pause_s
        return Change(True, cause, self.detail, self.failures, now - self._since)
