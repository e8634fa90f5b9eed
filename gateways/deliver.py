"""Delivering replies from a session's reply queue, once.

A reply is moved atomically from ``reply:<session>`` to ``inflight:<session>`` (BLMOVE), marked in
``delivered:<session>`` just before it is handed to the platform, and removed from the in-flight
list after. A gateway killed mid-delivery finds the reply still in flight on restart: if it was
marked, it may already have reached the user, so it is sent again only through a sink that
recognises a resend (a Matrix transaction id, an e-mail's Message-ID derived from the reply id);
otherwise it is dropped with a log line (it is in memory either way). So a reply is never shown
twice. A reply older than the configured age is not delivered late: the gateway tells the worker,
which marks it expired in memory.

Ages are measured on Redis's clock (:class:`contract.clock.RedisClock`), the one clock the worker
that stamped ``Reply.created`` and this gateway share, wherever each runs.

The final status of a reply is told to the worker (the only memory writer) as a ``reply_status``
derived entry on the channel's own stream, in the same MULTI that takes the reply out of flight:
``expired`` always, ``failed`` when the platform refused it for good (:class:`Undeliverable`),
``withheld`` when the gateway found, right before posting, that the reply would reach people it
was not written for (:class:`Withheld`: someone joined the room, a recipient outside the mail's
audience), and ``delivered`` when the caller asks for it
(``report_delivered``: the e-mail gateway does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from contract.clock import RedisClock
from contract.keys import Keys
from contract.messages import InboundMessage, Kind, Privacy, Reply, WireError, new_event_id

log = structlog.get_logger(__name__)

DELIVERED_KEEP = 7 * 24 * 3600.0  # how long delivered ids are remembered for recognition
MAX_DETAIL = 500  # characters of a status detail (a server's refusal) kept


class Undeliverable(RuntimeError):
    """The platform refused the reply for good (an SMTP 5xx): reported ``failed``, not retried."""

    status = "failed"
    report: dict[str, Any] | None = None  # what the report adds for the worker (``extra.now``)


class Withheld(Undeliverable):
    """The reply was not posted: the audience it would reach now is wider than the one it was
    written for (someone joined, the room opened, a recipient outside the mail's audience).
    Reported ``withheld``, never retried, with ``report`` (the audience now, where the gateway
    knows it) so the worker can answer again for it or tell the owner why not."""

    status = "withheld"

    def __init__(self, detail: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.report = report


@dataclass(frozen=True)
class Claimed:
    reply: Reply
    raw: bytes
    recovered: bool  # found in flight after a restart
    marked: bool  # and it was already marked as handed to the platform


class ReplyQueue:
    """One session's reply queue, seen from the gateway that delivers it."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        session: str,
        *,
        max_age: float,
        gateway: str,
        clock: RedisClock | None = None,
    ) -> None:
        self.r, self.keys, self.session = r, keys, session
        self.max_age, self.gateway = max_age, gateway
        self.clock = clock if clock is not None else RedisClock(r)
        self.last_error = ""  # why the last attempt failed, for the expiry's detail
        self.queue = keys.reply(session)
        self.inflight = keys.inflight(session)
        self.delivered = keys.delivered(session)

    def claim(self, timeout: float) -> Claimed | None:
        """The reply left in flight by a crash, else the next queued one (waiting ``timeout``)."""
        while True:
            raw = self.r.lindex(self.inflight, 0)
            recovered = raw is not None
            if raw is None and timeout <= 0:  # BLMOVE with 0 would block forever
                raw = self.r.lmove(self.queue, self.inflight, "LEFT", "RIGHT")
            elif raw is None:
                raw = self.r.blmove(self.queue, self.inflight, timeout, "LEFT", "RIGHT")  # type: ignore[arg-type]
            if raw is None:
                return None
            if not isinstance(raw, bytes):
                raw = str(raw).encode()
            try:
                reply = Reply.from_json(raw)
            except WireError as exc:
                self._reject(raw, f"unreadable reply: {exc}")
                continue
            marked = recovered and self.r.zscore(self.delivered, reply.reply_id) is not None
            return Claimed(reply, raw, recovered, marked)

    def age(self, claimed: Claimed) -> float:
        """Seconds since the worker made the reply, on Redis's clock."""
        return self.clock.now() - claimed.reply.created

    def is_expired(self, claimed: Claimed) -> bool:
        return self.age(claimed) > self.max_age

    def mark(self, claimed: Claimed) -> None:
        """Record that the reply is being handed to the platform (before the send)."""
        now = self.clock.now()
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(self.delivered, {claimed.reply.reply_id: now})
        pipe.zremrangebyscore(self.delivered, "-inf", now - DELIVERED_KEEP)
        pipe.execute()

    def done(self, claimed: Claimed) -> None:
        self.r.lrem(self.inflight, 1, claimed.raw)  # type: ignore[arg-type]

    def expire(self, claimed: Claimed) -> None:
        """Tell the worker that this reply expired, and drop it."""
        age = self.age(claimed)
        detail = f"not delivered: older than {self.max_age:g} s"
        if self.last_error:
            detail += f"; the last attempt failed: {self.last_error}"
        self.finish(claimed, "expired", detail)
        log.warning("reply.expired", reply_id=claimed.reply.reply_id, age=round(age))

    def finish(
        self,
        claimed: Claimed,
        status: str,
        detail: str = "",
        now: dict[str, Any] | None = None,
    ) -> None:
        """Take the reply out of flight and tell the worker (the only memory writer) its final
        status, atomically: a crash leaves it either in flight or reported, never lost.
        ``now``: a withheld reply's audience now (:class:`Withheld`)."""
        rep = claimed.reply
        note = InboundMessage(
            kind=Kind.DERIVED,
            channel=rep.channel,
            session=rep.session,
            conversation=rep.conversation,
            sender=self.gateway,
            privacy=Privacy.OWNER,
            text="",
            ts=self.clock.now(),
            event_id=new_event_id(),
            extra={
                "type": "reply_status",
                "reply_id": rep.reply_id,
                "answers": rep.answers,
                "status": status,
                "detail": detail[:MAX_DETAIL],
                **({"now": now} if now else {}),
            },
        )
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.keys.inbound_of(rep.channel), note.to_fields())  # type: ignore[arg-type]
        pipe.lrem(self.inflight, 1, claimed.raw)  # type: ignore[arg-type]
        pipe.execute()

    def _reject(self, raw: bytes, reason: str) -> None:
        log.error("reply.rejected", reason=reason)
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(
            self.keys.dead,
            {"reason": reason, "source": self.inflight, "raw": raw[:65536], "at": str(time.time())},
        )
        pipe.lrem(self.inflight, 1, raw)  # type: ignore[arg-type]
        pipe.execute()


