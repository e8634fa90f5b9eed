"""RedisClock without a server to ask: the last offset is kept; none yet is an error."""

from __future__ import annotations

import time

import fakeredis
import pytest
import redis

from contract.clock import RedisClock


def test_a_lost_redis_keeps_the_last_offset() -> None:
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    ticks = [0.0]
    clock = RedisClock(r, local=lambda: time.time() - 3600, monotonic=lambda: ticks[0])
    first = clock.now()
    assert abs(first - time.time()) < 1  # Redis's time, not the local clock's
    server.connected = False
    ticks[0] = 60.0  # a refresh is due, and Redis does not answer
    assert abs(clock.now() - time.time()) < 1


def test_no_answer_yet_is_an_error_not_a_guess() -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    with pytest.raises(redis.ConnectionError):
        RedisClock(fakeredis.FakeRedis(server=server)).now()
