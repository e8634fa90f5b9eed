"""Liveness on the bus: heartbeats every process publishes, and the leases: the worker's, and
each gateway's (one gateway per channel account: gateways/lease.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis
import structlog

from contract import access
from contract.keys import Keys

log = structlog.get_logger(__name__)


def process_identity(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def gone_from_this_host(identity: str) -> bool:
    """Whether a :func:`process_identity` names a process of this host that no longer runs (a
    worker stopped with its Redis, as honcho stops both at once, leaves its lease to expire)."""
    role_host, _, pid = identity.rpartition(":")
    host = role_host.partition("@")[2]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        return False
    return False


def beat(r: redis.Redis, keys: Keys, name: str, **info: Any) -> None:
    """Publish liveness: one hash field per process, its value the time and a few facts."""
    payload = {"ts": time.time(), "pid": os.getpid(), "host": socket.gethostname(), **info}
    r.hset(keys.heartbeats, name, json.dumps(payload))


# A terminal chat (``relaybot chat``) beats as ``gateway:cli:<session>``. It is not a service: its
# session has a random name and it never "starts again", so a beat it could not remove (Ctrl-C
# or a kill while Redis was down) would stay forever. Its beat therefore expires: older than
# CHAT_ENDED_AFTER seconds (60 beat intervals), the chat has ended. ``relaybot status`` and
# ``relaybot doctor`` leave such a beat out (never "restart it"), and every chat that starts
# removes them from the hash (:func:`drop_ended_chats`). Redis's own per-field TTL (HEXPIRE)
# needs Redis 7.4, and a key of its own per chat would need a SCAN and another ACL pattern.
CHAT_BEAT = "gateway:cli:"
CHAT_ENDED_AFTER = 60.0
PRIVATE_TTL = 30  # seconds a process's private facts outlive its last beat (Heartbeat.private)


def chat_session(name: str) -> str | None:
    """The session of a terminal chat's beat name (None for any other process)."""
    return name[len(CHAT_BEAT) :] if name.startswith(CHAT_BEAT) else None


def label(name: str) -> str:
    """A beat's name as people read it: ``the relaybot chat in session X`` for a chat."""
    session = chat_session(name)
    return name if session is None else f"the relaybot chat in session {session}"


def chat_ended(name: str, beat: Mapping[str, Any], now: float) -> bool:
    """A terminal chat's beat older than :data:`CHAT_ENDED_AFTER`: that chat has ended."""
    try:
        ts = float(beat.get("ts", 0) or 0)
    except (TypeError, ValueError):
        ts = 0.0
    return chat_session(name) is not None and now - ts > CHAT_ENDED_AFTER


def drop_ended_chats(r: redis.Redis, keys: Keys, now: float | None = None) -> list[str]:
    """Remove the beats of chats that ended (:func:`chat_ended`); their names."""
    now = time.time() if now is None else now
    gone = [n for n, b in heartbeats(r, keys).items() if chat_ended(n, b, now)]
    if gone:
        r.hdel(keys.heartbeats, *gone)
        log.info("heartbeat.chats_ended", removed=gone)
    return gone


def heartbeats(r: redis.Redis, keys: Keys) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    raw: dict[bytes, bytes] = r.hgetall(keys.heartbeats)  # type: ignore[assignment]
    for name, value in raw.items():
        try:
            out[name.decode()] = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            out[name.decode(errors="replace")] = {"ts": 0, "error": "unreadable heartbeat"}
    return out


def private_facts(r: redis.Redis, key: str) -> dict[str, Any]:
    """A process's private facts (``Heartbeat.private``, written to ``key``); {} when there are
    none (the process stopped, or was gone long enough for them to expire) or they are not
    readable."""
    raw = r.get(key)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


