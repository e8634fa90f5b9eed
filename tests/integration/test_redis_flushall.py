"""An operator's FLUSHALL on a live Redis (no restart): the worker's read script finds a stream key
gone ("ERR no such key", not NOGROUP); the worker takes it as Redis having lost its data, makes
its groups again and goes on answering (it exited with "cannot reach Redis", and under honcho
every process stopped). A Redis restart that lost everything:
tests/integration/test_redis_restart.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    relaybot_env,
    replies,
    send,
    wait_for_replies,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def test_the_worker_rides_out_a_flushall_and_answers_after_it(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
) -> None:
    keys = Keys(prefix)
    env = relaybot_env(tmp_path / "home", redis_url=redis_server.url, prefix=prefix,
                       model_url=model_server.base_url)  # fmt: skip
    worker = procs.worker(env, r=real_redis, keys=keys)
    send(real_redis, keys, "fl", "before the flush")
    wait_for_replies(real_redis, keys, "cli:fl", 1)
    real_redis.flushall()
    worker.wait_for_log("worker.groups_lost", timeout=20)
    send(real_redis, keys, "fl", "after the flush")
    wait_until(  # (the reply before the flush may be queued again: Redis lost it)
        lambda: any("after the flush" in r.text for r in replies(real_redis, keys, "cli:fl")),
        timeout=30, message=lambda: worker.log_text()[-1500:],
    )  # fmt: skip
    assert worker.popen.poll() is None, worker.log_text()[-800:]
