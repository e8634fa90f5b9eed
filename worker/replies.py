"""Replies between memory and the reply queues, kept in step by the worker.

- :meth:`ReplyKeeper.reconcile` — after Redis lost data (a power cut cut its last second, a
  failover to a replica that lagged), replies memory recorded may be missing from Redis: queued
  after the last write Redis kept. The worker looks at the replies recorded in the last
  :data:`RECONCILE_WINDOW` seconds before the newest one (the part of history a restart can
  have lost) that have no final status in memory (delivered, failed, expired) and that Redis
  holds nowhere (queued, in flight, marked delivered); each is queued again, as it was (same id,
  so a gateway that did deliver it recognises it). It runs when the worker starts, once the
  entries left pending have been replayed (their replies are queued by the replay).
- :meth:`ReplyKeeper.sweep` — a reply queue nobody reads (a terminal session that ended, a
  gateway that was removed) would grow forever: a reply older than ``delivery.max_age`` (on
  Redis's clock) at the head of a queue is removed and marked expired in memory, as a gateway
  does with one it finds too old to deliver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import structlog

from contract import access
from contract.bus import text
from contract.keys import Keys
from contract.messages import Reply, WireError
from memory.turns import Memory

log = structlog.get_logger(__name__)

RECONCILE_WINDOW = 60.0  # seconds of replies before the newest one that a restart may have lost
RECONCILE_LIMIT = 5000  # at most this many recent replies are looked at
SWEEP_PER_QUEUE = 1000  # expired replies removed from one queue per sweep

# KEYS: queue; ARGV: the raw reply expected at its head. Removes it only if it is still there
# (a gateway may have taken it meanwhile).
_POP_IF_HEAD = """
if redis.call('lindex', KEYS[1], 0) == ARGV[1] then return redis.call('lpop', KEYS[1]) end
return false
"""
access.name_script("the worker's reply sweep script", _POP_IF_HEAD)


class ReplyKeeper:
    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        memory: Memory,
        *,
        now: Callable[[], float],
        max_age: float,
        queue: Callable[[list[Reply]], None],
    ) -> None:
        self.r, self.keys, self.memory = r, keys, memory
        self.now, self.max_age = now, max_age
        self.queue = queue  # queues replies (the worker's fenced commit script)
        self._pop_if_head = r.register_script(_POP_IF_HEAD)

    def held(self, reply: Reply) -> bool:
        """Whether Redis holds this reply: queued, in flight, or marked delivered. The three are
        read in one transaction: a gateway moves a reply from its queue to in flight, marks it
        delivered, then drops it from in flight (gateways/deliver.py), so at every instant it is
        in one of them, but three separate reads could each miss it as it moves on, and a reply
        being delivered would look lost and be queued again (delivered twice)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.zscore(self.keys.delivered(reply.session), reply.reply_id)
        pipe.lrange(self.keys.reply(reply.session), 0, -1)
        pipe.lrange(self.keys.inflight(reply.session), 0, -1)
        delivered, queued, inflight = pipe.execute()
        if delivered is not None:
            return True
        needle = reply.reply_id.encode()
        return any(needle in item for item in [*queued, *inflight])

    def reconcile(self) -> int:
        """Queue again the recent replies memory recorded and Redis lost; how many."""
        recent = self.memory.unsettled_replies(RECONCILE_WINDOW, RECONCILE_LIMIT)
        now = self.now()
        lost = [r for r in recent if now - r.created <= self.max_age and not self.held(r)]
        if lost:
            self.queue(lost)
            log.warning(
                "worker.replies_requeued",
                count=len(lost),
                reply_ids=[r.reply_id for r in lost[:20]],
                detail="recorded in memory, missing from Redis (it lost data)",
            )
        return len(lost)

    def sweep(self) -> int:
        """Remove the replies too old to deliver from the heads of the reply queues, marking
        each expired in memory; how many."""
        expired = 0
        for raw_key in self.r.scan_iter(match=self.keys.reply_pattern(), count=500):
            key = text(raw_key)
            for _ in range(SWEEP_PER_QUEUE):
                head: Any = self.r.lindex(key, 0)
                if head is None or not self._too_old(head):
                    break
                if self._pop_if_head(keys=[key], args=[head]) is None:
                    break  # a gateway took it meanwhile
                self._expired(head)
                expired += 1
        if expired:
            self.memory.settle()
            log.warning("reply.queue_expired", count=expired, max_age=self.max_age)
        return expired

    def _too_old(self, raw: bytes) -> bool:
        try:
            return self.now() - Reply.from_json(raw).created > self.max_age
        except WireError:
            return True  # unreadable: nobody can deliver it

    def _expired(self, raw: bytes) -> None:
        try:
            reply = Reply.from_json(raw)
        except WireError:
            log.error("reply.unreadable_dropped", raw=raw[:200].decode(errors="replace"))
            return
        with self.memory.write():
            self.memory.mark_reply(
                reply.reply_id, "expired", f"nobody delivered it within {self.max_age:.0f} s"
            )
