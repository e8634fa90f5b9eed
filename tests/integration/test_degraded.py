"""Memory that cannot be written (issue 11: never answered-but-unrecorded). If the memory database
cannot be opened, a write fails while the worker runs, or another program holds the write lock,
the worker answers nothing it cannot record: it says so (log, heartbeat, ``relaybot status``),
keeps the entries pending, tries again, and once memory takes writes again answers each of them
once, all recorded, without a restart. (Reads that fail still degrade: a turn answers with what
it has, memory.facade.)

Real Redis, the worker as its own process, `relaybot chat -m` against the fake model (whose
reply is an echo of the message, so an answer proves the turn ran).
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.liveness import heartbeats
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def send(r: redis.Redis, keys: Keys, text: str, session: str = "matrix:dm-bob") -> None:
    publish(
        r,
        keys,
        InboundMessage(
            channel="matrix", session=session, conversation=session, sender="@bob:m.org",
            privacy=Privacy.DIRECT, text=text, ts=time.time(), event_id=uuid.uuid4().hex,
        ),
    )  # fmt: skip


def held_then_answered(
    env: dict[str, str],
    r: redis.Redis,
    keys: Keys,
    repair: Callable[[], None],
    texts: list[str],
    worker: Any,
) -> None:
    """The messages wait unanswered while memory refuses writes, the worker's heartbeat says so;
    after ``repair`` each is answered once."""
    for text in texts:
        send(r, keys, text)
    blocked = wait_until(
        lambda: heartbeats(r, keys).get("worker", {}).get("memory"), timeout=30,
        message=lambda: "the worker's heartbeat never said memory is blocked",
    )  # fmt: skip
    assert blocked.startswith("blocked: ")
    status = run_relaybot(["status"], env)
    assert "memory blocked" in status.stdout, status.stdout
    assert r.llen(keys.reply("matrix:dm-bob")) == 0  # nothing answered that is not recorded
    assert worker.returncode is None
    repair()
    replies = wait_for_replies(r, keys, "matrix:dm-bob", len(texts), timeout=60)
    assert [rep.text.rsplit(": ", 1)[-1] for rep in replies] == texts
    worker.wait_for_log("memory.write_resumed", timeout=30)
    time.sleep(0.5)
    assert r.llen(keys.reply("matrix:dm-bob")) == len(texts)  # once each


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
def test_unopenable_memory_holds_messages_until_it_opens(
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
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the count is the check
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    unavailable = worker.wait_for_log("memory.unavailable")
    assert unavailable["level"] == "error" and unavailable["path"] == str(memory)
    # memory commands say plainly that memory is unavailable; status says it cannot read it
    erase = run_relaybot(
        ["memory", "erase", "--conversation", "cli:deg", "--reason", "x", "--yes"], env
    )
    assert erase.returncode == 1
    assert "memory is unavailable" in erase.stderr
    status = run_relaybot(["memory", "status"], env)
    if memory.exists():
        assert status.returncode == 1 and "cannot read the memory database" in status.stderr

    def repair() -> None:
        if memory.parent.is_file():
            memory.parent.unlink()
        else:
            memory.unlink()

    held_then_answered(env, real_redis, keys, repair, ["hello", "anyone there?"], worker)
    texts = [r["text"] for r in memory_rows(memory)]
    assert texts[0::2] == ["hello", "anyone there?"] and len(texts) == 4
    answered(env, "and the terminal too")


def test_a_write_failing_mid_run_holds_then_catches_up(
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
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the count is the check
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    path = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    answered(env, "before the failure")
    assert len(memory_rows(path)) == 2

    # the log table disappears under the running worker (as a broken restore or a bad manual
    # fix would do): every write to it fails until it is back
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("ALTER TABLE log RENAME TO log_away")

    def repair() -> None:
        conn.execute("ALTER TABLE log_away RENAME TO log")
        conn.close()

    held_then_answered(env, real_redis, keys, repair, ["during the failure", "and more"], worker)
    blocked = worker.wait_for_log("memory.write_blocked")
    assert blocked["level"] == "error" and "log" in blocked["error"]
    answered(env, "after the repair")
    texts = [r["text"] for r in memory_rows(path)]
    assert texts[0] == "before the failure"
    assert texts[2::2] == ["during the failure", "and more", "after the repair"]  # no gap
    assert worker.returncode is None
    # the index still works after the repair
    # (the worker indexes its commits within 0.25 s, or when idle: memory.store)
    wait_until(
        lambda: memory_rows(path, "SELECT rowid FROM log_fts WHERE log_fts MATCH 'repair'"),
        timeout=10,
        message="the repaired rows to be indexed",
    )


def test_a_database_locked_by_another_program(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """Someone holds a write transaction open (a sqlite3 shell, a backup tool): the worker cannot
    begin its own. Messages wait meanwhile, and are answered and recorded once the lock is gone."""
    env = relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the count is the check
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    path = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    answered(env, "before the lock")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")

    def unlock() -> None:
        conn.execute("ROLLBACK")
        conn.close()

    held_then_answered(env, real_redis, keys, unlock, ["while locked"], worker)
    assert "locked" in worker.wait_for_log("memory.write_blocked")["error"]
    answered(env, "after the lock")
    texts = [r["text"] for r in memory_rows(path)]
    assert texts[0::2] == ["before the lock", "while locked", "after the lock"]
    assert worker.returncode is None
