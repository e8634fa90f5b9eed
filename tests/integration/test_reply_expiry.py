"""Replies older than ``delivery.max_age`` are not delivered late; memory marks them expired."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    replies,
    send,
    wait_for_replies,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def _env(
    tmp_path: Path, server: RedisServer, prefix: str, model: FakeModelServer, max_age: str
) -> dict[str, str]:
    return relaybot_env(
        tmp_path / "home",
        redis_url=server.url,
        prefix=prefix,
        model_url=model.base_url,
        RELAYBOT_REPLY_MAX_AGE=max_age,
    )


def _status_rows(db: Path, reply_id: str) -> list[dict]:
    return memory_rows(db, "SELECT * FROM reply_status WHERE reply_id = ?", reply_id)


def test_a_reply_older_than_max_age_is_not_printed_and_is_marked_expired(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    env = _env(tmp_path, redis_server, prefix, model_server, "1")
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    procs.worker(env, r=real_redis, keys=keys)

    sid = send(real_redis, keys, "exp", "answered while away")  # no terminal is attached
    [old] = wait_for_replies(real_redis, keys, "cli:exp", 1)
    assert old.answers == sid
    wait_until(lambda: time.time() - old.created > 1.05, timeout=5, message="the reply to age")

    result = chat(env, "and now", session="exp")
    assert result.returncode == 0, result.stderr
    assert "answered while away" not in result.stdout
    assert "queued while this session was away" not in result.stdout
    assert result.stdout.startswith("echo: [cli / owner] ")
    assert result.stdout.endswith(": and now\n")
    assert result.stdout.count("\n") == 1
    assert replies(real_redis, keys, "cli:exp") == []

    marks = wait_until(
        lambda: _status_rows(db, old.reply_id), message="the expiry to be recorded in memory"
    )
    assert [(m["status"], m["detail"]) for m in marks] == [
        ("expired", "not delivered: older than 1 s")
    ]
    # the reply itself stays in memory; it was just not shown late
    [row] = memory_rows(db, "SELECT * FROM log WHERE direction = 'out' AND stream_id = ?", sid)
    assert row["reply_id"] == old.reply_id


def test_an_expired_reply_does_not_hide_the_fresh_ones_queued_behind_it(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    env = _env(tmp_path, redis_server, prefix, model_server, "30")
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    procs.worker(env, r=real_redis, keys=keys)

    send(real_redis, keys, "mix", "long ago")
    [old] = wait_for_replies(real_redis, keys, "cli:mix", 1)
    # it has waited a minute in the queue (the worker made it; we only age it)
    aged = json.loads(real_redis.lindex(keys.reply("cli:mix"), 0))
    aged["created"] = time.time() - 60
    real_redis.lset(keys.reply("cli:mix"), 0, json.dumps(aged))
    send(real_redis, keys, "mix", "just now")
    wait_for_replies(real_redis, keys, "cli:mix", 2)

    result = chat(env, "and now", session="mix")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "long ago" not in result.stdout
    assert len(lines) == 3, result.stdout
    assert lines[0].endswith(", queued while this session was away)")
    assert lines[1].endswith(": just now")
    assert lines[2].endswith(": and now")
    wait_until(lambda: _status_rows(db, old.reply_id), message="the expiry in memory")
