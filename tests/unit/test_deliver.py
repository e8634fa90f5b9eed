"""Reply delivery: once, across gateway crashes, never late."""

from __future__ import annotations

import time

import fakeredis
import pytest

from contract.clock import RedisClock
from contract.keys import Keys
from contract.messages import InboundMessage, Reply
from gateways.deliver import ReplyQueue, Undeliverable, Withheld, deliver_next


def reply(n: int, *, created: float | None = None) -> Reply:
    return Reply(
        reply_id=f"r{n}", answers=f"{n}-0", channel="cli", session="cli:s",
        conversation="cli:s", text=f"answer {n}", created=created or time.time(),
    )  # fmt: skip


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def queue(r: fakeredis.FakeRedis, max_age: float = 3600) -> ReplyQueue:
    return ReplyQueue(r, Keys("rb:"), "cli:s", max_age=max_age, gateway="gateway:test")


def push(r: fakeredis.FakeRedis, *replies: Reply) -> None:
    for rep in replies:
        r.rpush(Keys("rb:").reply("cli:s"), rep.to_json())


class Crash(Exception):
    pass


def test_delivers_in_order_once(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1), reply(2))
    got: list[str] = []
    q = queue(r)
    while deliver_next(q, lambda rep: got.append(rep.reply_id), timeout=0):
        pass
    assert got == ["r1", "r2"]
    assert deliver_next(q, got.append, timeout=0) is None  # type: ignore[arg-type]
    assert r.llen(q.inflight) == 0


def test_queued_while_gateway_down_is_delivered_on_return(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1))  # no gateway was running
    got: list[str] = []
    assert deliver_next(queue(r), lambda rep: got.append(rep.text), timeout=0) is not None
    assert got == ["answer 1"]


def test_crash_before_send_resends_after_restart(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1))
    q = queue(r)
    claimed = q.claim(0)  # the gateway took it and died before sending
    assert claimed is not None
    got: list[str] = []
    deliver_next(queue(r), lambda rep: got.append(rep.reply_id), timeout=0)
    assert got == ["r1"]


@pytest.mark.parametrize("idempotent", [False, True])
def test_crash_during_send_never_shows_twice(r: fakeredis.FakeRedis, idempotent: bool) -> None:
    push(r, reply(1), reply(2))
    shown: list[str] = []

    def dies(rep: Reply) -> None:
        shown.append(rep.reply_id)
        raise Crash  # killed right after the platform got it, before it was cleared

    with pytest.raises(Crash):
        deliver_next(queue(r), dies, timeout=0)
    sent_again: list[str] = []
    q = queue(r)  # the restarted gateway
    while deliver_next(
        q, lambda rep: sent_again.append(rep.reply_id), timeout=0, idempotent_sink=idempotent
    ) or r.llen(q.queue):
        pass
    if idempotent:  # e.g. Matrix: the same transaction id, the server drops the copy
        assert sent_again == ["r1", "r2"]
    else:
        assert shown + sent_again == ["r1", "r2"]


def test_old_reply_is_not_delivered_and_worker_is_told(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1, created=time.time() - 7200), reply(2))
    got: list[str] = []
    q = queue(r, max_age=3600)
    while deliver_next(q, lambda rep: got.append(rep.reply_id), timeout=0) or r.llen(q.queue):
        pass
    assert got == ["r2"]
    ((_sid, fields),) = r.xrange(Keys("rb:").inbound_of("cli"))  # the gateway's own stream
    note = InboundMessage.from_fields(fields)
    assert note.kind == "derived"
    assert note.extra == {
        "type": "reply_status", "reply_id": "r1", "answers": "1-0", "status": "expired",
        "detail": "not delivered: older than 3600 s",
    }  # fmt: skip


def test_unreadable_reply_goes_to_dead_letters(r: fakeredis.FakeRedis) -> None:
    r.rpush(Keys("rb:").reply("cli:s"), b"{broken")
    push(r, reply(2))
    got: list[str] = []
    deliver_next(queue(r), lambda rep: got.append(rep.reply_id), timeout=0)
    assert got == ["r2"]
    ((_sid, fields),) = r.xrange(Keys("rb:").dead)
    assert fields[b"reason"].startswith(b"unreadable reply")


def statuses(r: fakeredis.FakeRedis) -> list[dict[str, object]]:
    return [
        InboundMessage.from_fields(fields).extra
        for _sid, fields in r.xrange(Keys("rb:").inbound_of("cli"))
    ]


def test_a_refusal_for_good_is_reported_failed_not_retried(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1), reply(2))

    def refuses(rep: Reply) -> None:
        raise Undeliverable("550 5.1.1 no such user")

    q = queue(r)
    assert deliver_next(q, refuses, timeout=0) is None
    assert statuses(r) == [
        {"type": "reply_status", "reply_id": "r1", "answers": "1-0", "status": "failed",
         "detail": "550 5.1.1 no such user"},
    ]  # fmt: skip
    assert r.llen(q.inflight) == 0  # out of flight in the same MULTI as the report
    got: list[str] = []
    deliver_next(q, lambda rep: got.append(rep.reply_id), timeout=0)
    assert got == ["r2"]


def test_a_reply_the_gateway_refuses_to_post_is_reported_withheld(r: fakeredis.FakeRedis) -> None:
    """Issue 24, item 4: the recheck right before posting found a recipient outside the audience
    the reply was written for: not sent, reported ``withheld`` (not ``failed``), not retried."""
    push(r, reply(1))

    def recheck(rep: Reply) -> None:
        raise Withheld("not sent: bob@example.com would get it")

    q = queue(r)
    assert deliver_next(q, recheck, timeout=0, report_delivered=True) is None
    assert [(s["status"], s["detail"]) for s in statuses(r)] == [
        ("withheld", "not sent: bob@example.com would get it")
    ]
    assert r.llen(q.inflight) == 0 and r.llen(q.queue) == 0


def test_a_delivery_is_reported_when_asked(r: fakeredis.FakeRedis) -> None:
    push(r, reply(1))
    q = queue(r)
    assert deliver_next(q, lambda rep: None, timeout=0, report_delivered=True) is not None
    assert [(s["reply_id"], s["status"]) for s in statuses(r)] == [("r1", "delivered")]
    assert r.llen(q.inflight) == 0


@pytest.mark.parametrize("skew", [-25 * 3600.0, 25 * 3600.0])
def test_ages_are_measured_on_redis_clock_not_the_gateways(
    r: fakeredis.FakeRedis, skew: float
) -> None:
    """A gateway whose own clock is 25 h off still delivers a fresh reply and expires an old
    one: both are stamped on Redis's clock by the worker and measured on it here."""
    redis_now = RedisClock(r).now()
    push(r, reply(1, created=redis_now - 7200), reply(2, created=redis_now))
    skewed = RedisClock(r, local=lambda: time.time() + skew)
    q = ReplyQueue(r, Keys("rb:"), "cli:s", max_age=3600, gateway="gateway:test", clock=skewed)
    got: list[str] = []
    while deliver_next(q, lambda rep: got.append(rep.reply_id), timeout=0) or r.llen(q.queue):
        pass
    assert got == ["r2"]
    assert [(s["reply_id"], s["status"]) for s in statuses(r)] == [("r1", "expired")]
