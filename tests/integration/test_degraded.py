"""Degraded mode (DESIGN.md, issue 3): if the memory database cannot be opened, or a query fails
while the worker runs, the worker still answers with what it has and says so in its log; once
the database is usable again it records again, without a restart.

Real Redis, the worker as its own process, `relaybot chat -m` against the fake model (whose
reply is an echo of the message, so an answer proves the turn ran).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def answered(env: dict[str, str], text: str, session: str = "deg") -> str:
    result = chat(env, text, session=session, timeout=20)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("echo: [cli / owner] "), result.stdout
    assert result.stdout.rstrip().endswith(text)
    return result.stdout


def garbage_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(8192))


def in_a_file(path: Path) -> None:
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("a file where a directory should be\n")


@pytest.mark.parametrize("breakage", [garbage_file, in_a_file], ids=["garbage", "not-a-dir"])
def test_unopenable_memory_the_worker_answers_anyway(
    breakage: object,
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    memory = tmp_path / "broken" / "memory.sqlite3"
    breakage(memory)  # type: ignore[operator]
    env = relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
        RELAYBOT_MEMORY_PATH=str(memory),
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    unavailable = worker.wait_for_log("memory.unavailable")
    assert unavailable["level"] == "error" and unavailable["path"] == str(memory)

    answered(env, "hello without memory")
    answered(env, "and again")
    # someone else's message, with a conversation of its own: answered too
    publish(
        real_redis,
        keys,
        InboundMessage(
            channel="matrix",
            session="matrix:dm-bob",
            conversation="matrix:dm-bob",
            sender="@bob:m.org",
            privacy=Privacy.DIRECT,
            text="hi",
            ts=time.time(),
            event_id=uuid.uuid4().hex,
        ),
    )
    (reply,) = wait_for_replies(real_redis, keys, "matrix:dm-bob", 1)
    assert reply.text.startswith("echo: [matrix / @bob:m.org]")
    assert worker.returncode is None
    # memory commands say plainly that memory is unavailable; status says it cannot read it
    erase = run_relaybot(
        ["memory", "erase", "--conversation", "cli:deg", "--reason", "x", "--yes"], env
    )
    assert erase.returncode == 1
    assert "memory is unavailable" in erase.stderr
    status = run_relaybot(["memory", "status"], env)
    if memory.exists():
        assert status.returncode == 1 and "cannot read the memory database" in status.stderr


def test_a_query_failing_mid_run_then_recovery(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    env = relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    path = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    answered(env, "before the failure")
    assert len(memory_rows(path)) == 2

    # the log table disappears under the running worker (as a broken restore or a bad manual
    # fix would do): every query on it fails from now on
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("ALTER TABLE log RENAME TO log_away")
    try:
        answered(env, "during the failure")
        degraded = worker.wait_for_log("memory.degraded")
        assert degraded["level"] == "error" and "log" in degraded["error"]
        # what the worker had is still used: the context holds the earlier message
        assert "before the failure" in json.dumps(model_server.requests[-1])
        # a conversation it has never read (its history query fails): answered
        publish(
            real_redis,
            keys,
            InboundMessage(
                channel="matrix",
                session="matrix:dm-carol",
                conversation="matrix:dm-carol",
                sender="@carol:m.org",
                privacy=Privacy.DIRECT,
                text="hi from carol",
                ts=time.time(),
                event_id=uuid.uuid4().hex,
            ),
        )
        (reply,) = wait_for_replies(real_redis, keys, "matrix:dm-carol", 1)
        assert reply.text.endswith("hi from carol")
        failures = len(worker.events("memory.degraded"))
        assert failures >= 3
    finally:
        conn.execute("ALTER TABLE log_away RENAME TO log")  # repaired
        conn.close()

    answered(env, "after the repair")
    texts = [r["text"] for r in memory_rows(path)]
    assert texts[:2] == ["before the failure", texts[1]]
    assert texts[2:] == ["after the repair", texts[3]]  # recorded again, no restart
    assert "during the failure" not in texts  # what arrived meanwhile was answered, not kept
    assert worker.returncode is None
    # the index still works after the repair
    assert memory_rows(path, "SELECT rowid FROM log_fts WHERE log_fts MATCH 'repair'")


def test_a_database_locked_by_another_program(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """Someone holds a write transaction open (a sqlite3 shell, a backup tool): the worker cannot
    begin its own. It answers without memory meanwhile, and records again once the lock is gone."""
    env = relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
    )
    worker = procs.worker(env, r=real_redis, keys=Keys(prefix))
    path = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    answered(env, "before the lock")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        answered(env, "while locked")
        degraded = worker.wait_for_log("memory.degraded")
        assert "locked" in degraded["error"]
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    answered(env, "after the lock")
    texts = [r["text"] for r in memory_rows(path)]
    assert "before the lock" in texts and "after the lock" in texts
    assert worker.returncode is None
