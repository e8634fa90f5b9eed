"""Issue 24, item 9: every owner command works under the shipped ACL file, as the terminal's
account (``relaybot-cli`` in deploy/redis/users.acl), against a worker and a jobs process with
their own accounts. ``relaybot memory resummarize`` failed there (rq's keys and ``HGETALL``: the
terminal's account has neither); it is an owner command now, which the worker enqueues."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.bus import publish
from contract.keys import Keys
from tests.integration.test_erasure_everywhere import AclRedis, message
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

CONFIG = """
[owner]
name = "Ada"

[derive]
judge_after = 0.5
quiet = 1
check_every = 0.2
min_rows = 2
"""


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    yield server
    server.stop()


def test_every_owner_command_runs_under_the_terminals_acl_account(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    home = tmp_path / "home"
    write_config(home, CONFIG)
    keys_env = {"RELAYBOT_TURNS_MODE": "followup"}
    worker_env = relaybot_env(home, redis_url=acl_redis.url("worker"),
                              model_url=model_server.base_url, **keys_env)  # fmt: skip
    jobs_env = relaybot_env(home, redis_url=acl_redis.url("jobs"), model_url=model_server.base_url)
    cli = relaybot_env(home, redis_url=acl_redis.url("cli"))
    admin = acl_redis.client("worker")
    keys = Keys()
    worker = procs.worker(worker_env, r=admin, keys=keys)
    procs.jobs(jobs_env)
    db = home / "memory.sqlite3"

    assert chat(cli, "the boat leaves at nine", session="sum").returncode == 0
    assert chat(cli, "bring the blue tent", session="sum").returncode == 0
    matrix = acl_redis.client("matrix")
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob", "hello from bob"))
    wait_for_replies(admin, keys, "matrix:dm-bob", 1)
    wait_until(lambda: memory_rows(db, "SELECT id FROM summary"), timeout=60,
               message="a summary of cli:sum")  # fmt: skip

    def ok(*args: str, stdin: str | None = None) -> str:
        done = run_relaybot(list(args), cli, timeout=180, stdin=stdin)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    # read-only: memory and Redis as the terminal's account sees them
    assert "log:" in ok("memory", "status")
    assert "boat" in ok("memory", "search", "boat")
    assert "hello from bob" in ok("memory", "search", "hello", "--sender", "matrix:@bob:m.org")
    assert "cli:sum" in ok("memory", "summaries")
    ok("memory", "summaries", "--all", "--json")
    # the worker enqueues the new versions (the terminal's account may not touch rq's keys)
    assert "enqueued cli:sum" in ok("memory", "resummarize", "--conversation", "cli:sum")
    wait_until(lambda: memory_rows(db, "SELECT id FROM summary WHERE supersedes IS NOT NULL"),
               timeout=60, message="the new version of the summary")  # fmt: skip
    export = tmp_path / "export.jsonl"
    ok("memory", "export", "--out", str(export))
    ok("memory", "import", str(export))
    # notes
    assert json.loads(ok("memory", "notes", "add", "ada likes tea", "--json"))["ok"]
    (found,) = memory_rows(db, "SELECT id FROM note WHERE text = 'ada likes tea'")
    note = str(found["id"])
    assert "ada likes tea" in ok("memory", "notes", "list")
    ok("memory", "notes", "show", note)
    ok("memory", "notes", "search", "tea")
    ok("memory", "notes", "supersede", note, "ada likes green tea")
    # identity
    ok("entities", "list")
    ok("entities", "show", "matrix:@bob:m.org")
    publish(acl_redis.client("email"), keys,
            message("email", "bob@example.org", "email:t1", "mail from bob"))  # fmt: skip
    wait_for_replies(admin, keys, "email:t1", 1)
    ok("entities", "suggest", "matrix:@bob:m.org", "email:bob@example.org")
    ok("entities", "reject", "matrix:@bob:m.org", "email:bob@example.org")
    ok("entities", "link", "matrix:@bob:m.org", "email:bob@example.org")
    ok("entities", "unlink", "matrix:@bob:m.org", "email:bob@example.org")
    ok("entities", "merge", "email:bob@example.org", "--reason", "test", "--yes")
    ok("entities", "unmerge", "email:bob@example.org", "--reason", "test")
    # erasure, previewed first
    (row,) = memory_rows(db, "SELECT id FROM log WHERE text = 'hello from bob'")
    assert "This erases id" in ok("memory", "erase", "--id", str(row["id"]), "--reason", "x",
                                  "--dry-run")  # fmt: skip
    ok("memory", "erase", "--id", str(row["id"]), "--reason", "x", "--yes")
    assert not worker.events("entry.dead_lettered")
