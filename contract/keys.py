"""Every Redis key relaybot uses: the one definition (no module builds a key by hand).

All keys share one prefix (``redis.prefix``, default ``relaybot:``), so several instances can
share a Redis, and ``deploy/redis/users.acl`` can give each process exactly its keys. A session
is a routing key such as ``cli:ada-1a2b3c`` or ``matrix:!room:example.org``.

| key | type | written by | what |
|---|---|---|---|
| ``inbound:<channel>`` | stream | that channel's gateway | its normalized inbound entries |
| ``inbound`` | stream | worker, jobs | their own entries, and those from before the split |
| ``dead`` | stream | worker, gateways | dead letters, with the reason |
| ``worker:lease`` | string | worker | the one worker's lease token |
| ``lease:gateway:<channel>:<digest>`` | string | gateways | one gateway per account |
| ``heartbeats`` | hash | every process | liveness, one field per process |
| ``jobs`` | rq queue | worker | background jobs |
| ``derive:judged`` | hash | jobs | per conversation, the last log id the model judged not paused |
| ``reply:<session>`` | list | worker | replies waiting for their gateway |
| ``inflight:<session>`` | list | gateways | a reply being delivered |
| ``delivered:<session>`` | sorted set | gateways | reply ids handed to the platform |
| ``busy:<session>`` | string (TTL) | worker | the worker is on a slow turn of it |
| ``cursor:matrix`` | string | matrix | the sync token |
| ``matrix:seen`` | sorted set | matrix | event ids published |
| ``matrix:thread:<event id>`` | string (TTL) | matrix | the thread an event was in |
| ``matrix:members:<room id>`` | string (JSON) | matrix | everyone who was ever a member |
| ``matrix:sent:<event id>`` | string (TTL) | matrix | the reply id of an event the bot sent |
| ``email:cursor:<folder>`` | hash | email | UIDVALIDITY and the last UID |
| ``email:seen`` | sorted set | email | Message-IDs published |
| ``email:orig:<digest>`` | string (TTL) | email | the headers a reply needs |
| ``email:rate:<kind>:<digest>`` | sorted set | email | what was accepted recently |
| ``email:lists`` | sorted set | email | mailing-list addresses learned from List-Post/List-Id |
| ``email:owner_refused`` | string (TTL) | email | the owner's last mail not authenticated |
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
        self.jobs_queue = f"{prefix}jobs"
        self.derive_judged = f"{prefix}derive:judged"
        self.matrix_cursor = f"{prefix}cursor:matrix"
        self.matrix_seen = f"{prefix}matrix:seen"
        self.email_seen = f"{prefix}email:seen"
        self.email_lists = f"{prefix}email:lists"
        self.email_owner_refused = f"{prefix}email:owner_refused"

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

    # -- the gateways' own state ---------------------------------------------------------------

    def matrix_members(self, room_id: str) -> str:
        return f"{self.prefix}matrix:members:{room_id}"

    def matrix_thread(self, event_id: str) -> str:
        return f"{self.prefix}matrix:thread:{event_id}"

    def matrix_sent(self, event_id: str) -> str:
        """The reply id of an event the bot sent (a redaction of it erases that reply)."""
        return f"{self.prefix}matrix:sent:{event_id}"

    def email_cursor(self, folder: str) -> str:
        return f"{self.prefix}email:cursor:{folder}"

    def email_orig(self, message_id: str) -> str:
        """The cached reply headers of the mail ``message_id`` (keyed by a digest of it)."""
        return f"{self.prefix}email:orig:{digest(message_id)}"

    def email_rate(self, kind: str, who: str) -> str:
        return f"{self.prefix}email:rate:{kind}:{who}"

    def gateway_lease(self, channel: str, account: str) -> str:
        """The lease of the one gateway of a channel account (``account`` names it on its
        platform, e.g. a Matrix user id; keyed by a digest of it). Its epoch is ``<key>:epoch``."""
        return f"{self.prefix}lease:gateway:{channel}:{digest(account)}"


def digest(text: str) -> str:
    """A short, fixed-length stand-in for a platform id in a key name."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:40]
