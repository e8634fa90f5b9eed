"""Memory under faults (issue 11): a paused worker that lost its lease, memory full, an event
published twice after Redis lost data.

A real Redis and real SQLite files; the worker's own Consumer and Turns in this process (several
of them, each with its own connection to the database, as several worker processes would have), so
the worst moment can be chosen exactly: inside the model call, between two commits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.config import Config, RedisConfig, TurnsConfig, WorkerConfig
from contract.keys import Keys
from contract.liveness import process_identity
from contract.messages import InboundMessage, Privacy, Reply
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.worker import handle_entries
from worker.consumer import Consumer, LeaseLost
from worker.main import assemble
from worker.model import Completion
from worker.tools import default_tools
from worker.turn import Turns

pytestmark = pytest.mark.integration


def msg(text: str, session: str = "cli:t", **kw: object) -> InboundMessage:
    base: dict[str, object] = dict(
        channel="cli", session=session, conversation=session, sender="ada",
        privacy=Privacy.OWNER, text=text, ts=1.0, event_id=f"ev-{text}",
    )  # fmt: skip
    base.update(kw)
    return InboundMessage.model_validate(base)


class HookModel(InstantModel):
    """Answers ``<name>: <message>``, running ``during`` inside the call (the worst moment)."""

    def __init__(self, name: str, during: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.name, self.during = name, during

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.calls += 1
        if self.during is not None:
            during, self.during = self.during, None
            during()
        said = str(messages[-1]["content"]).split(" UTC: ", 1)[-1]  # without its label
        return Completion(content=f"{self.name}: {said}", finish_reason="stop")


class World:
    def __init__(self, tmp_path: Path, r: redis.Redis, prefix: str) -> None:
        self.cfg = Config(
            home=tmp_path,
            redis=RedisConfig(prefix=prefix),
            worker=WorkerConfig.model_validate({"max_attempts": 3, "lease_seconds": 2}),
            turns=TurnsConfig(mode="followup"),  # a reply per message: the count is the check
        )
        self.r, self.keys = r, self.cfg.keys
        self.path = tmp_path / "memory.sqlite3"
        self.stores: list[MemoryStore] = []
        self.consumers: list[Consumer] = []

    def consumer(self, model: InstantModel, *, acquire: bool = True) -> Consumer:
        store = MemoryStore(self.path)  # a connection of its own, as a worker process has
        self.stores.append(store)
        name = f"{process_identity('worker')}-{len(self.consumers)}"
        c = assemble(self.cfg, self.r, Turns(self.cfg, store, model, default_tools()), name=name)
        self.consumers.append(c)
        if acquire:
            assert c.acquire(wait=False)
            c.reader.ensure_group()
            c.reader.recover()
        return c

    def add(self, m: InboundMessage) -> str:
        raw = self.r.xadd(self.keys.inbound_of(m.channel), m.to_fields())
        return f"{m.channel}/{raw.decode()}"  # type: ignore[union-attr]

    def pump(self, c: Consumer) -> None:
        while entries := c.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(c, entries)

    def replies(self, session: str = "cli:t") -> list[Reply]:
        return [Reply.from_json(x) for x in self.r.lrange(self.keys.reply(session), 0, -1)]

    def rows(self, sql: str = "SELECT direction, text FROM log ORDER BY id") -> list[Any]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def pending(self, channel: str = "cli") -> int:
        return int(self.r.xpending(self.keys.inbound_of(channel), Keys.GROUP)["pending"])

    def close(self) -> None:
        for c in self.consumers:
            c.lease.release()
        for s in self.stores:
            s.close()


@pytest.fixture
def world(tmp_path: Path, real_redis: redis.Redis, prefix: str) -> Iterator[World]:
    w = World(tmp_path, real_redis, prefix)
    yield w
    w.close()


def test_a_worker_paused_past_its_lease_cannot_commit_what_it_answered(world: World) -> None:
    """Worker A is paused inside its model call (a SIGSTOP, a GC, a VM migration) until its lease
    expires; worker B takes over the entry and, while B is in its own model call, A resumes and
    records its answer. The user gets B's answer, and memory holds that one: A's write is refused
    inside its SQLite transaction (the fencing token), and A stops without queueing anything."""
    sid = world.add(msg("what time is it"))
    b_in_model, a_tried = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def b_runs() -> None:
        try:
            b = world.consumer(HookModel("B", during=lambda: (b_in_model.set(), a_tried.wait(10))))
            world.pump(b)  # B claims the pending entry and answers it
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            b_in_model.set()

    def paused_past_the_lease() -> None:
        world.r.delete(world.keys.lease)  # A's lease expired while it was paused
        threading.Thread(target=b_runs, name="worker-b").start()
        assert b_in_model.wait(10)  # A resumes while B is asking its model

    a = world.consumer(HookModel("A", during=paused_past_the_lease))
    entries = a.reader.read(block_ms=None)  # type: ignore[arg-type]
    a.lease._stop.set()  # paused: A's renewals stop with it
    try:
        with pytest.raises(LeaseLost, match="fenced"):
            handle_entries(a, entries)
    finally:
        a_tried.set()
    deadline = time.monotonic() + 10
    while world.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not errors
    assert [r.text for r in world.replies()] == ["B: what time is it"]
    assert world.rows() == [("in", "what time is it"), ("out", "B: what time is it")]
    assert world.rows("SELECT stream_id FROM log WHERE direction = 'out'") == [(sid,)]
    assert world.pending() == 0


def test_a_stale_worker_cannot_fence_memory_back(world: World) -> None:
    """Redis lost the lease counter (a power cut): the next worker is handed a token memory has
    already seen; it moves Redis's counter past memory's instead of writing under an old token."""
    first = world.consumer(HookModel("A"))
    world.add(msg("one"))
    world.pump(first)
    first.lease.release()
    world.r.delete(f"{world.keys.lease}:epoch")  # the counter rolled back with Redis's data
    second = world.consumer(HookModel("B"))
    assert second.lease.epoch > first.lease.epoch
    world.add(msg("two"))
    world.pump(second)
    assert [r.text for r in world.replies()] == ["A: one", "B: two"]


def test_memory_full_then_space_back_answers_everything_once_with_no_gap(world: World) -> None:
    """The database cannot grow (a full disk; here ``PRAGMA max_page_count`` on the worker's own
    connection): the worker answers nothing it cannot record, keeps the entries pending, says so
    in its heartbeat, and once there is room again answers each of them once, all recorded."""
    model = HookModel("A")
    c = world.consumer(model)
    store = world.stores[-1]
    for i in range(20):  # some history first
        world.add(msg(f"before {i}", event_id=f"b{i}"))
    world.pump(c)
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count = {pages}")  # full from now on

    texts = [f"while full {i} " + "x" * 3000 for i in range(200)]
    for i, t in enumerate(texts):
        world.add(msg(t, event_id=f"f{i}"))
    entries = c.reader.read(block_ms=None)  # type: ignore[arg-type]
    blocked: list[str] = []

    def space_back_later() -> None:  # the operator frees space while the worker waits
        blocked.append(c.committer.memory_blocked)
        store.conn.execute("PRAGMA max_page_count = 1073741823")

    c.health.beat = space_back_later  # type: ignore[method-assign]
    handle_entries(c, entries)
    world.pump(c)

    assert blocked and "full" in blocked[0]
    replies = world.replies()
    assert len(replies) == 220
    assert [r.text for r in replies[20:]] == [f"A: {t}" for t in texts]  # once each, in order
    assert len({r.reply_id for r in replies}) == 220
    rows = world.rows()
    assert len(rows) == 440 and [t for d, t in rows if d == "in"][20:] == texts  # no gap
    assert model.calls == 220  # a reply kept while memory refused is not asked for again
    assert world.pending() == 0


def test_an_event_published_again_after_redis_lost_data_is_recorded_and_answered_once(
    world: World,
) -> None:
    """Redis lost its last second (a power cut): a gateway's cursor rolled back with the stream,
    and the gateway publishes the same platform event again, under a new stream id. Memory knows
    it by (channel, event id): nothing is recorded twice, the model is not asked again; its
    reply is queued again only if Redis lost it too, and not at all once it was delivered."""
    model = HookModel("A")
    c = world.consumer(model)
    m = msg("hello", channel="email", session="email:t1", conversation="email:t1",
            privacy=Privacy.DIRECT, sender="bob@x.org", event_id="<m1@x.org>")  # fmt: skip
    first = world.add(m)
    world.pump(c)
    (reply,) = world.replies("email:t1")

    world.add(m)  # published again while its reply still waits in the queue: not queued twice
    world.pump(c)
    assert [r.reply_id for r in world.replies("email:t1")] == [reply.reply_id]

    world.r.delete(world.keys.reply("email:t1"))  # the queue was lost with Redis's data
    world.add(m)
    world.pump(c)
    (again,) = world.replies("email:t1")
    assert again.reply_id == reply.reply_id and again.answers == first

    world.r.delete(world.keys.reply("email:t1"))  # delivered, and memory was told so
    store = world.stores[-1]
    store.mark_reply(reply.reply_id, "delivered")
    world.add(m)
    world.pump(c)
    assert world.replies("email:t1") == []

    assert model.calls == 1
    assert world.rows() == [("in", "hello"), ("out", "A: hello")]
    assert world.pending("email") == 0


def test_replies_memory_recorded_and_redis_lost_are_queued_again(world: World) -> None:
    """Redis lost its last second after the worker queued three replies: at its next start the
    worker queues again those memory recorded and Redis holds nowhere (same ids), but not one
    memory knows was delivered, nor one Redis still marks delivered."""
    c = world.consumer(HookModel("A"))
    for i in range(4):
        world.add(msg(f"m{i}", event_id=f"e{i}"))
    world.pump(c)
    replies = world.replies()
    assert len(replies) == 4
    c.lease.release()
    world.r.delete(world.keys.reply("cli:t"))  # the power cut took the queue
    world.stores[-1].mark_reply(replies[0].reply_id, "delivered")  # memory knows this one
    world.r.zadd(world.keys.delivered("cli:t"), {replies[1].reply_id: time.time()})

    again = world.consumer(HookModel("B"))
    world.pump(again)
    assert [r.reply_id for r in world.replies()] == [r.reply_id for r in replies[2:]]
    assert [r.text for r in world.replies()] == ["A: m2", "A: m3"]
    world.pump(again)  # once: not queued a second time
    assert len(world.replies()) == 2


def test_a_queue_nobody_reads_expires_into_memory(world: World) -> None:
    """A terminal session that ended leaves its reply queue behind: replies older than
    delivery.max_age (on Redis's clock) are removed and marked expired in memory."""
    c = world.consumer(HookModel("A"))
    world.add(msg("old", session="cli:gone", conversation="cli:gone"))
    world.add(msg("new", session="cli:here", conversation="cli:here"))
    world.pump(c)
    (old,) = world.replies("cli:gone")
    key = world.keys.reply("cli:gone")
    stale = old.model_copy(update={"created": old.created - world.cfg.delivery.max_age - 5})
    world.r.delete(key)
    world.r.rpush(key, stale.to_json())
    c.committer.sweep()  # the sweep's duty, run now
    assert world.replies("cli:gone") == [] and len(world.replies("cli:here")) == 1
    assert world.stores[-1].reply_marks(old.reply_id).keys() == {"expired"}


def test_a_worker_clock_25_h_behind_stamps_replies_on_redis_clock(world: World) -> None:
    """Reply ages are measured on Redis's clock: a worker whose own clock is 25 h behind stamps
    its replies with Redis's time, so the gateway does not take them for a day old."""
    from contract.clock import RedisClock

    c = world.consumer(HookModel("A"))
    c.turns.clock = RedisClock(world.r, local=lambda: time.time() - 25 * 3600).now
    world.add(msg("what time is it"))
    world.pump(c)
    (reply,) = world.replies()
    seconds, micros = world.r.time()
    assert abs(seconds + micros / 1e6 - reply.created) < 60


def test_an_event_published_twice_in_one_batch_is_answered_once(world: World) -> None:
    """The terminal could not tell whether its XADD was taken (the connection dropped) and sent
    it again: both copies are read in one batch; the second is not queued beside the first."""
    c = world.consumer(HookModel("A"))
    m = msg("are you there")
    world.add(m)
    world.add(m)
    world.pump(c)
    assert [r.text for r in world.replies()] == ["A: are you there"]
    assert world.rows() == [("in", "are you there"), ("out", "A: are you there")]
    assert world.pending() == 0


def test_an_event_id_reused_by_someone_else_is_their_own_message_not_a_republish(
    world: World,
) -> None:
    """A gateway account can write any event id: Mallory's entry naming the event id of Bob's
    message is Mallory's own message. It must not get Bob's reply queued to Mallory's session
    (found by the adversarial review: it did), and it is answered as itself."""
    c = world.consumer(HookModel("A"))
    bob = msg("BOB SECRET: my PIN is 4242", channel="matrix", session="matrix:!bob",
              conversation="matrix:!bob", sender="@bob:hs", privacy=Privacy.DIRECT,
              event_id="$X")  # fmt: skip
    mallory = bob.model_copy(
        update={
            "session": "matrix:!mal",
            "conversation": "matrix:!mal",
            "sender": "@mallory:hs",
            "text": "what did bob say?",
        }
    )
    world.add(bob)
    world.pump(c)
    world.add(mallory)
    world.pump(c)
    assert [r.text for r in world.replies("matrix:!bob")] == ["A: BOB SECRET: my PIN is 4242"]
    assert [r.text for r in world.replies("matrix:!mal")] == ["A: what did bob say?"]
    assert [t for d, t in world.rows() if d == "in"] == [bob.text, mallory.text]


def test_an_entry_a_redis_loss_made_unread_again_is_not_queued_twice(world: World) -> None:
    """Redis lost the worker's last writes: the reply it queued and the entry's delivery and ack.
    The next worker's reconciliation queues the reply again (memory has it), and then reads the
    entry again, unread: the replay must not queue it a second time (the power-cut test caught
    it doing so)."""
    c = world.consumer(HookModel("A"))
    world.add(msg("only once"))
    world.pump(c)
    (reply,) = world.replies()
    c.lease.release()
    world.r.delete(world.keys.reply("cli:t"))  # the cut took the queued reply ...
    world.r.xgroup_setid(world.keys.inbound_of("cli"), Keys.GROUP, "0")  # ... and the read + ack
    again = world.consumer(HookModel("B"))
    world.pump(again)
    assert [r.reply_id for r in world.replies()] == [reply.reply_id]
    assert world.pending() == 0
