"""One clock for every process: Redis's.

Reply ages are measured between two processes that may run on different hosts (the worker stamps
``Reply.created``, a gateway on a VPS decides whether the reply is too old to deliver). Their own
clocks can disagree by hours (a host without NTP, a wrong time zone set as UTC); Redis is the one
server they all share, so its ``TIME`` is the clock of record.

:class:`RedisClock` asks Redis once and keeps the offset from the local clock, asking again every
``refresh`` seconds: ``now()`` costs no round trip per call. When Redis cannot be asked, the last
offset is kept (logged); before the first answer, the Redis error is raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis
import structlog

log = structlog.get_logger(__name__)

REFRESH = 30.0  # seconds between two TIME requests


class RedisClock:
    """The Redis server's time as a unix float, from the local clock plus a cached offset."""

    def __init__(
        self,
        r: redis.Redis,
        *,
        local: Callable[[], float] = time.time,
        refresh: float = REFRESH,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.r, self.local, self.refresh, self.monotonic = r, local, refresh, monotonic
        self.offset: float | None = None  # Redis time minus local time, seconds
        self._synced_at = 0.0  # monotonic time of the last TIME answer
        self._lock = threading.Lock()

    def now(self) -> float:
        """Redis's time now (unix seconds)."""
        if self.offset is None or self.monotonic() - self._synced_at >= self.refresh:
            self.sync()
        assert self.offset is not None  # sync() set it or raised
        return self.local() + self.offset

    def sync(self) -> None:
        """Ask Redis for its time and keep the offset; the round trip's middle is the moment."""
        with self._lock:
            before = self.local()
            try:
                seconds, micros = self.r.time()
            except redis.RedisError as exc:
                if self.offset is None:
                    raise
                self._synced_at = self.monotonic()  # try again after another ``refresh``
                log.warning("clock.sync_failed", error=repr(exc), offset=round(self.offset, 3))
                return
            after = self.local()
            offset = seconds + micros / 1e6 - (before + after) / 2
            if self.offset is None or abs(offset - self.offset) > 1.0:
                log.info("clock.offset", offset=round(offset, 3), detail="Redis time - local time")
            self.offset, self._synced_at = offset, self.monotonic()
