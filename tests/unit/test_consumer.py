"""The ordered consumer against fakeredis, with the real memory store and an instant model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from contract.config import Config, RedisConfig, TurnsConfig, WorkerConfig
from contract.keys import Keys
from contract.liveness import process_identity
from contract.messages import InboundMessage, Privacy, Reply
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.worker import handle_entries, handle_entry
from worker.consumer import Consumer, LeaseLost
from worker.main import assemble
from worker.tools import default_tools
from worker.turn import SET_ASIDE, Turns

WORKER = process_identity("worker")


def msg(text: str, session: str = "cli:t", **kw: object) -> InboundMessage:
    base: dict[str, object] = dict(
        channel="cli", session=session, conversation=session, sender="ada",
        privacy=Privacy.OWNER, text=text, ts=1.0, event_id=f"ev-{text}",
    )  # fmt: skip
    base.update(kw)
    return InboundMessage.model_validate(base)


class Rig:
    def __init__(self, tmp_path: Path, r: fakeredis.FakeRedis, **worker: object) -> None:
        self.cfg = Config(
            home=tmp_path,
            redis=RedisConfig(prefix="rb:"),
            worker=WorkerConfig.model_validate({"max_attempts": 3, **worker}),
            turns=TurnsConfig(mode="followup"),  # one reply per message (collect: test_collect)
        )
        self.r = r
        self.keys = self.cfg.keys
        self.store = MemoryStore(tmp_path / "memory.sqlite3")
        self.model = InstantModel()
        self.consumers: list[Consumer] = []

    def consumer(self, model: object | None = None) -> Consumer:
        turns = Turns(self.cfg, self.store, model or self.model, default_tools())  # type: ignore[arg-type]
        # distinct consumers in one process
        c = assemble(self.cfg, self.r, turns, name=f"{WORKER}-{len(self.consumers)}")
        self.consumers.append(c)
        assert c.acquire(wait=False)
        c.reader.ensure_group()
        c.reader.recover()
        return c

    def add(self, m: InboundMessage) -> str:
        return self.r.xadd(self.keys.inbound, m.to_fields()).decode()  # type: ignore[union-attr]

    def pump(self, c: Consumer) -> int:
        total = 0
        while entries := c.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(c, entries)
            total += len(entries)
        return total

    def replies(self, session: str = "cli:t") -> list[Reply]:
        return [Reply.from_json(x) for x in self.r.lrange(self.keys.reply(session), 0, -1)]

    def pending(self) -> int:
        return int(self.r.xpending(self.keys.inbound, Keys.GROUP)["pending"])

    def close(self) -> None:
        for c in self.consumers:
            c.lease.release()
        self.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path, fakeredis.FakeRedis())
    yield rig
    rig.close()


def test_message_gets_one_reply_recorded_in_memory(rig: Rig) -> None:
    c = rig.consumer()
    sid = rig.add(msg("hello"))
    rig.pump(c)
    (reply,) = rig.replies()
    assert reply.answers == sid
    assert reply.text.startswith("echo: ")
    assert "hello" in reply.text
    assert rig.pending() == 0
    rows = rig.store.recent(10)
    assert [r.direction for r in rows] == ["out", "in"]
    assert rows[1].stream_id == sid and rows[0].stream_id == sid


def test_entries_are_answered_in_stream_order(rig: Rig) -> None:
    c = rig.consumer()
    sids = [rig.add(msg(f"m{i}")) for i in range(50)]
    rig.pump(c)
    assert [r.answers for r in rig.replies()] == sids


def test_context_carries_earlier_history_with_labels(rig: Rig) -> None:
    c = rig.consumer()
    rig.add(msg("my cat is called Tom"))
    rig.add(msg("what is my cat called?"))
    rig.pump(c)
    last_input = rig.model.seen[-1]
    system = last_input[0]["content"]
    assert "[cli / owner]" in system and "my cat is called Tom" in system


def test_replay_after_crash_before_ack_adds_nothing_twice(rig: Rig) -> None:
    c1 = rig.consumer()
    sid = rig.add(msg("once"))
    entries = c1.reader.read(block_ms=None)  # type: ignore[arg-type]
    outcome = handle_entry(c1.turns, entries[0].sid, entries[0].fields)
    c1.turns.settle()  # the turn ran, memory committed ...
    assert outcome.reply is not None
    c1.lease.release()  # ... and then the worker died before queueing and acking
    c2 = rig.consumer()
    rig.pump(c2)
    assert [r.answers for r in rig.replies()] == [sid]
    assert rig.replies()[0].reply_id == outcome.reply.reply_id  # the recorded reply, reused
    assert rig.model.calls == 1  # the model was not asked again
    assert rig.store.counts()["log"] == 2
    assert rig.pending() == 0


def test_garbage_and_half_valid_entries_are_dead_lettered_and_work_goes_on(rig: Rig) -> None:
    c = rig.consumer()
    inbound = rig.keys.inbound
    rig.r.xadd(inbound, {"hello": "world"})
    rig.r.xadd(inbound, {**msg("x").to_fields(), "v": "9"})
    rig.r.xadd(inbound, {**msg("x").to_fields(), "privacy": "public"})
    rig.r.xadd(inbound, {**msg("x").to_fields(), "text": b"\xff\xfe broken"})
    rig.r.xadd(inbound, {**msg("x").to_fields(), "extra": "{not json"})
    rig.r.xadd(inbound, {**msg("x").to_fields(), "text": "y" * 70_000})
    good = rig.add(msg("still here"))
    rig.pump(c)
    dead = rig.r.xrange(rig.keys.dead)
    reasons = [d[1][b"reason"].decode() for d in dead]
    assert len(dead) == 6
    assert "unknown field(s): hello" in reasons[0]
    assert "unsupported schema version" in reasons[1]
    assert "privacy" in reasons[2]
    assert "not valid UTF-8" in reasons[3]
    assert "extra is not valid JSON" in reasons[4]
    assert "text" in reasons[5]
    assert dead[1][1][b"orig.v"] == b"9"  # the original fields are kept
    assert all(d[1][b"source_id"] for d in dead)
    assert [r.answers for r in rig.replies()] == [good]
    assert rig.pending() == 0


def test_entry_that_keeps_failing_is_dead_lettered_after_max_attempts(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = rig.consumer()
    monkeypatch.setattr("worker.writer.time.sleep", lambda _s: None)
    real = c.turns.begin
    calls = {"n": 0}

    def boom(group: list[tuple[str, InboundMessage]]) -> object:
        if any("poison" in m.text for _sid, m in group):
            calls["n"] += 1
            raise ValueError("cannot digest this")
        return real(group)

    monkeypatch.setattr(c.turns, "begin", boom)
    rig.add(msg("poison"))
    ok = rig.add(msg("fine"))
    rig.pump(c)
    assert calls["n"] == 3
    (dead,) = rig.r.xrange(rig.keys.dead)
    assert b"failed 3 times: ValueError: cannot digest this" in dead[1][b"reason"]
    assert [r.answers for r in rig.replies()] == [ok]


def test_entry_delivered_too_often_is_dead_lettered_on_recovery(rig: Rig) -> None:
    rig.add(msg("crasher"))
    for _ in range(3):  # three workers each took it and died
        c = rig.consumer()
        c.reader.read(block_ms=None)  # type: ignore[arg-type]
        c.lease.release()
    c = rig.consumer()
    rig.pump(c)
    (dead,) = rig.r.xrange(rig.keys.dead)
    assert b"delivered 4 times" in dead[1][b"reason"]
    assert rig.pending() == 0
    # its sender is told, not left in silence (the adversarial review: a normal message at the
    # head of a crash loop's replay was dropped without a word); the model is never asked
    (reply,) = rig.replies()
    assert reply.kind == "error" and reply.text == SET_ASIDE
    assert rig.model.calls == 0
    assert rig.store.recorded_reply(reply.answers) is not None  # recorded like any reply
    c.reader.read(block_ms=None)  # type: ignore[arg-type]
    rig.pump(c)
    assert len(rig.replies()) == 1  # told once


def test_a_set_aside_entry_whose_reply_was_recorded_gets_that_reply_not_an_error(
    rig: Rig,
) -> None:
    """Workers recorded its reply and died before queueing it, too often: the recorded reply
    is queued (once), not an error."""
    sid = rig.add(msg("answered before"))
    c = rig.consumer()
    rig.pump(c)
    (first,) = rig.replies()
    assert rig.store.recorded_reply(sid) is not None
    out = c.turns.set_aside(sid, msg("answered before"), "delivered 4 times")
    assert out.reply is not None and out.reply.reply_id == first.reply_id
    assert out.only_if_missing


def test_model_failure_becomes_a_recorded_error_reply(rig: Rig) -> None:
    c = rig.consumer(model=InstantModel(fail_with="the model at http://x timed out"))
    sid = rig.add(msg("hi"))
    rig.pump(c)
    (reply,) = rig.replies()
    assert reply.kind == "error" and reply.answers == sid
    assert "timed out" in reply.text
    assert rig.store.recorded_reply(sid) is not None


def test_second_worker_cannot_take_the_lease(rig: Rig) -> None:
    rig.consumer()
    turns = Turns(rig.cfg, rig.store, rig.model, default_tools())
    other = assemble(rig.cfg, rig.r, turns, name="other")
    assert other.run(wait_for_lease=False) == 3


def test_a_worker_that_lost_its_lease_cannot_ack(rig: Rig) -> None:
    c = rig.consumer()
    rig.add(msg("late"))
    entries = c.reader.read(block_ms=None)  # type: ignore[arg-type]
    rig.r.set(rig.keys.lease, "someone-else")  # the lease expired and another worker took it
    with pytest.raises(LeaseLost):
        handle_entries(c, entries)
    assert rig.replies() == []
    assert rig.pending() == 1


def test_expired_reply_status_is_recorded(rig: Rig) -> None:
    c = rig.consumer()
    sid = rig.add(msg("hi"))
    rig.pump(c)
    (reply,) = rig.replies()
    note = msg(
        "", kind="derived", sender="gateway:cli",
        extra={"type": "reply_status", "reply_id": reply.reply_id, "status": "expired"},
    )  # fmt: skip
    rig.add(note)
    rig.pump(c)
    assert list(rig.store.reply_marks(reply.reply_id)) == ["expired"]
    assert len(rig.replies()) == 1  # a derived entry gets no reply
    assert sid


def test_stopping_finishes_current_turn_and_leaves_the_rest_pending(rig: Rig) -> None:
    c = rig.consumer()
    first = rig.add(msg("a"))
    rig.add(msg("b"))
    entries = c.reader.read(block_ms=None)  # type: ignore[arg-type]
    c.writer.take(entries)
    c.writer.advance()  # the turn of "a" starts ("b" of the same session waits: followup)
    assert len(c.writer.jobs) == 1
    c.control.stopping = True  # SIGTERM arrived: no new turn; the one in flight is finished
    c.drain()
    assert [r.answers for r in rig.replies()] == [first]
    assert rig.pending() == 1  # replayed by the next worker
    c.lease.release()
    rig.pump(rig.consumer())
    assert len(rig.replies()) == 2


def test_dead_letter_fields_are_flat_and_readable(rig: Rig) -> None:
    c = rig.consumer()
    rig.r.xadd(rig.keys.inbound, {"v": "1", "text": "no channel"})
    rig.pump(c)
    (entry,) = rig.r.xrange(rig.keys.dead)
    fields = {k.decode(): v.decode() for k, v in entry[1].items()}
    assert fields["orig.text"] == "no channel"
    assert fields["source_stream"] == rig.keys.inbound
    assert "missing field" in fields["reason"]
    json.dumps(fields)


@pytest.mark.parametrize(
    "extra",
    [
        {"no_reply": "sender not on the allowlist"},
        {"edit_of": "$original"},
        {"reaction": {"key": "👍", "to": "$original"}},
    ],
    ids=["not-allowlisted", "edit", "reaction"],
)
def test_recorded_but_not_answered(rig: Rig, extra: dict[str, object]) -> None:
    c = rig.consumer()
    sid = rig.add(msg("keep this, do not answer", extra=extra))
    rig.pump(c)
    assert rig.replies() == []  # no reply, and the model was not asked
    assert rig.model.calls == 0
    assert rig.pending() == 0
    (row,) = rig.store.recent(10)
    assert row.stream_id == sid and row.direction == "in"
    assert json.loads(row.extra) == extra  # recorded with what the gateway said about it


def test_a_dead_letter_written_by_the_commit_is_bounded(rig: Rig) -> None:
    """An entry within the read bounds that is still no entry (60 unknown fields of 16 KB): its
    dead letter keeps a bounded copy (issue 11), and the work goes on."""
    c = rig.consumer()
    junk = {f"junk{i}": "j" * 16_000 for i in range(60)}
    rig.r.xadd(rig.keys.inbound, junk)  # type: ignore[arg-type]
    ok = rig.add(msg("fine"))
    rig.pump(c)
    ((_id, letter),) = rig.r.xrange(rig.keys.dead)
    assert letter[b"reason"].startswith(b"invalid entry: unknown field(s)")
    kept = {k: v for k, v in letter.items() if k.startswith(b"orig.")}
    assert 0 < len(kept) <= 64
    assert sum(len(k) - len(b"orig.") + len(v) for k, v in kept.items()) <= 64 * 1024
    assert letter[b"truncated"] == b"1" and letter[b"orig_fields"] == b"60"
    assert [r.answers for r in rig.replies()] == [ok]
    assert rig.pending() == 0


@pytest.mark.timeout(10)
def test_a_signal_landing_inside_a_log_write_does_not_deadlock(rig: Rig) -> None:
    """The signal handler runs on the main thread between two bytecodes, possibly inside a log
    call, whose writer holds a lock that is not reentrant: the handler logging there blocked the
    worker for good (a SIGTERM during start-up in CI: the worker never exited)."""
    import signal as signals

    import worker.consumer as consumer_module

    c = rig.consumer()
    lock = consumer_module.log.bind()._logger._lock
    with lock:  # the main thread is inside a log write when SIGTERM lands
        c._on_signal(signals.SIGTERM, None)
    assert c.control.stopping
