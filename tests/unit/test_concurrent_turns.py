"""Concurrent turns with one writer (issue 12), against fakeredis and the real memory store.

The model here is a gate: each call blocks until the test opens it, so the test sees which turns
are in flight at once, and in which order they started."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config, ModelConfig, RedisConfig, TurnsConfig, WorkerConfig
from contract.keys import Keys
from contract.messages import InboundMessage, Kind, Privacy, Reply
from memory.facade import MemoryUnwritable
from memory.store import MemoryStore
from worker.busy import BusySignal
from worker.main import TurnTools, assemble
from worker.model import Completion, ToolCall
from worker.turn import Turns


def covers_of(store: MemoryStore, answered_by: str) -> list[str]:
    """The entries the reply keyed by ``answered_by`` answers besides its own key (what
    MemoryStore.add_covers recorded; recorded_reply reads them)."""
    rows = store.conn.execute(
        "SELECT stream_id FROM reply_covers WHERE answered_by = ?", (answered_by,)
    ).fetchall()
    return [str(r[0]) for r in rows]


class GateModel:
    """Every call waits until :meth:`open` lets calls whose last message contains a word
    through (``"*"``: all); records what each call saw and which calls overlapped."""

    name = "gate"

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.opened: set[str] = set()
        self.started: list[str] = []  # the last user message of each call, in start order
        self.seen: list[list[dict[str, Any]]] = []
        self.in_flight = 0
        self.most = 0
        self.tool_first: set[str] = set()  # words whose first call asks for search_history
        self.tool_results: list[str] = []

    def open(self, word: str = "*") -> None:
        with self.cond:
            self.opened.add(word)
            self.cond.notify_all()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        last = str(messages[-1]["content"])
        if messages[-1]["role"] == "tool":
            self.tool_results.append(last)
            return Completion(content="searched", finish_reason="stop")
        with self.cond:
            self.started.append(last)
            self.seen.append(messages)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                ok = self.cond.wait_for(
                    lambda: "*" in self.opened or any(w in last for w in self.opened), timeout=10
                )
                assert ok, f"the test never let {last!r} through"
            finally:
                self.in_flight -= 1
        word = next((w for w in self.tool_first if w in last), None)
        if word is not None:
            self.tool_first.discard(word)
            call = ToolCall(id="t1", name="search_history", arguments={"query": "needle"})
            return Completion(content="", tool_calls=[call], finish_reason="tool_calls")
        return Completion(content=f"echo: {last.split(': ', 1)[-1]}", finish_reason="stop")

    def close(self) -> None:
        pass


def msg(text: str, session: str, **kw: object) -> InboundMessage:
    privacy = kw.pop("privacy", Privacy.OWNER)
    base: dict[str, object] = dict(
        channel="cli", session=session, conversation=session, sender="ada",
        privacy=privacy, text=text, ts=1.0, event_id=f"ev-{text}",
    )  # fmt: skip
    base.update(kw)
    return InboundMessage.model_validate(base)


def group_msg(text: str, room: str) -> InboundMessage:
    return msg(
        text, f"matrix:{room}", channel="matrix", sender="@bob:example.org", privacy=Privacy.GROUP
    )


class Rig:
    def __init__(
        self,
        tmp_path: Path,
        *,
        limit: int = 4,
        mode: str = "followup",
        batch: int = 100,
        turns: dict[str, Any] | None = None,
        busy: BusySignal | None = None,
        r: fakeredis.FakeRedis | None = None,
    ) -> None:
        self.cfg = Config(
            home=tmp_path,
            redis=RedisConfig(prefix="rb:"),
            model=ModelConfig(concurrency=limit),
            worker=WorkerConfig(max_attempts=3, batch=batch),
            turns=TurnsConfig.model_validate({"mode": mode, **(turns or {})}),
        )
        self.r = r or fakeredis.FakeRedis()
        self.keys = self.cfg.keys
        self.store = MemoryStore(tmp_path / "memory.sqlite3")
        self.model = GateModel()
        turns = Turns(self.cfg, self.store, self.model, TurnTools())
        self.c = assemble(self.cfg, self.r, turns, busy=busy)
        assert self.c.acquire(wait=False)
        self.c.reader.ensure_group()
        self.c.reader.recover()
        self.c.writer.pool.start()

    def add(self, m: InboundMessage) -> str:
        stream = self.keys.inbound_of(m.channel)
        raw = self.r.xadd(stream, m.to_fields()).decode()  # type: ignore[union-attr]
        return f"{m.channel}/{raw}"

    def step(self) -> None:
        """Read what is there and do what can be done now (no waiting for turns)."""
        self.c.writer.take(self.c.reader.read(block_ms=0))
        self.c.writer.advance()

    def until(self, cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.c.writer.pool.wait(0.02)
            self.step()

    def replies(self, session: str) -> list[Reply]:
        return [Reply.from_json(x) for x in self.r.lrange(self.keys.reply(session), 0, -1)]

    def close(self) -> None:
        self.model.open()
        self.c.writer.pool.close()
        self.c.lease.release()
        self.store.close()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def build(**kw: Any) -> Rig:
        rig = Rig(tmp_path / f"r{len(rigs)}", **kw)
        rigs.append(rig)
        return rig

    yield build
    for rig in rigs:
        rig.close()


def test_turns_of_different_sessions_run_side_by_side_up_to_the_limit(
    make: Callable[..., Rig],
) -> None:
    rig = make(limit=3)
    for n in range(5):
        rig.add(msg(f"hello {n}", f"cli:s{n}"))
    rig.until(lambda: rig.model.in_flight == 3, "three turns in flight")
    time.sleep(0.1)
    rig.step()
    assert rig.model.in_flight == 3  # the limit holds: two wait for a slot
    rig.model.open()
    rig.until(lambda: all(rig.replies(f"cli:s{n}") for n in range(5)), "every reply")
    assert rig.model.most == 3
    assert rig.c.writer.in_hand() == 0
    assert int(rig.r.xpending(rig.keys.inbound_of("cli"), "worker")["pending"]) == 0


def test_one_session_stays_in_order_and_others_overtake_a_slow_turn(
    make: Callable[..., Rig],
) -> None:
    rig = make(limit=4, mode="followup")
    first = rig.add(msg("slow one", "cli:a"))
    second = rig.add(msg("then this", "cli:a"))
    rig.add(msg("quick other", "cli:b"))
    rig.until(lambda: len(rig.model.started) == 2, "two turns started")
    assert not any("then this" in s for s in rig.model.started)  # waits for its own session
    rig.model.open("quick")
    rig.until(lambda: bool(rig.replies("cli:b")), "the other session's reply")
    assert rig.replies("cli:a") == []
    rig.model.open("slow")
    rig.until(lambda: len(rig.model.started) == 3, "the second turn of cli:a")
    rig.model.open("then")
    rig.until(lambda: len(rig.replies("cli:a")) == 2, "both replies of cli:a")
    assert [r.answers for r in rig.replies("cli:a")] == [first, second]
    # the second turn saw the first reply: its context was built after it was recorded
    texts = [str(m["content"]) for m in rig.model.seen[-1]]
    assert any("echo: slow one" in t for t in texts)


def test_messages_that_pile_up_during_a_turn_are_answered_together(
    make: Callable[..., Rig],
) -> None:
    rig = make(mode="collect")
    first = rig.add(msg("first", "cli:a"))
    rig.until(lambda: len(rig.model.started) == 1, "the first turn")
    later = [rig.add(msg(f"more {n}", "cli:a")) for n in range(3)]
    rig.step()
    time.sleep(0.05)
    rig.step()
    assert len(rig.model.started) == 1  # they wait for the turn of their session
    rig.model.open()
    rig.until(lambda: len(rig.replies("cli:a")) == 2, "two replies")
    assert len(rig.model.started) == 2  # one model call for the three that piled up
    texts = [str(m["content"]) for m in rig.model.seen[1]]
    joined = "\n".join(texts)
    positions = [joined.index(f"more {n}") for n in range(3)]
    assert positions == sorted(positions)  # all of them, in order
    assert "echo: first" in joined  # after the first reply
    replies = rig.replies("cli:a")
    assert [r.answers for r in replies] == [first, later[-1]]
    # each message is recorded; the collected reply records which messages it answers
    store = rig.store
    assert store.conn.execute("SELECT COUNT(*) FROM log WHERE direction = 'in'").fetchone()[0] == 4
    assert sorted(covers_of(store, later[-1])) == sorted(later[:2])
    for sid in later:
        found = store.recorded_reply(sid)
        assert found is not None and found.reply_id == replies[1].reply_id
    assert rig.c.writer.in_hand() == 0


def test_a_replay_of_collected_messages_adds_nothing_and_asks_nothing(
    make: Callable[..., Rig], tmp_path: Path
) -> None:
    rig = make(mode="collect")
    for n in range(3):
        rig.add(msg(f"burst {n}", "cli:a"))
    rig.model.open()
    rig.until(lambda: bool(rig.replies("cli:a")), "the reply")
    assert len(rig.model.started) == 1
    [original] = rig.replies("cli:a")
    # the worker died after memory committed and before the ack: the entries come again
    stream = rig.keys.inbound_of("cli")
    rig.r.xgroup_setid(stream, "worker", "0")
    rig.r.delete(rig.keys.reply("cli:a"))  # Redis lost the queued reply too
    rig.until(lambda: bool(rig.replies("cli:a")), "the reply queued again")
    rig.until(lambda: rig.c.writer.in_hand() == 0, "the replay done")
    assert len(rig.model.started) == 1  # not asked again
    assert rig.replies("cli:a") == [original]  # queued once, as it was (it replies to the
    # last message's event, though the first message's replay found it and queued it again)
    n_in = rig.store.conn.execute("SELECT COUNT(*) FROM log WHERE direction = 'in'").fetchone()
    n_out = rig.store.conn.execute("SELECT COUNT(*) FROM log WHERE direction = 'out'").fetchone()
    assert (n_in[0], n_out[0]) == (3, 1)


def test_the_owner_is_not_queued_behind_other_peoples_turns(make: Callable[..., Rig]) -> None:
    rig = make(limit=3)
    for n in range(6):  # a flood in six group rooms
        rig.add(group_msg(f"group {n}", f"room{n}"))
    rig.until(lambda: rig.model.in_flight == 2, "two group turns (one slot is the owner's)")
    rig.step()
    assert rig.model.in_flight == 2
    rig.add(msg("owner asks", "cli:me"))
    rig.until(lambda: rig.model.in_flight == 3, "the owner's turn, in the reserved slot")
    rig.model.open("owner")
    rig.until(lambda: bool(rig.replies("cli:me")), "the owner's reply")
    assert not any(rig.replies(f"matrix:room{n}") for n in range(6))
    rig.model.open()
    rig.until(lambda: all(rig.replies(f"matrix:room{n}") for n in range(6)), "all replies")


def test_the_owners_turns_do_not_shrink_other_peoples_slots(make: Callable[..., Rig]) -> None:
    """One slot is kept for the owner: other people's turns use at most ``limit - 1``. The
    owner's own running turns are that slot in use, not a reason to leave the limit unused
    (three owner turns and a group turn fill a limit of 4)."""
    rig = make(limit=4)
    for name in ("cli:a", "cli:b", "cli:c"):
        rig.add(msg(f"owner {name}", name))
    rig.until(lambda: rig.model.in_flight == 3, "the owner's three turns")
    rig.add(group_msg("group 0", "room0"))
    rig.add(group_msg("group 1", "room1"))
    rig.until(lambda: rig.model.in_flight == 4, "a group turn in the fourth slot")
    rig.step()
    assert rig.model.in_flight == 4  # never more than the limit
    rig.model.open()
    rig.until(lambda: bool(rig.replies("matrix:room1")), "every reply")


def test_the_owner_goes_first_when_every_slot_is_taken(make: Callable[..., Rig]) -> None:
    rig = make(limit=1)
    for n in range(3):
        rig.add(group_msg(f"group {n}", f"room{n}"))
    rig.until(lambda: rig.model.in_flight == 1, "one group turn")
    rig.add(msg("owner asks", "cli:me"))
    rig.step()
    rig.model.open("group 0")
    rig.until(lambda: len(rig.model.started) == 2, "the next turn")
    assert "owner asks" in rig.model.started[1]  # before the waiting group messages


def test_a_tool_call_runs_on_the_writer_and_sees_what_it_committed(
    make: Callable[..., Rig],
) -> None:
    rig = make()
    rig.add(msg("the needle is in the haystack", "cli:a"))
    rig.model.open()
    rig.until(lambda: bool(rig.replies("cli:a")), "the first reply")
    rig.model.tool_first.add("search now")
    rig.add(msg("search now", "cli:a"))
    rig.until(lambda: len(rig.replies("cli:a")) == 2, "the reply after the tool call")
    assert rig.model.tool_results and "needle" in rig.model.tool_results[0]


def test_a_memory_command_waits_for_the_turns_in_flight_and_none_starts_before_it(
    make: Callable[..., Rig],
) -> None:
    rig = make()
    rig.add(msg("running", "cli:a"))
    rig.until(lambda: rig.model.in_flight == 1, "a turn in flight")
    command = msg(
        "", "cli:admin", kind=Kind.COMMAND, extra={"op": "notes.list", "args": {}}, event_id="cmd-1"
    )
    rig.add(command)
    rig.add(msg("after the command", "cli:b"))
    for _ in range(5):
        rig.step()
        time.sleep(0.02)
    assert rig.replies("cli:admin") == []  # waits for the turn in flight
    assert len(rig.model.started) == 1  # and no turn starts before it
    rig.model.open("running")
    rig.until(lambda: bool(rig.replies("cli:admin")), "the command's answer")
    rig.model.open()
    rig.until(lambda: bool(rig.replies("cli:b")), "the turn after it")


def test_memory_refusing_a_reply_keeps_it_and_asks_the_model_once(
    make: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make()
    rig.add(msg("hello", "cli:a"))
    rig.until(lambda: rig.model.in_flight == 1, "the turn")
    memory = rig.c.turns.memory
    real = memory.record_reply
    refusals = {"n": 0}

    def refuse(*a: Any, **kw: Any) -> None:
        if refusals["n"] < 2:
            refusals["n"] += 1
            raise MemoryUnwritable("database or disk is full")
        real(*a, **kw)

    monkeypatch.setattr(memory, "record_reply", refuse)
    monkeypatch.setattr("worker.batch.MEMORY_RETRY_START", 0.01)
    rig.c.committer.blocked = None
    rig.model.open()
    rig.until(lambda: rig.c.committer.blocked is not None, "memory blocked")
    assert rig.c.committer.memory_blocked
    assert rig.replies("cli:a") == []
    rig.until(lambda: bool(rig.replies("cli:a")), "the reply once memory takes it")
    assert len(rig.model.started) == 1
    assert rig.c.committer.blocked is None and rig.c.committer.memory_blocked == ""
    assert len(rig.replies("cli:a")) == 1


def test_stopping_finishes_the_turns_in_flight_and_leaves_the_rest_pending(
    make: Callable[..., Rig],
) -> None:
    rig = make(limit=2, mode="followup")
    rig.add(msg("one", "cli:a"))
    rig.add(msg("two", "cli:a"))
    rig.add(msg("other", "cli:b"))
    rig.until(lambda: rig.model.in_flight == 2, "two turns")
    rig.c.control.stopping = True
    rig.model.open()
    rig.c.drain()
    assert [len(rig.replies(s)) for s in ("cli:a", "cli:b")] == [1, 1]
    pending = rig.r.xpending(rig.keys.inbound_of("cli"), "worker")["pending"]
    assert pending == 1  # "two" never started: it waits for the next worker


def test_a_session_waiting_for_a_slot_shows_as_busy(make: Callable[..., Rig]) -> None:
    """The "thinking" mark is on while a session has a turn running or waiting, and goes with
    its reply."""
    r = fakeredis.FakeRedis()
    busy = BusySignal(r, Keys("rb:"), after=0.05, ttl=1.0)
    rig = make(limit=1, busy=busy, r=r)
    busy.start()
    try:
        rig.add(msg("running", "cli:a"))
        rig.until(lambda: rig.model.in_flight == 1, "the first turn")
        rig.add(msg("waiting", "cli:b"))  # no slot: it waits
        rig.until(lambda: bool(rig.r.exists(rig.keys.busy("cli:b"))), "cli:b marked busy")
        assert rig.r.exists(rig.keys.busy("cli:a"))
        # which is which: `relaybot chat` counts its --timeout from "running" (issue 26)
        assert rig.r.get(rig.keys.busy("cli:a")) == b"running"
        assert rig.r.get(rig.keys.busy("cli:b")) == b"waiting"
        rig.model.open()
        rig.until(lambda: len(rig.replies("cli:a")) + len(rig.replies("cli:b")) == 2, "replies")
        rig.until(lambda: rig.c.writer.in_hand() == 0, "all acked")
        time.sleep(0.15)  # a late mark would land now
        assert not rig.r.exists(rig.keys.busy("cli:a"))
        assert not rig.r.exists(rig.keys.busy("cli:b"))
    finally:
        busy.stop()


def test_a_collected_reply_memory_refused_answers_all_its_messages_once(
    make: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory refuses the collected reply (disk full): once it takes writes, that reply is
    recorded and queued once for all the messages it answers; the model is not asked again
    (the adversarial review found the group's later messages sent to the model a second time,
    and the user given a reply memory did not hold)."""
    rig = make(mode="collect")
    first = rig.add(msg("first", "cli:a"))
    rig.until(lambda: rig.model.in_flight == 1, "the first turn")
    later = [rig.add(msg(f"more {n}", "cli:a")) for n in range(3)]
    rig.step()
    memory = rig.c.turns.memory
    real = memory.record_reply
    refusals = {"n": 0}

    def refuse(reply: Reply, *a: Any, **kw: Any) -> Any:
        if reply.answers == later[-1] and refusals["n"] < 2:
            refusals["n"] += 1
            raise MemoryUnwritable("database or disk is full")
        return real(reply, *a, **kw)

    monkeypatch.setattr(memory, "record_reply", refuse)
    monkeypatch.setattr("worker.batch.MEMORY_RETRY_START", 0.01)
    rig.model.open()
    rig.until(
        lambda: len(rig.replies("cli:a")) == 2 and rig.c.writer.in_hand() == 0, "both replies"
    )
    assert refusals["n"] == 2
    assert len(rig.model.started) == 2  # the collected turn was not asked again
    replies = rig.replies("cli:a")
    assert [r.answers for r in replies] == [first, later[-1]]
    recorded = rig.store.recorded_reply(later[0])
    assert recorded is not None and recorded.reply_id == replies[1].reply_id
    time.sleep(0.05)
    rig.step()
    assert len(rig.replies("cli:a")) == 2


