"""Probes room, health: per-target up/down and restart detection.

Evidence comes from three places, and a restart is counted once, from the best of it:

- ``process_start_time_seconds`` from the target's /metrics changed: authoritative,
  counted when the scrape sees it, whether or not a down was seen in between.
- Down, then up again, where "down" means nothing listened (connection refused or
  reset, from the health check or from a request): counted at once when no start
  time is known; when one is known, the next scrape decides (a changed start time is
  the restart; the same one means the server never went away: a network blip), and
  if no scrape answers within ``confirm_s`` the down/up alone counts.
- A timeout or a 5xx makes the target down too (``soakd_target_up`` 0), but coming
  back from that is not a restart unless the start time changed: a busy server that
  answered its health check late has not restarted.

Health: any HTTP answer below 500 is up (a 404 from a server without /health still
proves it is there); 5xx, timeouts and connect failures are down.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp
import structlog

from soakd.metrics import names as mn
from soakd.metrics.run import ProbeMetrics
from soakd.model import ErrorKind, Finished, Sample
from soakd.probes._http import Endpoint, fetch
from soakd.probes._ticks import sleep_until_next

log = structlog.get_logger()

START_TIME_TOLERANCE_S = 0.5
"""Start times closer than this are the same process (the value is rounded by the server)."""
HEALTH_TIMEOUT_S = 5.0

RestartListener = Callable[[str, str, float | None], None]
"""``(target, reason, down_since)``: told of every counted restart (monotonic down time)."""


class TargetState:
    """Up/down and restarts of one target. All methods run on the event loop, do no IO
    and are cheap, so request outcomes can feed it directly."""

    def __init__(
        self,
        name: str,
        metrics: ProbeMetrics,
        emit: Callable[[Sample], None],
        *,
        confirm_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.confirm_s = confirm_s
        self.listeners: list[RestartListener] = []
        self.up: bool | None = None
        self.ever_up = False
        self.restarts = 0
        self.start_time: float | None = None  # process_start_time_seconds last seen
        self._emit = emit
        self._clock = clock
        self._wall = wall
        self._down_since: float | None = None
        self._down_ns = 0
        self._down_reason = ""
        self._hard = False  # this down saw a refused/reset connection
        self._counted_while_down = False
        self._pending: float | None = None  # back after a hard down; waiting for a start time
        self._pending_down_since: float | None = None
        self._up_family = metrics.target_up  # the series appears with the first evidence
        self._restarts = metrics.restarts.labels(name)

    # --- evidence ------------------------------------------------------------------------

    def health(self, ok: bool, detail: str, *, hard: bool = False) -> None:
        if ok:
            self._set_up("health", detail)
        else:
            self._set_down("health", detail, hard=hard)

    def record(self, o: Finished) -> None:
        """A finished request: an answer proves up, a refused connect proves down. An answer
        to a request sent before the outage began proves nothing: a server stopping
        gracefully (SIGTERM) finishes its in-flight requests while it refuses new ones."""
        if o.error is None:
            if self.up is False and o.sent_ns < self._down_ns:
                return
            self._set_up("request", "request ok")
        elif o.error is ErrorKind.CONNECT_REFUSED:
            self._set_down("request", "connection refused", hard=True)

    def saw_start_time(self, value: float | None) -> None:
        """A scrape answered; ``value`` is its process_start_time_seconds (None: absent)."""
        pending = self._pending
        if value is None:
            self.start_time = None
            if pending is not None:
                self._pending = None
                self._restart(
                    "down_then_up",
                    self._pending_down_since,
                    evidence="the server does not export its start time",
                )
            return
        old, self.start_time = self.start_time, value
        if old is not None and abs(value - old) > START_TIME_TOLERANCE_S:
            self._pending = None
            since = self._pending_down_since
            self._restart(
                "start_time_changed",
                since if since is not None else self._down_since,
                old_start_time=old,
                new_start_time=value,
            )
        elif pending is not None:
            self._pending = None
            log.info(
                "target_recovered_without_restart",
                target=self.name,
                start_time=value,
                down_for_s=_round(pending - (self._pending_down_since or pending)),
            )
            self._pending_down_since = None

    def tick(self) -> None:
        """Settle a down/up whose start time never came (the scrape stayed silent)."""
        if self._pending is not None and self._clock() - self._pending > self.confirm_s:
            self._pending = None
            self._restart(
                "down_then_up",
                self._pending_down_since,
                evidence=f"no scrape confirmed the start time within {self.confirm_s:g}s",
            )

    # --- transitions ---------------------------------------------------------------------

    def _set_up(self, via: str, detail: str) -> None:
        if self.up is True:
            return
        was_down = self.up is False and self.ever_up
        now = self._clock()
        self.up = True
        self.ever_up = True
        self._up_family.labels(self.name).set(1)
        self._emit_up()
        if not was_down:
            log.info("target_up", target=self.name, via=via, detail=detail)
            self._clear_down()
            return
        down_since = self._down_since if self._down_since is not None else now
        log.info(
            "target_back",
            target=self.name,
            via=via,
            detail=detail,
            down_for_s=_round(now - down_since),
            down_reason=self._down_reason,
        )
        if self._hard and not self._counted_while_down:
            if self.start_time is None:
                self._restart(
                    "down_then_up",
                    down_since,
                    evidence=f"{self._down_reason}, then {detail}",
                    down_for_s=_round(now - down_since),
                )
            else:
                self._pending = now
                self._pending_down_since = down_since
        self._clear_down()

    def _set_down(self, via: str, detail: str, *, hard: bool) -> None:
        if self.up is not False and self._pending is not None and hard:
            # down again before a start time confirmed the "up": it was one outage, not a
            # restart and then another; it goes on from where it began
            since = self._pending_down_since
            self._pending = None
            self.up = False
            self._up_family.labels(self.name).set(0)
            self._emit_up()
            self._down_since = since if since is not None else self._clock()
            self._down_ns = time.perf_counter_ns()
            self._down_reason = f"{via}: {detail}"
            self._hard = True
            self._counted_while_down = False
            return
        if self.up is False:
            if hard and not self._hard:
                self._hard = True
                self._down_reason = f"{via}: {detail}"
            return
        self.up = False
        self._up_family.labels(self.name).set(0)
        self._emit_up()
        self._down_since = self._clock()
        self._down_ns = time.perf_counter_ns()  # requests sent before this prove nothing
        self._down_reason = f"{via}: {detail}"
        self._hard = hard
        self._counted_while_down = False
        log.warning("target_down", target=self.name, via=via, detail=detail)

    def _clear_down(self) -> None:
        self._down_since = None
        self._down_reason = ""
        self._hard = False
        self._counted_while_down = False

    def _restart(self, reason: str, down_since: float | None, **evidence: object) -> None:
        self.restarts += 1
        self._restarts.inc()
        if self.up is False:
            self._counted_while_down = True
        self._pending_down_since = None
        log.warning(
            "target_restarted", target=self.name, reason=reason, restarts=self.restarts, **evidence
        )
        self._emit(
            Sample(
                self._wall(),
                mn.TARGET_RESTARTS_TOTAL,
                float(self.restarts),
                (("target", self.name),),
            )
        )
        for listener in self.listeners:
            listener(self.name, reason, down_since)

    def _emit_up(self) -> None:
        self._emit(
            Sample(self._wall(), mn.TARGET_UP, 1.0 if self.up else 0.0, (("target", self.name),))
        )


async def health_loop(
    state: TargetState, session: aiohttp.ClientSession, ep: Endpoint, interval: float
) -> None:
    """GET the health URL every ``interval`` seconds; feeds ``state``. Runs until cancelled."""
    warned_status: int | None = None
    timeout = min(interval, HEALTH_TIMEOUT_S)
    next_t = time.monotonic()
    while True:
        res = await fetch(session, ep, timeout, attempts=2)
        if res.status and res.status < 500:
            if res.status >= 300 and warned_status != res.status:
                warned_status = res.status
                log.info(
                    "health_url_not_a_health_endpoint",
                    target=state.name,
                    url=ep.shown,
                    status=res.status,
                    note="any answer below 500 counts as up",
                )
            state.health(True, f"HTTP {res.status}")
        else:
            state.health(False, res.error or f"HTTP {res.status}", hard=res.refused)
        state.tick()
        next_t = await sleep_until_next(next_t, interval)


def _round(x: float) -> float:
    return round(x, 3)
