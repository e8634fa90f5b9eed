"""The "busy" mark of a session while the worker is on a slow turn of it.

Gateways read ``busy:<session>`` to show that the assistant is working (the terminal's
"thinking…", a Matrix typing notice). Marking every turn would cost a Redis round trip per
message, so a background thread marks a turn only once it has lasted ``after`` seconds, and
refreshes the mark (a key with a short TTL) while the turn lasts. The worker's commit script
deletes the mark with the reply; the lock below makes sure no late mark lands after that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import structlog

from contract.keys import Keys

log = structlog.get_logger(__name__)


class BusySignal:
    def __init__(
        self, r: redis.Redis, keys: Keys, *, after: float = 0.05, ttl: float = 3.0
    ) -> None:
        self._r, self._keys, self.after, self.ttl = r, keys, after, ttl
        self._lock = threading.Lock()
        self._session: str | None = None
        self._started = 0.0
        self._marked_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy", daemon=True)

    def start(self) -> BusySignal:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    @contextmanager
    def turn(self, session: str) -> Iterator[None]:
        with self._lock:
            self._session, self._started, self._marked_at = session, time.monotonic(), 0.0
        try:
            yield
        finally:
            with self._lock:  # waits for a mark being written, so none lands after the reply
                self._session = None

    def _run(self) -> None:
        period = min(self.after, self.ttl / 3)
        while not self._stop.wait(period):
            with self._lock:
                session = self._session
                now = time.monotonic()
                if session is None or now - self._started < self.after:
                    continue
                if self._marked_at and now - self._marked_at < self.ttl / 3:
                    continue
                try:
                    self._r.set(self._keys.busy(session), "1", px=int(self.ttl * 1000))
                    self._marked_at = now
                except redis.RedisError as exc:
                    log.warning("busy.mark_failed", error=str(exc))
