"""One clock (issue 11: "reply ages are measured against Redis's clock, not between hosts"),
against a real Redis: a gateway whose own clock is 25 h off still delivers a fresh reply and
expires an old one, and the clock asks Redis once per refresh, not once per call."""

from __future__ import annotations

import time

import pytest
import redis

from contract.clock import RedisClock
from contract.keys import Keys
from contract.messages import InboundMessage, Reply
from gateways.deliver import ReplyQueue, deliver_next

pytestmark = pytest.mark.integration

DAY_AND_A_BIT = 25 * 3600.0


def redis_time(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1e6


def time_calls(r: redis.Redis) -> int:
    stats: dict[str, dict[str, int]] = r.info("commandstats")  # type: ignore[assignment]
    return int(stats.get("cmdstat_time", {}).get("calls", 0))


@pytest.mark.parametrize("skew", [-DAY_AND_A_BIT, DAY_AND_A_BIT])
def test_the_clock_reads_redis_time_whatever_the_local_clock_says(
    real_redis: redis.Redis, skew: float
) -> None:
    clock = RedisClock(real_redis, local=lambda: time.time() + skew)
    before = redis_time(real_redis)
    now = clock.now()
    after = redis_time(real_redis)
    assert before - 0.05 <= now <= after + 0.05


def test_the_clock_asks_redis_once_per_refresh_not_per_call(real_redis: redis.Redis) -> None:
    ticks = [0.0]
    clock = RedisClock(real_redis, refresh=30.0, monotonic=lambda: ticks[0])
    start = time_calls(real_redis)
    for _ in range(100):
        clock.now()
    assert time_calls(real_redis) - start == 1
    ticks[0] = 31.0  # the refresh is due
    clock.now()
    clock.now()
    assert time_calls(real_redis) - start == 2


@pytest.mark.parametrize("skew", [-DAY_AND_A_BIT, DAY_AND_A_BIT])
def test_a_gateway_with_a_skewed_clock_delivers_fresh_replies_and_expires_old_ones(
    real_redis: redis.Redis, prefix: str, skew: float
) -> None:
    keys = Keys(prefix)
    session = "cli:skew"
    stamped = redis_time(real_redis)  # the worker stamps Reply.created on Redis's clock

    def reply(n: int, created: float) -> Reply:
        return Reply(
            reply_id=f"r{n}", answers=f"cli/{n}-0", channel="cli", session=session,
            conversation=session, text=f"answer {n}", created=created,
        )  # fmt: skip

    for rep in (reply(1, stamped - 7200), reply(2, stamped)):
        real_redis.rpush(keys.reply(session), rep.to_json())
    gateway_clock = RedisClock(real_redis, local=lambda: time.time() + skew)
    queue = ReplyQueue(
        real_redis, keys, session, max_age=3600, gateway="gateway:cli", clock=gateway_clock
    )
    got: list[str] = []
    while real_redis.exists(queue.queue, queue.inflight):
        deliver_next(queue, lambda rep: got.append(rep.reply_id), timeout=0)
    assert got == ["r2"]  # the fresh one delivered, the old one not
    entries: list = real_redis.xrange(keys.inbound_of("cli"))  # type: ignore[assignment]
    [note] = [InboundMessage.from_fields(fields) for _sid, fields in entries]
    assert (note.extra["reply_id"], note.extra["status"]) == ("r1", "expired")
    assert abs(note.ts - stamped) < 60  # the report is stamped on Redis's clock too
