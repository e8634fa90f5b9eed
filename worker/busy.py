"""The "busy" mark of a session while the worker has a slow turn of it running or waiting.

Gateways read ``busy:<session>`` to show that the assistant is working (the terminal's
"thinking…", a platform's typing notice). Marking every turn would cost a Redis round trip per
message, so a background thread marks a turn only once it has lasted ``after`` seconds, and
refreshes the mark (a key with a short TTL) while the turn lasts. The worker's commit script
deletes the mark with the reply; the lock below makes sure no late mark lands after that.

The mark's value says which: ``waiting`` while the session's turn waits for a slot (behind other
turns), ``running`` once it runs (``relaybot chat`` shows "thinking…" and counts its
``--timeout`` from then; a gateway's typing notice shows for either).
"""

from __future__ import annotations

import threading
import time

import redis
import structlog

from contract.keys import Keys

log = structlog.get_logger(__name__)


class BusySignal:
    """Marks the sessions that have a turn running or waiting (several at once: turns of
    different sessions run side by side), each once it has been busy ``after`` seconds."""

    def __init__(
        self, r: redis.Redis, keys: Keys, *, after: float = 0.05, ttl: float = 3.0
    ) -> None:
        self._r, self._keys, self.after, self.ttl = r, keys, after, ttl
        self._lock = threading.Lock()
        # session -> [busy since, marked at, running (1.0) or waiting (0.0)]
        self._sessions: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy", daemon=True)

    def start(self) -> BusySignal:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def begin(self, session: str) -> None:
        """The session has a turn running or waiting (again: no change if it had)."""
        with self._lock:
            self._sessions.setdefault(session, [time.monotonic(), 0.0, 0.0])

    def running(self, session: str, now: bool = True) -> None:
        """The session's turn runs (``now``) or waits for a slot again; the mark is rewritten
        at the next beat."""
        with self._lock:
            times = self._sessions.setdefault(session, [time.monotonic(), 0.0, 0.0])
            if times[2] != float(now):
                times[1], times[2] = 0.0, float(now)

    def end(self, session: str) -> None:
        """The session is idle: no mark lands after this returns (the lock waits for a mark
        being written)."""
        with self._lock:
            self._sessions.pop(session, None)

    def _run(self) -> None:
        period = min(self.after, self.ttl / 3)
        while not self._stop.wait(period):
            with self._lock:
                now = time.monotonic()
                due = [
                    (session, times)
                    for session, times in self._sessions.items()
                    if now - times[0] >= self.after
                    and not (times[1] and now - times[1] < self.ttl / 3)
                ]
                if not due:
                    continue
                try:
                    with self._r.pipeline(transaction=False) as pipe:
                        for session, times in due:
                            state = "running" if times[2] else "waiting"
                            pipe.set(self._keys.busy(session), state, px=int(self.ttl * 1000))
                        pipe.execute()
                    for _, times in due:
                        times[1] = now
                except redis.RedisError as exc:
                    log.warning("busy.mark_failed", error=str(exc))