def test_a_reply_with_a_lone_surrogate_is_queued_not_fatal(make: Callable[..., Rig]) -> None:
    """A broken tokenizer's half emoji: the reply is queued with U+FFFD (it stopped the worker:
    the reply could not be encoded for the queue)."""
    rig = make()
    real = rig.model.complete

    def broken(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        done = real(messages, tools)
        return Completion(content=f"{done.content} \ud83d", finish_reason="stop")

    rig.model.complete = broken  # type: ignore[method-assign]
    rig.add(msg("emoji please", "cli:a"))
    rig.add(msg("and me", "cli:b"))
    rig.model.open()
    rig.until(lambda: bool(rig.replies("cli:a")) and bool(rig.replies("cli:b")), "replies")
    assert rig.replies("cli:a")[0].text.endswith("\ufffd")
    assert rig.c.writer.in_hand() == 0


def test_the_owner_overtakes_a_flood_larger_than_what_the_worker_holds(
    make: Callable[..., Rig],
) -> None:
    """More group messages than the worker holds in hand (10 reads' worth): the owner's
    terminal is still read on and answered in the reserved slot (the adversarial review: a
    flood of 2,000 kept the owner unanswered for 90 s)."""
    rig = make(limit=2, batch=5)  # at most 50 in hand, then only the terminal is read on
    for n in range(120):
        rig.add(group_msg(f"flood {n}", f"room{n}"))
    rig.until(lambda: rig.model.in_flight == 1, "one group turn (the other slot is the owner's)")
    for _ in range(30):
        rig.step()
    assert rig.c.writer.in_hand() <= 60
    rig.add(msg("owner asks", "cli:me"))
    rig.until(lambda: rig.model.in_flight == 2, "the owner's turn")
    rig.model.open("owner")
    rig.until(lambda: bool(rig.replies("cli:me")), "the owner's reply")
    assert sum(bool(rig.replies(f"matrix:room{n}")) for n in range(120)) == 0


def test_the_owners_terminal_goes_on_while_a_restart_replays_what_was_left(
    make: Callable[..., Rig],
) -> None:
    """A restart replays the entries the last worker left pending one at a time (each read
    counts as a delivery); the owner's new terminal messages are read and answered meanwhile
    when none of the terminal's own is left to replay (the adversarial review: the owner waited
    54 s behind a replay of 179 entries)."""
    rig = make(limit=2)
    for n in range(4):
        rig.add(group_msg(f"left {n}", f"room{n}"))
    rig.c.reader.streams.read_new(block_ms=None, count=100)  # read, never handled: the worker died
    rig.c.reader.recover()
    assert len(rig.c.control.deliveries) == 4
    rig.until(lambda: rig.model.in_flight == 1, "the first replayed turn")
    rig.add(msg("owner asks", "cli:me"))
    rig.until(lambda: rig.model.in_flight == 2, "the owner's turn beside the replay")
    rig.model.open("owner")
    rig.until(lambda: bool(rig.replies("cli:me")), "the owner's reply")
    assert not any(rig.replies(f"matrix:room{n}") for n in range(4))
    rig.model.open()
    rig.until(lambda: all(rig.replies(f"matrix:room{n}") for n in range(4)), "the replay")
    assert rig.model.most == 2  # the replay itself stayed one at a time


def test_collect_or_followup_per_channel_and_per_conversation(make: Callable[..., Rig]) -> None:
    """``[turns] conversations`` wins over ``channels``, which wins over ``mode``."""
    rig = make(
        mode="followup",
        turns={"channels": {"cli": "collect"}, "conversations": {"cli:one-by-one": "followup"}},
    )
    for session in ("cli:together", "cli:one-by-one"):
        for n in range(3):
            rig.add(msg(f"{session} {n}", session))
    rig.model.open()
    rig.until(lambda: len(rig.replies("cli:one-by-one")) == 3, "a reply each")
    rig.until(lambda: bool(rig.replies("cli:together")), "the collected reply")
    rig.until(lambda: rig.c.writer.in_hand() == 0, "all acked")
    assert len(rig.replies("cli:together")) == 1


def _left_by_a_dead_worker(rig: Rig, texts: list[str], *, times: int) -> None:
    """Messages of four sessions that a worker read and died on, ``times`` workers in a row
    (the delivery count the next worker finds), then the living one recovers them."""
    for t in texts:
        rig.add(msg(t, f"cli:{t}"))
    stream = rig.keys.inbound_of("cli")
    rig.r.xreadgroup("worker", "worker@gone:1", {stream: ">"}, count=len(texts))
    for n in range(2, times + 1):  # handed to another worker that died too: one delivery more
        ids = [p["message_id"] for p in rig.r.xpending_range(stream, "worker", "-", "+", 100)]
        rig.r.xclaim(stream, "worker", f"worker@gone:{n}", 0, ids)
    rig.c.reader.recover()


def test_after_a_worker_died_its_pending_messages_are_replayed_side_by_side(
    make: Callable[..., Rig],
) -> None:
    rig = make(limit=4)
    texts = ["pa", "pb", "pc", "pd"]
    _left_by_a_dead_worker(rig, texts, times=1)
    rig.until(lambda: rig.model.in_flight == 4, "the four replayed turns to run at once")
    rig.model.open()
    rig.until(lambda: all(rig.replies(f"cli:{t}") for t in texts), "every reply")
    assert not rig.c.control.deliveries


def test_messages_two_dead_workers_did_not_finish_are_replayed_one_at_a_time(
    make: Callable[..., Rig],
) -> None:
    rig = make(limit=4)
    texts = ["qa", "qb", "qc"]
    _left_by_a_dead_worker(rig, texts, times=2)
    rig.model.open()
    rig.until(lambda: all(rig.replies(f"cli:{t}") for t in texts), "every reply")
    assert rig.model.most == 1  # one may be killing workers: isolated, the others not charged


def test_a_lease_won_by_an_acquire_whose_answer_was_lost_is_taken_again_properly(
    make: Callable[..., Rig], tmp_path: Path
) -> None:
    """Redis stalled while the worker was taking the lease back: Redis set the key to this
    worker's name, the answer (its fencing token) never came back. The resume must not take the
    key for a lease it holds: it never fenced memory, which another worker fenced meanwhile, so
    every write was fenced out and the resume looped, replaying (and dead-lettering) healthy
    entries (adversarial review, Redis frozen under two workers)."""
    from contract.liveness import Lease

    rig = make(limit=2)
    c, key = rig.c, rig.keys.lease
    # another worker took over while this one could not reach Redis, and fenced memory
    rig.r.delete(key)
    other = Lease(rig.r, key, "worker@elsewhere:1", 30.0)
    assert other.try_acquire()
    with MemoryStore(rig.store.path) as theirs:
        theirs.fence(other.epoch)
    # then its lease lapsed too, and this worker's acquire ran in Redis, unanswered
    rig.r.delete(key)
    c.lease.release()
    c.lease = Lease(rig.r, key, c.name, 30.0)  # as _resume makes it before acquiring
    rig.r.set(key, c.name, px=30_000)
    rig.r.incr(f"{key}:epoch")
    assert c.lease.epoch == 0 and c.lease.holder() == c.name

    assert c._resume(wait=False)
    assert c.lease.epoch > other.epoch  # taken again, and memory fenced with it
    rig.model.open()
    rig.add(msg("after the stall", "cli:a"))
    rig.until(lambda: bool(rig.replies("cli:a")), "the reply")  # memory takes the writes
    assert rig.r.xlen(rig.keys.dead) == 0


def test_a_reply_is_queued_at_once_while_other_turns_are_at_the_model(
    make: Callable[..., Rig],
) -> None:
    """The writer holds finished replies for a batched flush only while it has other work it
    can do now; turns at the model and messages waiting for a slot are not that (the owner's
    reply waited for the flush timer while a flood's turns ran: bench.concurrency)."""
    rig = make(limit=2)
    rig.c.writer.flush_after = 30.0  # a held reply would wait for this
    for n in range(4):
        rig.add(group_msg(f"flood {n}", f"room{n}"))
    rig.until(lambda: rig.model.in_flight == 1, "one group turn (the other slot is the owner's)")
    rig.add(msg("owner asks", "cli:me"))
    rig.until(lambda: rig.model.in_flight == 2, "the owner's turn")
    rig.model.open("owner")
    rig.until(lambda: bool(rig.replies("cli:me")), "the owner's reply, before the flush timer")
    assert rig.model.in_flight == 1  # the group turn still runs; three group messages wait


@pytest.mark.parametrize("again", ["same entry", "event published again"])
def test_an_erased_messages_reply_is_never_queued_again(
    make: Callable[..., Rig], again: str
) -> None:
    """An erased message whose entry comes again (a replay), or whose event a gateway publishes
    again under a new stream id (its cursor rolled back): the blanked reply is not queued (the
    adversarial review: an empty reply with the old reply id was queued)."""
    from memory.erasure import erase

    rig = make()
    rig.model.open()
    m = msg("my secret plan", "cli:er")
    first = rig.add(m)
    rig.until(lambda: bool(rig.replies("cli:er")), "the reply")
    row = rig.store.conn.execute(
        "SELECT id FROM log WHERE direction = 'in' AND stream_id = ?", (first,)
    ).fetchone()
    erase(rig.store, kind="id", target=str(row[0]), reason="asked", requested_by="owner",
          stream_id="cli/9-0")  # fmt: skip
    rig.r.delete(rig.keys.reply("cli:er"))  # the worker deletes the queued copy with it
    if again == "same entry":
        stream = first.split("/", 1)[0]
        rig.r.xgroup_setid(rig.keys.inbound_of(stream), "worker", "0")  # delivered again
        rig.c.control.deliveries[first] = 2
    else:
        rig.add(m)  # the same event, a new stream id
    for _ in range(5):
        rig.c.writer.pool.wait(0.02)
        rig.step()
    rig.c.committer.acked()
    assert rig.replies("cli:er") == []
    assert len(rig.model.started) == 1  # and the model was not asked again
