"""The inbound streams read in one order (worker/streams.py): a stream with more than a read's
worth queued never lets a quieter stream's newer entry go before its older ones."""

from __future__ import annotations

import time

import fakeredis
import pytest

from contract.keys import Keys
from worker.deadletter import Limits, dead_letter
from worker.streams import InboundStreams


def test_a_backlog_on_one_stream_does_not_hold_back_another() -> None:
    """Each stream in order; none across them (a session lives on one stream): the owner's
    terminal is read at once whatever floods another stream (the adversarial review of issue 12:
    a flood of 1,100 group messages held the owner's message back 53 s)."""
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    for ms in (1, 2, 3, 4, 5):  # a flood on Matrix
        r.xadd(keys.inbound_of("matrix"), {"n": str(ms)}, id=f"{ms}-0")
    r.xadd(keys.inbound_of("cli"), {"n": "c"}, id="6-0")  # the owner, after all of it
    found, _ = streams.read_new(block_ms=10, count=2)
    assert [e.sid for e in found] == ["matrix/1-0", "matrix/2-0", "cli/6-0"]
    order = [e.sid for e in found]
    for _ in range(3):
        order += [e.sid for e in streams.read_new(block_ms=10, count=2)[0]]
    assert order == ["matrix/1-0", "matrix/2-0", "cli/6-0", "matrix/3-0", "matrix/4-0",
                     "matrix/5-0"]  # fmt: skip
    only, _ = streams.read_new(block_ms=10, count=2, only=[keys.inbound_of("cli")])
    assert only == []


# -- issue 11: no entry can stop the worker; nothing unread is trimmed -------------------------


def _valid(session: str = "cli:t", **override: str) -> dict[str, str]:
    fields = {
        "v": "1", "kind": "message", "channel": "cli", "session": session,
        "conversation": session, "sender": "ada", "sender_name": "", "privacy": "owner",
        "text": "hi", "ts": "1.0", "event_id": "ev", "extra": "{}",
    }  # fmt: skip
    fields.update(override)
    return fields


def _dead(r: fakeredis.FakeRedis, keys: Keys) -> list[dict[str, str]]:
    return [
        {k.decode(errors="replace"): v.decode(errors="replace") for k, v in f.items()}
        for _id, f in r.xrange(keys.dead)
    ]


def test_trim_never_passes_unread_entries() -> None:
    """300 entries queued 25 h ago; 100 read and acked; a trim keeps the 200 unread ones."""
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    stream = keys.inbound_of("cli")
    old_ms = int((time.time() - 25 * 3600) * 1000)
    ids = [r.xadd(stream, {"n": str(i)}, id=f"{old_ms + i}-0").decode() for i in range(300)]
    found, _ = streams.read_new(block_ms=None, count=100)
    assert [e.raw_id for e in found] == ids[:100]
    r.xack(stream, Keys.GROUP, *ids[:100])
    streams.trim(24 * 3600.0)
    left = [i.decode() for i, _f in r.xrange(stream)]
    assert ids[100:] == left[-200:]  # every unread one is still there
    read: list[str] = []
    while found := streams.read_new(block_ms=None, count=100)[0]:
        read += [e.raw_id for e in found]
    assert read == ids[100:]


def test_trim_still_drops_old_acked_entries() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    stream = keys.inbound_of("cli")
    old_ms = int((time.time() - 25 * 3600) * 1000)
    ids = [r.xadd(stream, {"n": str(i)}, id=f"{old_ms + i}-0").decode() for i in range(10)]
    streams.read_new(block_ms=None, count=100)
    r.xack(stream, Keys.GROUP, *ids)
    streams.trim(24 * 3600.0)
    assert r.xlen(stream) == 0


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({f"f{i}": "x" for i in range(5000)}, "entry too large: 5000 fields (at most 64)"),
        ({**_valid(), "text": "y" * (1 << 20 | 1)}, 'field "text" is 1048577 bytes'),
        (
            {
                **_valid(),
                "text": "y" * 900_000,
                "extra": "z" * 900_000,
                "sender_name": "w" * 400_000,
            },
            "entry too large: 2200",
        ),
    ],
)
def test_an_entry_beyond_the_bounds_is_dead_lettered_before_the_worker_reads_it(
    fields: dict[str, str], reason: str
) -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    stream = keys.inbound_of("cli")
    bad = r.xadd(stream, fields).decode()  # type: ignore[arg-type]
    good = r.xadd(stream, _valid()).decode()
    found, _ = streams.read_new(block_ms=None, count=100)
    assert [e.raw_id for e in found] == [good]  # the bad one never reaches the worker
    (letter,) = _dead(r, keys)
    assert reason in letter["reason"], letter["reason"]
    assert (letter["source_stream"], letter["source_id"]) == (stream, bad)
    assert letter["orig_fields"] == str(len(fields))
    kept = {k: v for k, v in letter.items() if k.startswith("orig.")}
    assert 0 < len(kept) <= 64
    assert sum(len(k) - 5 + len(v) for k, v in kept.items()) <= 64 * 1024
    assert letter["truncated"] == "1"
    assert r.xpending(stream, Keys.GROUP)["pending"] == 1  # the bad one is acked, not pending
    assert streams.dead_lettered == 1


