"""Every Redis key relaybot uses: the one definition (no module builds a key by hand).

All keys share one prefix (``redis.prefix``, default ``relaybot:``), so several instances can
share a Redis, and ``deploy/redis/users.acl`` can give each process exactly its keys. A session
is a routing key such as ``cli:ada-1a2b3c`` or ``<channel>:!room:example.org``.

| key | type | written by | what |
|---|---|---|---|
| ``inbound:<channel>`` | stream | that channel's gateway | its normalized inbound entries |
| ``inbound`` | stream | worker, jobs | their own entries, and those from before the split |
| ``dead`` | stream | worker, gateways | dead letters, with the reason |
| ``worker:lease`` | string | worker | the one worker's lease token |
| ``lease:gateway:<channel>:<digest>`` | string | gateways | one gateway per account |
| ``heartbeats`` | hash | every process | liveness, one field per process |
| ``mcp`` | string (TTL) | worker | its MCP servers and tools (JSON): no gateway's to read |
| ``jobs`` | rq queue | worker | background jobs (rq's keys of it: ``Keys.rq_*``) |
| ``derive:judged`` | hash | jobs | per conversation, the last log id the model judged not paused |
| ``reply:<session>`` | list | worker | replies waiting for their gateway |
| ``inflight:<session>`` | list | gateways | a reply being delivered |
| ``delivered:<session>`` | sorted set | gateways | reply ids handed to the platform |
| ``busy:<session>`` | string (TTL) | worker | the worker is on a slow turn of it |

A channel's gateway's own keys (its cursor, what it has seen) are in its folder
(``gateways/<channel>/keys.py``), under the same prefix, named by its ACL line.
"""

from __future__ import annotations

import hashlib


class Keys:
    """The key names under one prefix."""

    GROUP = "worker"  # the consumer group of the inbound streams

    def __init__(self, prefix: str = "relaybot:") -> None:
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"invalid key prefix {prefix!r}")
        self.prefix = prefix
        self.inbound = f"{prefix}inbound"
        self.dead = f"{prefix}dead"
        self.lease = f"{prefix}worker:lease"
        self.heartbeats = f"{prefix}heartbeats"
        self.mcp = f"{prefix}mcp"
        self.jobs_queue = f"{prefix}jobs"
        self.derive_judged = f"{prefix}derive:judged"

    # -- rq's keys of the jobs queue, as rq names them (not under the prefix: rq's own) ------

    @property
    def rq_queue(self) -> str:
        """rq's list of the jobs waiting on the jobs queue."""
        return f"rq:queue:{self.jobs_queue}"

    @property
    def rq_scheduled(self) -> str:
        """rq's ScheduledJobRegistry of the jobs queue: the fire jobs waiting for their second."""
        return f"rq:scheduled:{self.jobs_queue}"

    @property
    def rq_scheduler_lock(self) -> str:
        """rq's scheduler lock of the jobs queue: held by the jobs process that moves due jobs."""
        return f"rq:scheduler-lock:{self.jobs_queue}"

    @property
    def rq_failed(self) -> str:
        """rq's failed-job registry of the jobs queue."""
        return f"rq:failed:{self.jobs_queue}"

    def inbound_of(self, channel: str) -> str:
        """The inbound stream of one channel: only its gateway may write it (the ACL file)."""
        return f"{self.prefix}inbound:{channel}"

    # -- per session -------------------------------------------------------------------------

    def reply(self, session: str) -> str:
        return f"{self.prefix}reply:{session}"

    def inflight(self, session: str) -> str:
        return f"{self.prefix}inflight:{session}"

    def delivered(self, session: str) -> str:
        return f"{self.prefix}delivered:{session}"

    def busy(self, session: str) -> str:
        return f"{self.prefix}busy:{session}"

    def reply_pattern(self, channel: str | None = None) -> str:
        """A SCAN pattern for the reply queues (of one channel's sessions)."""
        return self.reply(f"{channel}:*" if channel else "*")

    def inflight_pattern(self, channel: str | None = None) -> str:
        return self.inflight(f"{channel}:*" if channel else "*")

    def session_of_reply_key(self, key: str) -> str:
        return key.removeprefix(self.reply(""))

    def session_of_inflight_key(self, key: str) -> str:
        return key.removeprefix(self.inflight(""))

    def gateway_lease(self, channel: str, account: str) -> str:
        """The lease of the one gateway of a channel account (``account`` names it on its
        platform, e.g. the bot's user id; keyed by a digest of it). Its epoch is ``<key>:epoch``."""
        return f"{self.prefix}lease:gateway:{channel}:{digest(account)}"


def digest(text: str) -> str:
    """A short, fixed-length stand-in for a platform id in a key name."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:40]
