"""Bad stream entries written by hand with the real ``redis-cli``: each is dead-lettered with its
reason and original fields, the worker goes on, and ``relaybot status`` shows it all."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from deploy.embedded import redis_binary
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    dead_letters,
    lease_holder,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

OVERSIZE = 100_000  # characters; the contract allows 64 000


def redis_cli(server: RedisServer, *args: str | bytes, stdin: bytes | None = None) -> bytes:
    """Run the real redis-cli against the test server; ``stdin`` becomes the last argument (-x)."""
    cmd: list[str | bytes] = [redis_binary("redis-cli"), "-h", "127.0.0.1", "-p", str(server.port)]
    if stdin is not None:
        cmd.append("-x")
    result = subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=10, check=True)
    assert b"ERR" not in result.stdout, result.stdout
    return result.stdout.strip()


def valid_fields(session: str, **override: str) -> dict[str, str]:
    fields = {
        "v": "1",
        "kind": "message",
        "channel": "cli",
        "session": session,
        "conversation": session,
        "sender": "tester",
        "sender_name": "Tester",
        "privacy": "owner",
        "text": "hello",
        "ts": f"{time.time():.3f}",
        "event_id": str(uuid.uuid4()),
        "extra": "{}",
    }
    fields.update(override)
    return fields


def flat(fields: dict[str, str], *, without: str | None = None) -> list[str]:
    out: list[str] = []
    for key, value in fields.items():
        if key != without:
            out += [key, value]
    return out


def test_bad_entries_are_dead_lettered_and_status_shows_it(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    env = relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
    )
    worker = procs.worker(env, r=real_redis, keys=keys)
    holder = lease_holder(real_redis, keys)
    stream = keys.inbound
    ok = valid_fields("cli:bad")

    # (entry id, what the reason must say, the original fields as written)
    written: list[tuple[str, str, dict[str, bytes]]] = []

    def xadd(reason: str, fields: dict[str, bytes], *, last: tuple[str, bytes] | None = None):
        args: list[str | bytes] = []
        for key, value in fields.items():
            args += [key, value]
        if last is not None:  # the last field's value comes from stdin: binary-safe, no size limit
            args.append(last[0])
        sid = redis_cli(redis_server, "XADD", stream, "*", *args, stdin=last and last[1])
        written.append((sid.decode(), reason, {**fields, **(dict([last]) if last else {})}))

    def enc(fields: dict[str, str]) -> dict[str, bytes]:
        return {k: v.encode() for k, v in fields.items()}

    xadd("unknown field(s): hello", {"hello": b"world"})
    xadd(
        "missing field: session",
        {"v": b"1", "kind": b"message", "channel": b"cli", "text": b"half a message"},
    )
    xadd("unsupported schema version '2'", enc({**ok, "v": "2"}))
    xadd("privacy: Input should be 'owner', 'direct' or 'group'", enc({**ok, "privacy": "public"}))
    xadd(
        "text: String should have at most 64000 characters",
        enc({k: v for k, v in ok.items() if k != "text"}),
        last=("text", b"x" * OVERSIZE),
    )
    xadd("extra: Value error, extra is not valid JSON", enc({**ok, "extra": '{"broken": '}))
    xadd(
        "field 'text' is not valid UTF-8",
        enc({k: v for k, v in ok.items() if k != "text"}),
        last=("text", b"\xff\xfe\x00binary\x80junk"),
    )
    junk_name = b"\xc3\x28"  # not UTF-8
    xadd("a field name is not valid UTF-8", {"v": b"1", junk_name: b"junk"})  # type: ignore[dict-item]

    wait_until(
        lambda: real_redis.xlen(keys.dead) == len(written),
        message=lambda: f"{len(written)} dead letters; worker log:\n{worker.log_text()[-3000:]}",
    )
    dead = dead_letters(real_redis, keys)
    for (sid, reason, fields), (_dead_id, entry) in zip(written, dead, strict=True):
        assert entry["source_id"].decode() == sid
        assert entry["source_stream"].decode() == stream
        assert entry["consumer"].decode() == holder
        assert float(entry["dead_at"]) > 0
        text = entry["reason"].decode()
        assert text.startswith("invalid entry: "), text
        assert reason in text, text
        originals = {k.removeprefix("orig."): v for k, v in entry.items() if k.startswith("orig.")}
        expected = {
            (k if isinstance(k, str) else k.decode(errors="replace")): v.decode(errors="replace")
            for k, v in fields.items()
        }
        kept = {k: v.decode() for k, v in originals.items()}
        if entry["truncated"] == b"1":  # a dead letter keeps at most 64 KiB of the entry
            assert kept["text"] == expected["text"][: len(kept["text"])]
            kept["text"] = expected["text"]
        assert kept == expected
    oversize = dead[4][1]
    assert int(oversize["orig_bytes"]) > OVERSIZE
    assert 60_000 < len(oversize["orig.text"]) <= 64 * 1024  # bounded, still enough to look at

    # the worker goes on: a valid message sent after them is answered
    after = chat(env, "after the junk", session="bad")
    assert after.returncode == 0, after.stderr
    assert after.stdout.startswith("echo: [cli / owner] ")
    assert after.stdout.endswith(": after the junk\n")
    assert worker.returncode is None
    assert model_server.calls == 1  # no bad entry reached the model

    # a valid entry written by hand, for a session with no terminal attached: its reply waits
    away = valid_fields("cli:away", text="written with redis-cli")
    redis_cli(redis_server, "XADD", stream, "*", *flat(away))
    wait_for_replies(real_redis, keys, "cli:away", 1)

    result = run_relaybot(["status", "--json"], env, timeout=20)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["prefix"] == prefix
    assert status["stream"] == {"keys": f"{stream}*", "length": len(written) + 2}
    assert status["dead_letters"] == len(written)
    group = status["group"]
    assert group["pending"] == 0
    assert group["consumers"] == 1
    assert group["oldest_pending_id"] is None
    assert group["lag"] in (0, None)  # XINFO reports lag from Redis 7 on
    assert status["reply_queues"] == {"cli:away": 1}
    assert status["in_flight"] == {}
    assert status["worker_lease"]["holder"] == holder
    assert 0 < status["worker_lease"]["ttl_ms"] <= 10_000
    beat = status["heartbeats"]["worker"]
    assert beat["pid"] == worker.pid
    assert beat["consumer"] == holder
    assert 0 <= beat["age_s"] < 3
    assert beat["stale"] is False
    assert set(status["heartbeats"]) == {"worker"}  # the chat's heartbeat left with it

    plain = run_relaybot(["status"], env, timeout=20)
    assert plain.returncode == 0, plain.stderr
    text = plain.stdout
    assert f"inbound streams ({stream}*): {len(written) + 2} entries" in text
    assert "group worker: 1 consumer(s), 0 pending" in text
    assert f"dead letters: {len(written)}" in text
    assert f"worker lease: {holder}" in text
    assert "reply queues: 1\n  cli:away: 1" in text
    assert "  worker: " in text
    assert f"(pid {worker.pid})" in text
    assert "STALE" not in text
    assert "{" not in text  # readable lines, not JSON

    # `relaybot redis-cli` reaches the same Redis
    xlen = run_relaybot(["redis-cli", "XLEN", keys.dead], env, timeout=20)
    assert xlen.returncode == 0, xlen.stderr
    assert xlen.stdout.strip() == str(len(written))
