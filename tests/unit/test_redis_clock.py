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


def test_a_step_of_the_local_clock_is_followed_at_once() -> None:
    """An NTP correction or a manual change moves the local clock: the cached offset would be
    off by the step until the next refresh (30 s); the step is seen against the monotonic clock
    and Redis is asked again at once."""
    r = fakeredis.FakeRedis()
    step = [0.0]
    ticks = [0.0]
    clock = RedisClock(r, local=lambda: time.time() + step[0], monotonic=lambda: ticks[0])
    assert abs(clock.now() - time.time()) < 1
    step[0] = -25 * 3600.0  # the host's clock is set back a day and an hour
    ticks[0] = 0.5  # well within the refresh
    assert abs(clock.now() - time.time()) < 1
    step[0] = 7200.0
    ticks[0] = 1.0
    assert abs(clock.now() - time.time()) < 1
