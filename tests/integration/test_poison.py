"""No entry can stop the worker, and nothing unread is trimmed (issue 11), against a real Redis
and the real worker process: hostile entries (thousands of fields, 100 MB), an entry that kills
the worker every time, a channel no gateway serves, a flood of dead letters, and messages that
waited a day for a worker."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    dead_letters,
    pending,
    relaybot_env,
    replies,
    send,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer
from worker.turn import SET_ASIDE

pytestmark = pytest.mark.integration


def valid_fields(session: str, **override: str) -> dict[str, str]:
    fields = {
        "v": "1", "kind": "message", "channel": "cli", "session": session,
        "conversation": session, "sender": "tester", "sender_name": "Tester",
        "privacy": "owner", "text": "hello", "ts": f"{time.time():.3f}",
        "event_id": str(uuid.uuid4()), "extra": "{}",
    }  # fmt: skip
    fields.update(override)
    return fields


def setup(
    tmp_path: Path, redis_server: RedisServer, prefix: str, model: FakeModelServer, worker: str = ""
) -> dict[str, str]:
    home = tmp_path / "home"
    if worker:
        write_config(home, f"[worker]\n{worker}")
    return relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model.base_url,
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the counts are the checks
    )  # fmt: skip


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def reasons(r: redis.Redis, keys: Keys) -> list[str]:
    return [f["reason"].decode() for _id, f in dead_letters(r, keys)]


def test_an_entry_of_5000_fields_is_dead_lettered_and_the_worker_goes_on(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    worker = procs.worker(
        setup(tmp_path, redis_server, prefix, model_server), r=real_redis, keys=keys
    )
    stream = keys.inbound_of("cli")
    wide = real_redis.xadd(stream, {f"f{i}": "x" * 10 for i in range(5000)}).decode()  # type: ignore[union-attr]
    # within the read bounds, but not an entry: the worker's own dead letter, bounded too
    junk = {f"junk{i}": "j" * 16_000 for i in range(60)}
    odd = real_redis.xadd(stream, junk).decode()  # type: ignore[union-attr]
    send(real_redis, keys, "poison", "after the junk")
    (reply,) = wait_for_replies(real_redis, keys, "cli:poison", 1, timeout=20)
    assert reply.text.endswith("after the junk")
    assert worker.returncode is None
    letters = dict(dead_letters(real_redis, keys))
    by_source = {f["source_id"].decode(): f for f in letters.values()}
    assert by_source[wide]["reason"] == b"entry too large: 5000 fields (at most 64)"
    assert by_source[odd]["reason"].startswith(b"invalid entry: unknown field(s)")
    for fields in by_source.values():
        kept = {k: v for k, v in fields.items() if k.startswith("orig.")}
        assert 0 < len(kept) <= 64
        assert sum(len(k) - len("orig.") + len(v) for k, v in kept.items()) <= 64 * 1024
        assert fields["truncated"] == b"1"
    assert by_source[wide]["orig_fields"] == b"5000"
    assert int(by_source[odd]["orig_bytes"]) == 60 * 16_000 + sum(len(k) for k in junk)
    assert pending(real_redis, keys) == 0


def test_a_100_mb_entry_never_reaches_the_worker(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    worker = procs.worker(
        setup(tmp_path, redis_server, prefix, model_server), r=real_redis, keys=keys
    )
    send(real_redis, keys, "big", "warm up")
    wait_for_replies(real_redis, keys, "cli:big", 1, timeout=20)
    before = peak_rss_kib(worker.pid)
    stream = keys.inbound_of("cli")
    big = real_redis.xadd(stream, valid_fields("cli:big", text="y" * 100_000_000)).decode()  # type: ignore[union-attr]
    try:
        send(real_redis, keys, "big", "after the big one")
        wait_for_replies(real_redis, keys, "cli:big", 2, timeout=30)
        grew_mib = (peak_rss_kib(worker.pid) - before) / 1024
        print(f"worker peak RSS: {before / 1024:.0f} MiB before, +{grew_mib:.1f} MiB after")
        assert grew_mib < 20, f"the worker's peak RSS grew by {grew_mib:.0f} MiB"
        ((_id, letter),) = dead_letters(real_redis, keys)
        assert letter["source_id"].decode() == big
        assert letter["reason"].startswith(b'entry too large: field "text" is 100000000 bytes')
        assert len(letter["orig.text"]) < 64 * 1024
        assert worker.returncode is None
    finally:
        real_redis.delete(stream)  # 100 MB of a shared test server


def test_unread_entries_older_than_the_retention_wait_for_the_worker(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """300 entries queued 25 h ago while no worker ran; the worker reads 100 at a time and trims
    after its first batch: all 300 are answered, none trimmed unread."""
    keys = Keys(prefix)
    env = setup(tmp_path, redis_server, prefix, model_server, "batch = 100\n")
    stream = keys.inbound_of("cli")
    old_ms = int((time.time() - 25 * 3600) * 1000)
    ids = []
    for i in range(300):
        fields = valid_fields("cli:away", text=f"queued {i}", ts=f"{old_ms / 1000 + i:.3f}")
        ids.append(real_redis.xadd(stream, fields, id=f"{old_ms + i}-0").decode())  # type: ignore[union-attr,arg-type]
    worker = procs.worker(env, r=real_redis, keys=keys)
    got = wait_for_replies(real_redis, keys, "cli:away", 300, timeout=60)
    assert [rep.answers for rep in got] == [f"cli/{i}" for i in ids]
    assert worker.returncode is None
    assert dead_letters(real_redis, keys) == []


def test_an_entry_that_kills_the_worker_is_dead_lettered_after_max_attempts(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """Each worker that takes the entry dies while handling it (kill -9 during its model call);
    the third one (max_attempts = 2) dead-letters it and answers what came after."""
    keys = Keys(prefix)
    env = setup(
        tmp_path, redis_server, prefix, model_server, "max_attempts = 2\nlease_seconds = 1\n"
    )
    poison = send(real_redis, keys, "kill", "[[delay:120]] this one kills the worker")
    for n in (1, 2):
        worker = procs.worker(env, r=real_redis, keys=keys, timeout=20)
        wait_until(lambda n=n: model_server.calls >= n, timeout=20, message=f"model call {n}")
        worker.signal(signal.SIGKILL)
        worker.wait()
    worker = procs.worker(env, r=real_redis, keys=keys, timeout=20)
    send(real_redis, keys, "kill", "after the poison")
    told, reply = wait_for_replies(real_redis, keys, "cli:kill", 2, timeout=20)
    # its sender is told (it may have been only what was in flight when something else killed
    # the workers: the adversarial review lost a normal message so, without a word)
    assert (told.answers, told.kind, told.text) == (poison, "error", SET_ASIDE)
    assert reply.text.endswith("after the poison")
    ((_id, letter),) = dead_letters(real_redis, keys)
    assert letter["source_id"].decode() == poison.split("/", 1)[1]
    assert letter["reason"].startswith(b"delivered 3 times without completing")
    assert model_server.calls == 3  # two deaths, then the next message: never a third try
    assert worker.returncode is None
    assert pending(real_redis, keys) == 0


def test_a_channel_no_gateway_serves_is_dead_lettered_not_answered(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    worker = procs.worker(
        setup(tmp_path, redis_server, prefix, model_server), r=real_redis, keys=keys
    )
    sms = valid_fields("sms:+4912345", channel="sms", privacy="direct", sender="+4912345")
    sid = real_redis.xadd(keys.inbound, sms).decode()  # type: ignore[union-attr,arg-type]
    send(real_redis, keys, "known", "a known channel")
    wait_for_replies(real_redis, keys, "cli:known", 1, timeout=20)
    ((_id, letter),) = dead_letters(real_redis, keys)
    assert letter["source_id"].decode() == sid
    assert letter["reason"].startswith(b'no gateway serves channel "sms"')
    assert replies(real_redis, keys, "sms:+4912345") == []
    assert model_server.calls == 1
    assert worker.returncode is None


def test_the_dead_letter_stream_is_capped_by_length_and_age(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    keys = Keys(prefix)
    env = setup(tmp_path, redis_server, prefix, model_server, "dead_max_len = 10\n")
    old_ms = int((time.time() - 31 * 24 * 3600) * 1000)
    for i in range(50):  # letters from a month ago (the default retention is 30 days)
        real_redis.xadd(keys.dead, {"reason": "old", "n": str(i)}, id=f"{old_ms + i}-0")
    worker = procs.worker(env, r=real_redis, keys=keys)
    wait_until(
        lambda: "old" not in reasons(real_redis, keys), timeout=20, message="old letters gone"
    )
    stream = keys.inbound_of("cli")
    for i in range(500):
        real_redis.xadd(stream, {"hello": json.dumps(i)})
    send(real_redis, keys, "flood", "after the flood")
    wait_for_replies(real_redis, keys, "cli:flood", 1, timeout=30)
    # MAXLEN ~ trims whole nodes of the stream (stream-node-max-entries, 100 by default)
    assert 10 <= real_redis.xlen(keys.dead) <= 10 + 100
    assert worker.returncode is None