def test_a_channel_no_gateway_serves_is_dead_lettered_on_the_stream_without_a_channel() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    sms = r.xadd(keys.inbound, _valid("sms:1", channel="sms")).decode()
    ok = r.xadd(keys.inbound, _valid("cli:1")).decode()
    found, _ = streams.read_new(block_ms=None, count=100)
    assert [e.raw_id for e in found] == [ok]
    (letter,) = _dead(r, keys)
    assert letter["source_id"] == sms
    assert letter["reason"] == 'no gateway serves channel "sms" (the channels are cli,matrix,email)'
    assert letter["orig.channel"] == "sms" and letter["truncated"] == "0"


def test_a_pending_entry_delivered_too_often_is_dead_lettered_by_the_read() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    stream = keys.inbound_of("cli")
    first = InboundStreams(r, keys, "w1", Limits(max_attempts=2))
    first.ensure_groups()
    poison = r.xadd(stream, _valid(text="poison")).decode()
    after = r.xadd(stream, _valid(text="after")).decode()
    assert [e.raw_id for e in first.read_new(block_ms=None, count=1)[0]] == [poison]
    for n in (2, 3):  # worker n finds it pending (the one before died on it)
        streams = InboundStreams(r, keys, f"w{n}", Limits(max_attempts=2))
        streams.recover()
        found, _ = streams.read_pending()
        if n == 2:
            assert [e.raw_id for e in found] == [poison]
            assert found[0].aside == ""
        else:  # the third delivery is one too many: handed over as "aside", not buried, so
            # that the worker tells its sender and dead-letters it in one step (set_aside)
            assert [(e.raw_id, e.aside[:24]) for e in found] == [
                (poison, "delivered 3 times withou")
            ]
            assert found[0].fields[b"text"] == b"poison"
            assert r.xpending(stream, Keys.GROUP)["pending"] == 1
            assert _dead(r, keys) == []
    # that worker died too (say, in those few milliseconds): handed over once more, then the
    # fifth delivery is buried by the read itself (no entry can loop)
    for n, told in ((4, True), (5, False)):
        streams = InboundStreams(r, keys, f"w{n}", Limits(max_attempts=2))
        streams.recover()
        found = streams.read_pending()[0]
        assert [e.raw_id for e in found] == ([poison] if told else [])
    assert r.xpending(stream, Keys.GROUP)["pending"] == 0
    (letter,) = _dead(r, keys)
    assert letter["reason"].startswith("delivered 5 times without completing")
    assert letter["orig.text"] == "poison"
    assert [e.raw_id for e in streams.read_new(block_ms=None, count=10)[0]] == [after]


def test_a_pending_entry_deleted_meanwhile_is_acked_and_the_next_one_read() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    stream = keys.inbound_of("cli")
    streams = InboundStreams(r, keys, "w1")
    streams.ensure_groups()
    a = r.xadd(stream, _valid(text="a")).decode()
    b = r.xadd(stream, _valid(text="b")).decode()
    streams.read_new(block_ms=None, count=10)
    r.xdel(stream, a)
    found, gone = streams.read_pending()
    assert [e.raw_id for e in found] == [b] and gone == []
    assert r.xpending(stream, Keys.GROUP)["pending"] == 1


def test_dead_letters_are_trimmed_by_age_and_length() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c", Limits(dead_max_len=5, dead_retention=3600.0))
    old_ms = int((time.time() - 7200) * 1000)
    for i in range(3):
        r.xadd(keys.dead, {"reason": "old"}, id=f"{old_ms + i}-0")
    for _ in range(20):
        r.xadd(keys.dead, {"reason": "new"})
    streams.trim_dead()
    left = _dead(r, keys)
    assert [d["reason"] for d in left] == ["new"] * 5


def test_a_dead_letter_is_bounded_whatever_the_entry() -> None:
    fields = {f"name{i}" * 100: "v" * 100_000 for i in range(5000)}
    args = dead_letter(
        reason="r" * 10_000, stream="s", raw_id="1-0", consumer="c", fields=fields,
        dead_at=1.0, max_len=7,
    )  # fmt: skip
    assert args[:4] == ["MAXLEN", "~", "7", "*"]
    flat = dict(zip(args[4::2], args[5::2], strict=True))
    assert flat["orig_fields"] == "5000" and flat["truncated"] == "1"
    assert len(flat["reason"]) <= 2000
    kept = [k for k in flat if k.startswith("orig.")]
    assert 0 < len(kept) <= 64
    assert sum(len(k) + len(flat[k]) for k in kept) <= 64 * 1024 + 5 * len(kept)
    small = dead_letter(
        reason="x", stream="s", raw_id="1-0", consumer="c", fields={"text": "héllo"},
        dead_at=1.0, max_len=7,
    )  # fmt: skip
    assert small[-2:] == ["orig.text", "héllo"] and small[small.index("truncated") + 1] == "0"


def test_a_read_that_only_dead_letters_reads_on() -> None:
    """A whole read's worth of bad entries does not look like an empty stream to the caller."""
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    stream = keys.inbound_of("cli")
    for i in range(5):
        r.xadd(stream, {f"f{j}": str(i) for j in range(100)})
    good = r.xadd(stream, _valid()).decode()
    found, _ = streams.read_new(block_ms=None, count=2)
    assert [e.raw_id for e in found] == [good]
    assert r.xlen(keys.dead) == 5
