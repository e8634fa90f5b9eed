"""Issue 24, item 6: copies of an erased text that name nothing memory knows them by are found by
the text itself (worker/scrub.py, worker/scrub_text.py), against a real Redis writing an AOF and
an RDB: a malformed entry (no conversation), a dead letter of it, a raw mail a gateway could not
parse (base64 body), a reply a gateway dead-lettered (JSON). What only repeats the text in a
valid message of someone else's stays (memory keeps that message). A worker that replays the
erasure after a crash, without the texts in hand, takes them from the erased entries Redis still
holds, and the copies found by text go before those entries do."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from memory.copies import Copies
from tests.support.servers import RedisServer
from worker.scrub import Scrubber

pytestmark = pytest.mark.integration

SECRET = "zanzibarquux"
TEXT = f"the vault code is {SECRET}"
FILES = ("--appendonly", "yes", "--appendfsync", "always", "--rdbcompression", "no")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "redis", persistence=FILES).start()
    yield srv
    srv.stop()


def files(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (tmp_path / "redis").rglob("*") if p.is_file())


def entry(text: str, **over: str) -> dict[str, str]:
    msg = InboundMessage(
        channel="matrix", session="matrix:!r", conversation="matrix:!r", sender="@bob:m.org",
        privacy=Privacy.GROUP, text=text, ts=time.time(), event_id=f"$e{time.monotonic_ns()}",
    )  # fmt: skip
    return {**msg.to_fields(), **over}


def nothing(**kw: object) -> Copies:
    empty: frozenset[str] = frozenset()
    base: dict[str, object] = dict(
        erasure=1, entries=empty, answers=empty, reply_ids=empty, event_ids=frozenset(),
        handles=frozenset(), conversations=empty,
    )  # fmt: skip
    base.update(kw)
    return Copies(**base)  # type: ignore[arg-type]


def world(r: redis.Redis, keys: Keys) -> dict[str, str]:
    """The erased message's own entry, and the copies of its text that name nothing."""
    stream = keys.inbound_of("matrix")
    malformed = {k: v for k, v in entry(f"fwd: {TEXT}").items() if k != "conversation"}
    ids = {
        "erased": r.xadd(stream, entry(TEXT)).decode(),
        "malformed": r.xadd(stream, malformed).decode(),  # the worker cannot read it
        # someone else's valid message that repeats the text: memory keeps it, so does Redis
        "valid": r.xadd(stream, entry(f"did you see? {TEXT.upper()}")).decode(),
        "other": r.xadd(stream, entry("nothing to see")).decode(),
    }
    body = base64.b64encode(f"Hello,\n{TEXT}\n".encode()).decode()
    raw = ("From: Eve <eve@example.org>\r\nContent-Type: text/plain\r\n"
           f"Content-Transfer-Encoding: base64\r\n\r\n{body}\r\n")  # fmt: skip
    r.xadd(keys.dead, {"reason": "unreadable", "source": "email", "raw": raw})
    r.xadd(keys.dead, {"reason": "refused", "source": "matrix",
                       "raw": json.dumps({"reply_id": "x", "text": f"> {TEXT}"})})  # fmt: skip
    r.xadd(keys.dead, {"reason": "invalid entry: conversation missing", "source_stream": stream,
                       "source_id": ids["malformed"], "orig.text": f"fwd: {TEXT}"})  # fmt: skip
    r.xadd(keys.dead, {"reason": "something else", "source_stream": stream,
                       "source_id": ids["other"], "orig.text": "nothing to see"})  # fmt: skip
    return ids


def test_copies_that_name_nothing_are_found_by_the_text(
    server: RedisServer, tmp_path: Path
) -> None:
    r = server.client()
    keys = Keys()
    ids = world(r, keys)
    r.bgrewriteaof()
    time.sleep(0.3)
    assert SECRET.encode() in files(tmp_path)
    copies = nothing(entries=frozenset({f"matrix/{ids['erased']}"})).with_texts([TEXT])

    done = Scrubber(r, keys, timeout=30).scrub(copies)

    left = {raw_id.decode() for raw_id, _f in r.xrange(keys.inbound_of("matrix"))}
    assert left == {ids["valid"], ids["other"]}
    assert done.stream_entries == 2 and done.dead_letters == 3, done
    dead = r.xrange(keys.dead)
    assert [f[b"reason"] for _i, f in dead] == [b"something else"]
    assert (done.aof, done.rdb) == ("rewritten", "rewritten")
    # the valid message of someone else holds it (upper case): memory keeps it, so does Redis
    assert SECRET.upper().encode() in files(tmp_path)
    assert SECRET.encode() not in files(tmp_path)


def test_a_replayed_erasure_takes_the_texts_from_the_entries_still_there(
    server: RedisServer, tmp_path: Path
) -> None:
    """The worker died after memory committed the erasure, before Redis was cleaned: the next
    one has no texts in hand (memory holds none), only the tombstone's stream ids."""
    r = server.client()
    keys = Keys()
    ids = world(r, keys)
    copies = nothing(entries=frozenset({f"matrix/{ids['erased']}"}))  # no texts
    done = Scrubber(r, keys, timeout=30).scrub(copies)
    left = {raw_id.decode() for raw_id, _f in r.xrange(keys.inbound_of("matrix"))}
    assert left == {ids["valid"], ids["other"]}
    assert done.dead_letters == 3, done
    assert SECRET.encode() not in files(tmp_path)


def test_a_short_text_is_found_only_as_a_whole_value(server: RedisServer) -> None:
    r = server.client()
    keys = Keys()
    r.xadd(keys.dead, {"reason": "x", "orig.text": "4711"})
    r.xadd(keys.dead, {"reason": "y", "orig.text": "room 4711 is free"})
    done = Scrubber(r, keys, timeout=30).scrub(nothing().with_texts(["4711"]))
    assert done.dead_letters == 1
    assert [f[b"reason"] for _i, f in r.xrange(keys.dead)] == [b"y"]