class Heartbeat:
    """A daemon thread that beats every ``interval`` seconds until stopped; a Redis error is
    logged (once until it beats again) and the beating goes on: it outlives a Redis restart."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        name: str,
        interval: float = 1.0,
        *,
        config: dict[str, Any] | None = None,
    ) -> None:
        self._r, self._keys, self.name, self._interval = r, keys, name, interval
        self.info: dict[str, Any] = {}
        # the config the process runs with (contract/config_watch.py: ``config``,
        # ``restart_needed``, ``restart_keys``), beside ``info``, which its owner replaces
        self.config: dict[str, Any] = dict(config or {})
        # facts that are not every process's to read, written to a key of their own with each
        # beat (``private_key``, expiring with the beats): the worker's MCP facts (Keys.mcp)
        self.private: dict[str, Any] | None = None
        self.private_key: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def refresh(self) -> None:
        """Called before each beat, on the beating thread (a chat follows config.toml here)."""

    def _run(self) -> None:
        failing = False  # said once per outage, not every second while Redis restarts
        while not self._stop.is_set():
            try:
                self.refresh()
                beat(self._r, self._keys, self.name, **{**self.config, **self.info})
                private, key = self.private, self.private_key
                if private is not None and key is not None:
                    ttl = max(PRIVATE_TTL, int(self._interval * 10))
                    self._r.set(key, json.dumps(private, default=str), ex=ttl)
                if failing:
                    log.info("heartbeat.resumed", name=self.name)
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("heartbeat.failed", name=self.name, error=str(exc))
                failing = True
            self._stop.wait(self._interval)

    def stop(self, *, remove: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if remove:
            with contextlib.suppress(redis.RedisError):
                self._r.hdel(self._keys.heartbeats, self.name)
                if self.private_key is not None:
                    self._r.delete(self.private_key)


_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lease, epoch; ARGV: token, ttl ms. The epoch grows with every acquisition: the fencing
# token memory checks inside its write transactions (memory/fence.py).
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('incr', KEYS[2])
end
return 0
"""
# KEYS: lease, epoch; ARGV: token, the epoch memory holds. Memory is fenced at a higher epoch than
# Redis gave (Redis lost data: a power cut, a failover): the holder moves Redis's epoch past it.
_RAISE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
local e = tonumber(redis.call('get', KEYS[2]) or '0')
if e <= tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], tonumber(ARGV[2]) + 1)
  return tonumber(ARGV[2]) + 1
end
return redis.call('incr', KEYS[2])
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
access.name_script("the worker's lease script (renew)", _RENEW)
access.name_script("the worker's lease script (acquire)", _ACQUIRE)
access.name_script("the worker's lease script (raise)", _RAISE)
access.name_script("the worker's lease script (release)", _RELEASE)


class Lease:
    """Exactly one worker: a token in Redis with a TTL, renewed by a thread while held.

    If the holder dies, the lease expires after ``ttl`` seconds and a waiting worker takes over.
    The worker also fences its acks with the token (the commit script of worker/consumer.py), so
    a worker that lost the lease (paused, partitioned) can never ack or queue anything after a
    successor started.
    """

    def __init__(self, r: redis.Redis, key: str, token: str, ttl: float) -> None:
        self._r, self.key, self.token, self.ttl = r, key, token, ttl
        self.epoch_key = f"{key}:epoch"
        self.epoch = 0  # the fencing token of the current holding (0: not held)
        # monotonic time just before the last acquisition or renewal that went through: the
        # lease is certainly held until ``renewed + ttl`` (Redis started its TTL later)
        self.renewed = 0.0
        self._acquire = r.register_script(_ACQUIRE)
        self._raise = r.register_script(_RAISE)
        self._renew = r.register_script(_RENEW)
        self._release = r.register_script(_RELEASE)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> str | None:
        value = self._r.get(self.key)
        return value.decode() if isinstance(value, bytes) else None

    def try_acquire(self) -> bool:
        """Take the lease if it is free; :attr:`epoch` is then its fencing token."""
        asked = time.monotonic()
        epoch = self._acquire(
            keys=[self.key, self.epoch_key], args=[self.token, int(self.ttl * 1000)]
        )
        self.epoch = int(epoch)
        if self.epoch:
            self.renewed = asked
            self.lost.clear()
        return self.epoch > 0

    def raise_epoch(self, at_least: int) -> int:
        """A fencing token above ``at_least`` (memory's), while this worker holds the lease;
        0 when it does not any more."""
        epoch = int(self._raise(keys=[self.key, self.epoch_key], args=[self.token, at_least]))
        if epoch:
            self.epoch = epoch
        return epoch

    def start_renewing(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        period = self.ttl / 3
        while not self._stop.wait(period):
            asked = time.monotonic()
            try:
                ok = self._renew(keys=[self.key], args=[self.token, int(self.ttl * 1000)])
            except redis.RedisError as exc:
                log.warning("lease.renew_failed", error=str(exc))
                continue
            if not ok:
                log.error("lease.lost", key=self.key)
                self.lost.set()
                return
            self.renewed = asked

    def surely_held(self, margin: float = 0.8) -> bool:
        """Held for certain, by this process's own clock: not lost, and renewed less than
        ``margin * ttl`` ago (a process that was paused, or cut off from Redis, stops acting
        before another could have taken over)."""
        if self.lost.is_set() or not self.epoch:
            return False
        return time.monotonic() < self.renewed + margin * self.ttl

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        try:
            self._release(keys=[self.key], args=[self.token])
        except redis.RedisError as exc:
            log.warning("lease.release_failed", error=str(exc))
