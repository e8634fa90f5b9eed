"""The e-mail gateway's Redis state, under the key prefix.

- ``email:cursor:<folder>`` (hash): UIDVALIDITY and the last processed UID, advanced only after
  the message was XADDed (or deliberately skipped).
- ``email:seen`` (sorted set): the Message-IDs already published, written in the same MULTI as
  the XADD, so a crash between XADD and cursor, or a UIDVALIDITY change, never publishes twice.
  That MULTI is durable (fsynced) before :meth:`MailState.publish` returns: a power cut of the
  Redis host cannot roll the entry back behind a cursor that already moved past its UID.
- ``email:orig:<digest>``: the headers a reply needs, keyed by the answered Message-ID (the
  worker's ``Reply.in_reply_to``), written in that same MULTI.
- ``email:rate:<kind>:<who>`` (sorted sets): what was accepted recently, for the rate caps.
- ``email:rate:replied:<digest>`` (string, TTL ``[email] reply_window``): relaybot sent this
  address the reply with this Message-ID within the window; mail from it that answers that reply
  meanwhile is recorded, not answered. The TTL runs on Redis's clock.
- ``email:lists`` (sorted set, by when last seen): mailing-list addresses learned from the
  ``List-Post``/``List-Id`` headers of mail seen (ignored list mail included); an audience holding
  one is a group. Forgotten a year after they were last seen.
- ``email:owner_refused`` (string, JSON, TTL 30 days): the last mail from one of the owner's
  addresses that was not authenticated, and why; ``relaybot doctor`` shows it (the gateway may
  run on another host: Redis is what both can read). Removed when the owner's mail is
  authenticated again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from contract.bus import stream_id
from contract.durable import Durable
from contract.keys import Keys, digest
from gateways.email.keys import EmailKeys
from gateways.email.parse import Accepted, Headers

SEEN_KEEP = 90 * 24 * 3600.0
ORIG_KEEP = 14 * 24 * 3600
LISTS_KEEP = 365 * 24 * 3600.0
REFUSAL_KEEP = 30 * 24 * 3600


@dataclass(frozen=True)
class Cursor:
    uidvalidity: int
    last_uid: int


ANYONE = "*"  # the reply-window key of a reply, whoever answers it (no address is "*")


class MailState:
    def __init__(self, r: redis.Redis, keys: Keys, folder: str) -> None:
        self.r, self.keys = r, keys
        self.cursor_key = EmailKeys(keys).cursor(folder)
        self.seen_key = EmailKeys(keys).seen
        self.durable = Durable(r)

    # -- the cursor --------------------------------------------------------------------------

    def cursor(self) -> Cursor | None:
        raw: dict[bytes, bytes] = self.r.hgetall(self.cursor_key)  # type: ignore[assignment]
        if not raw:
            return None
        return Cursor(int(raw[b"uidvalidity"]), int(raw[b"last_uid"]))

    def advance(self, uidvalidity: int, uid: int) -> None:
        self.r.hset(self.cursor_key, mapping={"uidvalidity": uidvalidity, "last_uid": uid})

    # -- publishing once ---------------------------------------------------------------------

    def already_published(self, message_id: str) -> bool:
        return self.r.zscore(self.seen_key, message_id) is not None

    def publish(self, accepted: Accepted) -> str:
        """XADD the message, remember its Message-ID and its reply headers, atomically; returns
        only once all of it is durable (:mod:`contract.durable`), so the cursor may move on."""
        msg = accepted.message
        now = time.time()
        fields = [x for kv in msg.to_fields().items() for x in kv]
        orig = json.dumps(accepted.headers.to_dict())
        results = self.durable.transaction(
            [
                ("XADD", self.keys.inbound_of(msg.channel), "*", *fields),
                ("ZADD", self.seen_key, now, msg.event_id),
                ("ZREMRANGEBYSCORE", self.seen_key, "-inf", now - SEEN_KEEP),
                ("SET", self.orig_key(msg.event_id), orig, "EX", ORIG_KEEP),
            ]
        )
        return stream_id(msg.channel, results[0])

    def confirm(self, message_id: str) -> None:
        """A message found already published may not be durable yet (its publish failed waiting
        for the fsync): a durable write after it makes it so, as the AOF is fsynced in order."""
        self.durable.transaction([("ZADD", self.seen_key, "XX", time.time(), message_id)])

    def orig_key(self, message_id: str) -> str:
        return EmailKeys(self.keys).orig(message_id)

    def headers_for(self, message_id: str) -> Headers | None:
        raw = self.r.get(self.orig_key(message_id))
        if raw is None:
            return None
        return Headers.from_dict(json.loads(raw))

    def dead(self, raw: bytes, reason: str, source: str) -> None:
        self.r.xadd(
            self.keys.dead,
            {"reason": reason, "source": source, "raw": raw[:65536], "at": str(time.time())},
        )

    # -- rate caps ---------------------------------------------------------------------------

    def over_rate(
        self,
        thread: str,
        sender: str,
        *,
        window: float,
        per_thread: int,
        per_sender: int,
        event_id: str,
    ) -> str:
        """Count this message against its thread and sender; the cap it exceeds, if any."""
        now = time.time()
        reason = ""
        for kind, who, cap in (("thread", thread, per_thread), ("sender", sender, per_sender)):
            key = EmailKeys(self.keys).rate(kind, digest(who))
            pipe = self.r.pipeline(transaction=True)
            pipe.zremrangebyscore(key, "-inf", now - window)
            pipe.zcard(key)
            count = int(pipe.execute()[1])
            if count >= cap and not reason:
                reason = f"more than {cap} messages per {window:.0f} s from this {kind}"
        if not reason:
            for kind, who in (("thread", thread), ("sender", sender)):
                key = EmailKeys(self.keys).rate(kind, digest(who))
                self.r.zadd(key, {event_id: now})
                self.r.expire(key, int(window) + 60)
        return reason

    # -- the reply window (one reply per auto-responder storm) -----------------------------------

    def _replied_key(self, address: str, thread_id: str) -> str:
        return EmailKeys(self.keys).rate("replied", digest(f"{address.lower()}\n{thread_id}"))

    def note_answered(
        self, addresses: Iterable[str], thread_ids: Iterable[str], *, window: float
    ) -> None:
        """relaybot is sending ``addresses`` the mail(s) named by ``thread_ids`` (Message-IDs)."""
        if window <= 0:
            return
        ids = list(dict.fromkeys(thread_ids))
        pipe = self.r.pipeline(transaction=False)
        for address in dict.fromkeys([*addresses, ANYONE]):
            for thread_id in ids:
                pipe.set(self._replied_key(address, thread_id), "1", ex=max(1, round(window)))
        pipe.execute()

    def recently_answered(self, addresses: Iterable[str], thread_ids: Iterable[str]) -> bool:
        """Whether relaybot sent one of ``addresses`` one of these Message-IDs within the window,
        or sent it at all: an answer to relaybot's reply that comes from another address than
        the reply went to (an auto-responder answering from an alias) is held the same way."""
        keys = [
            self._replied_key(address, thread_id)
            for address in dict.fromkeys([*(a for a in addresses if a), ANYONE])
            for thread_id in dict.fromkeys(thread_ids)
        ]
        return bool(keys) and bool(self.r.exists(*keys))

    # -- mailing lists -------------------------------------------------------------------------

    def learn_lists(self, addresses: Iterable[str]) -> None:
        """Remember these addresses as mailing lists (seen now)."""
        found = sorted(set(addresses))
        if not found:
            return
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(EmailKeys(self.keys).lists, dict.fromkeys(found, now))
        pipe.zremrangebyscore(EmailKeys(self.keys).lists, "-inf", now - LISTS_KEEP)
        pipe.execute()

    def known_lists(self, addresses: Iterable[str]) -> set[str]:
        """Which of these addresses were learned as mailing lists (seen within a year)."""
        wanted = list(dict.fromkeys(addresses))
        if not wanted:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for address in wanted:
            pipe.zscore(EmailKeys(self.keys).lists, address)
        since = time.time() - LISTS_KEEP
        scores = pipe.execute()
        return {a for a, s in zip(wanted, scores, strict=True) if s is not None and s >= since}

    # -- the owner's own mail, refused as unauthenticated ------------------------------------------

    def note_owner_refused(self, record: dict[str, Any]) -> None:
        self.r.set(EmailKeys(self.keys).owner_refused, json.dumps(record), ex=REFUSAL_KEEP)

    def clear_owner_refused(self) -> None:
        self.r.delete(EmailKeys(self.keys).owner_refused)
