"""One clock for every process: Redis's.

Reply ages are measured between two processes that may run on different hosts (the worker stamps
``Reply.created``, a gateway on a VPS decides whether the reply is too old to deliver). Their own
clocks can disagree by hours (a host without NTP, a wrong time zone set as UTC); Redis is the one
server they all share, so its ``TIME`` is the clock of record.

:class:`RedisClock` asks Redis once and keeps the offset from the local clock, asking again every
``refresh`` seconds, and at once when the local clock steps (it moved more than a second apart
from the monotonic clock: an NTP correction, a manual change): ``now()`` costs no round trip per
call. When Redis cannot be asked, the last
offset is kept (logged); before the first answer, the Redis error is raised.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import redis
import structlog

log = structlog.get_logger(__name__)

REFRESH = 30.0  # seconds between two TIME requests
STEP = 1.0  # seconds the local clock may drift from the monotonic one before Redis is asked again


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
        self._local_at = 0.0  # local time then (a step of the local clock shows against it)
        self._lock = threading.Lock()

    def now(self) -> float:
        """Redis's time now (unix seconds)."""
        local, mono = self.local(), self.monotonic()
        stepped = abs((local - self._local_at) - (mono - self._synced_at)) > STEP
        if self.offset is None or mono - self._synced_at >= self.refresh or stepped:
            if stepped and self.offset is not None:
                log.info("clock.stepped", detail="the local clock jumped: asking Redis again")
            self.sync()
            local = self.local()
        assert self.offset is not None  # sync() set it or raised
        return local + self.offset

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
                self._local_at = self.local()
                log.warning("clock.sync_failed", error=repr(exc), offset=round(self.offset, 3))
                return
            after = self.local()
            offset = seconds + micros / 1e6 - (before + after) / 2
            if self.offset is None or abs(offset - self.offset) > 1.0:
                log.info("clock.offset", offset=round(offset, 3), detail="Redis time - local time")
            self.offset, self._synced_at, self._local_at = offset, self.monotonic(), after


# -- the schedule's clock ------------------------------------------------------------------------

SHIFT_ENV = "RELAYBOT_CLOCK_SHIFT_FILE"


class ScheduleClock:
    """The one clock scheduled work runs on: when an occurrence is due (the jobs process's
    scheduler thread, worker/schedule_loop.py) and how late it came (the worker,
    worker/scheduled.py). Both processes must agree, so it is Redis's time (``base``, a
    :class:`RedisClock`'s ``now``), plus a shift read from the file that
    ``RELAYBOT_CLOCK_SHIFT_FILE`` names (seconds, a float; no variable or no file: 0).

    The shift exists for the tests only: they time-travel a real worker and a real jobs process
    by writing one number into one file, instead of sleeping until a reminder is due. The file
    is read again when it changes (its inode, mtime and size are looked at on every call: a
    stat, no read; the tests replace it, a new inode), and a shift other than 0 is logged once
    per value, so a shift left in a production environment is seen in the log."""

    def __init__(self, base: Callable[[], float], env: Mapping[str, str] | None = None) -> None:
        self.base = base
        source = (os.environ if env is None else env).get(SHIFT_ENV, "")
        self.path = Path(source) if source else None
        self._seen: tuple[int, int, int] | None = None
        self._shift = 0.0
        self._lock = threading.Lock()

    def shift(self) -> float:
        """The test-only shift now (0 without a shift file)."""
        if self.path is None:
            return 0.0
        try:
            st = self.path.stat()
        except OSError:
            return self._set(0.0, None)
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return self._shift
        try:
            value = float(self.path.read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            value = 0.0
        return self._set(value if math.isfinite(value) else 0.0, seen)

    def _set(self, value: float, seen: tuple[int, int, int] | None) -> float:
        with self._lock:
            if value not in (self._shift, 0.0):
                detail = f"{SHIFT_ENV} is for tests: scheduled work runs shifted"
                log.warning("clock.shifted", shift=value, file=str(self.path), detail=detail)
            self._shift, self._seen = value, seen
        return value

    def now(self) -> float:
        """The schedule's time now (unix seconds)."""
        return self.base() + self.shift()

    __call__ = now
