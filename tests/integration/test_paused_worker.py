"""A worker paused with SIGSTOP mid-turn until its lease expires (issue 11, case 6).

Real Redis, two ``relaybot worker`` processes and the fake model server. Worker A is stopped
while its model call is out; its lease expires; worker B takes over, claims the entry and asks
the model itself; while B waits for its answer, A is continued and gets its own answer. Before,
A's memory transaction was open across the model call, so B answered without memory and A then
committed its own reply: the user got B's answer, memory held A's. Now A's write is refused
inside its SQLite transaction (the fencing token) and A exits 4; the user gets one answer, and
memory holds that one.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, memory_rows, relaybot_env, wait_for_replies, wait_until
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def test_a_sigstopped_worker_whose_lease_expired_cannot_commit_its_answer(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[worker]\nlease_seconds = 1\n", encoding="utf-8")
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    keys = Keys(prefix)
    a = procs.worker(env, r=real_redis, keys=keys)
    session = "matrix:!room"
    publish(
        real_redis,
        keys,
        InboundMessage(
            channel="matrix", session=session, conversation=session, sender="@bob:m.org",
            privacy=Privacy.DIRECT, text="slow question [[delay:4]]", ts=time.time(),
            event_id=uuid.uuid4().hex,
        ),
    )  # fmt: skip
    wait_until(lambda: len(model_server.requests) >= 1 or None, timeout=30)
    os.kill(a.popen.pid, signal.SIGSTOP)  # paused inside its model call
    try:
        b = procs.worker(env, r=real_redis, keys=keys)  # takes the lease once A's expires
        wait_until(lambda: len(model_server.requests) >= 2 or None, timeout=30)
    finally:
        os.kill(a.popen.pid, signal.SIGCONT)  # A resumes while B waits for its model
    assert a.popen.wait(timeout=30) == 4  # A stops: it lost the lease
    lost = a.wait_for_log("worker.lease_lost")
    # whichever comes first stops it: the lease renewal noticing, the fence refusing the write
    # of its reply (its model call runs on a pool thread: the writer may notice before the
    # reply is back), or the commit script refusing the ack
    assert any(why in lost["error"] for why in ("fenced", "LEASE", "lease was lost")), lost

    (reply,) = wait_for_replies(real_redis, keys, session, 1, timeout=30)
    time.sleep(1.0)
    assert real_redis.llen(keys.reply(session)) == 1  # one answer
    rows = memory_rows(home / "memory.sqlite3", "SELECT direction, reply_id FROM log ORDER BY id")
    assert [r["direction"] for r in rows] == ["in", "out"]
    assert rows[1]["reply_id"] == reply.reply_id  # memory holds the answer the user got
    assert int(real_redis.xpending(keys.inbound_of("matrix"), Keys.GROUP)["pending"]) == 0
    assert b.returncode is None
