"""The commit script, sent without waiting for its answer.

The worker acks in batches with one fenced script (worker/batch.py: it queues the replies, writes
the dead letters and acks, atomically). Redis runs a script as soon as it reads it, so the
replies reach their queues whether or not the worker waits for the answer; waiting only holds
the writer while Redis writes (and, with durable acceptance, fsyncs) its AOF. So the script goes
out on a connection of its own and its answer is read later (:meth:`CommitLine.collect`): before
the next one is sent, and before anything that must see its acks (reading this consumer's
pending entries, trimming, looking for a queued reply, releasing the lease). Meanwhile the
writer handles the next entries. An error comes out of :meth:`collect` as it would have come out
of a waited-for call: a lost lease (``LEASE``), Redis gone away (the worker rides it out and
re-reads what is pending: memory dedupes the replays), a script Redis forgot (sent again in full).
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis
from redis.exceptions import NoScriptError


class CommitLine:
    """One script call at a time in flight on a connection of its own."""

    def __init__(self, r: redis.Redis, script: str) -> None:
        self._r = r
        self._script = script
        self._sha = hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()
        self._conn: Any = None  # a redis-py Connection (its methods are untyped)
        self._sent: tuple[list[Any], list[Any]] | None = None

    @property
    def in_flight(self) -> bool:
        return self._sent is not None

    def send(self, keys: list[Any], args: list[Any]) -> None:
        """Send a call once the one before it is answered (its error raised here)."""
        self.collect()
        conn = self._connection()
        try:
            conn.send_command("EVALSHA", self._sha, len(keys), *keys, *args)
        except BaseException:
            self.reset()
            raise
        self._sent = (keys, args)

    def call(self, keys: list[Any], args: list[Any]) -> Any:
        """Send a call and wait for its answer."""
        self.send(keys, args)
        return self.collect()

    def collect(self) -> Any:
        """The answer of the call in flight (None when none is): its error raised."""
        sent, self._sent = self._sent, None
        if sent is None or self._conn is None:
            return None
        conn = self._conn
        try:
            try:
                return conn.read_response()
            except NoScriptError:  # Redis forgot the script (SCRIPT FLUSH): nothing ran
                keys, args = sent
                conn.send_command("EVAL", self._script, len(keys), *keys, *args)
                return conn.read_response()
        except redis.ResponseError:
            raise  # the connection is fine: the script refused (LEASE) or failed
        except BaseException:
            self.reset()  # Redis went away mid-call, or the wait was interrupted
            raise

    def reset(self) -> None:
        """Forget the call in flight and drop the connection (Redis went away; its answer is
        not awaited: what it acked or not is read again from Redis)."""
        self._sent = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()

    def _connection(self) -> Any:
        if self._conn is None:  # a new connection (at start, after Redis went away): Redis
            # may have restarted without its scripts, so the script is loaded first
            conn: Any = self._r.connection_pool.make_connection()
            try:
                conn.send_command("SCRIPT", "LOAD", self._script)
                conn.read_response()
            except BaseException:
                conn.disconnect()
                raise
            self._conn = conn
        return self._conn