def deliver_next(
    queue: ReplyQueue,
    send: Callable[[Reply], None],
    *,
    timeout: float,
    idempotent_sink: bool = False,
    report_delivered: bool = False,
) -> Reply | None:
    """Deliver at most one reply; returns it when ``send`` took it. ``send`` raising
    :class:`Undeliverable` makes it ``failed`` (reported, dropped); any other exception leaves it
    in flight, marked, for the caller to retry under the rules above."""
    claimed = queue.claim(timeout)
    if claimed is None:
        return None
    reply = claimed.reply
    if queue.is_expired(claimed):
        queue.expire(claimed)
        return None
    if claimed.marked and not idempotent_sink:
        log.warning(
            "reply.maybe_delivered",
            reply_id=reply.reply_id,
            detail="the gateway stopped while sending it; not sent again (it is in memory)",
        )
        queue.done(claimed)
        return None
    queue.mark(claimed)
    try:
        send(reply)
    except Withheld as exc:
        queue.finish(claimed, exc.status, str(exc), exc.report)
        log.warning(
            "reply.withheld", reply_id=reply.reply_id, answers=reply.answers, reason=str(exc)
        )
        return None
    except Undeliverable as exc:
        queue.finish(claimed, exc.status, str(exc))
        log.error("reply.failed", reply_id=reply.reply_id, answers=reply.answers, error=str(exc))
        return None
    if report_delivered:
        queue.finish(claimed, "delivered")
    else:
        queue.done(claimed)
    log.info("reply.delivered", reply_id=reply.reply_id, answers=reply.answers)
    return reply
