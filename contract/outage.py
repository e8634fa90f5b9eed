"""Riding out a Redis that went away for a while (a restart, a failover, a dropped connection).

Every process — worker, jobs, each gateway, the terminal chat — treats the same errors as
transient (:data:`TRANSIENT`: a refused or dropped connection, a timeout, a server still loading
its data, ``LOADING``) and handles them the same way, with an :class:`Outage`:

- each failed try logs ``redis.unreachable`` with the delay before the next one (``retry_in``:
  1 s, doubling up to :data:`REDIS_CAP`), and the process waits it out;
- the first success after a failure logs ``redis.reconnected`` with how long Redis was away.

Nothing here reconnects by itself: redis-py reconnects a pooled connection on the next command.
Clients are made without redis-py's own retries (:func:`contract.bus.connect`), because resending
a command whose reply was lost (an XADD, the worker's commit script) would do it twice; each
caller decides what a retry means for what it was doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
import structlog

log = structlog.get_logger(__name__)

# BusyLoadingError ("LOADING Redis is loading the dataset in memory") is a ConnectionError
TRANSIENT: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
REDIS_START, REDIS_CAP = 1.0, 15.0  # a restart takes seconds: retry at least every 15 s


class Backoff:
    """Delays between retries: ``start`` seconds, doubling, capped at ``cap``; :meth:`reset`
    after a success."""

    def __init__(self, start: float = REDIS_START, cap: float = REDIS_CAP) -> None:
        self.start, self.cap = start, cap
        self.delay = start

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.start


class Outage:
    """One loop's view of Redis: failures back off and are logged, the recovery once.

    ``where`` names the loop in the log lines (``worker``, ``jobs``, ``<channel>.sync``, ...)."""

    def __init__(self, where: str, *, cap: float = REDIS_CAP) -> None:
        self.where = where
        self.backoff = Backoff(cap=cap)
        self.since: float | None = None  # monotonic time of the first failure, while away
        self.back_at: float | None = None  # monotonic time of the last recovery
        self.tries = 0

    def since_away(self) -> float:
        """Seconds since Redis was last away: 0 while it is, infinity if it never was."""
        if self.since is not None:
            return 0.0
        return float("inf") if self.back_at is None else time.monotonic() - self.back_at

    def failed(self, exc: BaseException, **info: Any) -> float:
        """Log this failure; returns how long to wait before the next try."""
        if self.since is None:
            self.since = time.monotonic()
        self.tries += 1
        delay = self.backoff.next()
        log.warning(
            "redis.unreachable",
            where=self.where,
            error=str(exc) or type(exc).__name__,
            retry_in=delay,
            tries=self.tries,
            **info,
        )
        return delay

    def recovered(self, **info: Any) -> None:
        """Redis answered: log ``redis.reconnected`` if it had been away; reset the backoff."""
        if self.since is not None:
            log.info(
                "redis.reconnected",
                where=self.where,
                away_s=round(time.monotonic() - self.since, 3),
                tries=self.tries,
                **info,
            )
            self.back_at = time.monotonic()
        self.since, self.tries = None, 0
        self.backoff.reset()


def wait_until_reachable(r: redis.Redis, outage: Outage, sleep: Callable[[float], bool]) -> bool:
    """PING with the outage's backoff until Redis answers (True), or ``sleep`` returns False
    (the process is stopping: False). ``sleep(seconds)`` waits and says whether to go on."""
    while True:
        try:
            r.ping()
        except TRANSIENT as exc:
            if not sleep(outage.failed(exc)):
                return False
            continue
        outage.recovered()
        return True
