"""The owner's audited erasure: the one exception to append-only (memory/erasure.py).

After an erasure nothing of the erased text is left in the log, in the FTS index (queried
directly), in the notes, in the caches or in the database files, the tombstone stays, and outside
an erasure the triggers still refuse UPDATE and DELETE.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Kind, Privacy, Reply, ReplyKind
from memory import commands, erasure
from memory.commands import CommandContext, CommandError
from memory.erasure import erase, plan_erasure
from memory.identity import OwnerResolver
from memory.identity_writer import Identity, create_handle
from memory.rows import LogRow
from memory.store import MemoryStore

SECRET = "zanzibarquux"
_n = itertools.count(1)


class World:
    """A writer's store with messages recorded the way the worker records them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = MemoryStore(path)
        self.identity = Identity(
            OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )

    def say(
        self,
        text: str,
        *,
        channel: str = "matrix",
        sender: str = "@bob:m.org",
        conversation: str = "matrix:dm-bob",
        privacy: Privacy = Privacy.DIRECT,
        reply: str | None = "noted",
    ) -> tuple[LogRow, LogRow | None]:
        n = next(_n)
        msg = InboundMessage(
            kind=Kind.MESSAGE,
            channel=channel,
            session=conversation,
            conversation=conversation,
            sender=sender,
            sender_name=sender.strip("@").split(":")[0].title(),
            privacy=privacy,
            text=text,
            ts=1_795_000_000.0 + n,
            event_id=f"ev{n}",
        )
        sid = f"{1_795_000_000_000 + n}-0"
        is_owner = self.identity.resolver.is_owner(channel, sender)
        with self.store.transaction():
            row = self.identity.append_inbound(self.store, msg, sid, is_owner=is_owner)
            out = None
            if reply is not None:
                out = self.store.append_reply(
                    Reply(
                        reply_id=f"r{n}",
                        answers=sid,
                        kind=ReplyKind.REPLY,
                        channel=channel,
                        session=conversation,
                        conversation=conversation,
                        text=reply,
                        created=msg.ts + 1,
                    ),
                    sender="relaybot",
                    privacy=privacy,
                )
        return row, out

    def note(self, text: str, **fields: Any) -> int:
        values = {
            "type": "fact",
            "topic": "",
            "text": text,
            "scope": "chat",
            "visibility": "private",
            "created_ts": 1_795_000_500.0 + next(_n),
            **fields,
        }
        cols = ", ".join(values)
        with self.store.transaction():
            cur = self.store.conn.execute(
                f"INSERT INTO note ({cols}) VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
        return int(cur.lastrowid or 0)

    def q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.store.conn.execute(sql, params).fetchall()

    def file_bytes(self) -> bytes:
        return b"".join(
            p.read_bytes() for p in self.path.parent.iterdir() if p.name.startswith(self.path.name)
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "memory.sqlite3")
    yield w
    w.store.close()


def fts(world: World, word: str) -> list[int]:
    return [r[0] for r in world.q("SELECT rowid FROM log_fts WHERE log_fts MATCH ?", word)]


def note_fts(world: World, word: str) -> list[int]:
    return [r[0] for r in world.q("SELECT rowid FROM note_fts WHERE note_fts MATCH ?", word)]


def do_erase(world: World, kind: str, target: str, sid: str = "1795999999999-0") -> dict[str, Any]:
    return erase(
        world.store, kind=kind, target=target, reason="asked", requested_by="ada", stream_id=sid
    )


def test_erasing_a_conversation_leaves_nothing_of_its_text(world: World) -> None:
    kept, _ = world.say("the weather is fine", conversation="matrix:other")
    world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # old text in the db file too
    first, first_reply = world.say(f"my password is {SECRET}")
    second, _ = world.say("and the door code is 1234", reply=f"ok, {SECRET} noted")
    learned = world.note(f"bob's password is {SECRET}", source_conversation="matrix:dm-bob")
    newer = world.note(f"bob's password is still {SECRET}", supersedes=learned)
    kept_for_chat = world.note("bob likes tea", chat="matrix:dm-bob", scope="chat")
    unrelated = world.note("ada likes coffee", source_conversation="cli:ada")
    assert fts(world, SECRET) and note_fts(world, SECRET)
    assert world.store.recent(1)[0].text == f"ok, {SECRET} noted"  # cached

    result = do_erase(world, "conversation", "matrix:dm-bob")

    assert result["log_rows"] == 4 and result["notes"] == 3 and not result["replayed"]
    erased_ids = sorted([first.id, first_reply.id, second.id, second.id + 1])
    rows = world.q("SELECT id, text, extra FROM log WHERE conversation = 'matrix:dm-bob'")
    assert [(i, t) for i, t, _ in rows] == [(i, "") for i in erased_ids]
    assert {json.loads(x)["erased"] for _, _, x in rows} == {result["erasure"]}
    assert world.q("SELECT text FROM log WHERE id = ?", kept.id) == [("the weather is fine",)]
    # the index, queried directly, finds nothing; the other conversation is still found
    assert fts(world, SECRET) == [] and fts(world, "password") == [] and fts(world, "1234") == []
    assert fts(world, "weather") == [kept.id]
    # derived notes are gone (with the version that superseded one), others stay
    assert [r[0] for r in world.q("SELECT id FROM note ORDER BY id")] == [unrelated]
    assert note_fts(world, SECRET) == [] and note_fts(world, "tea") == []
    assert {learned, newer, kept_for_chat}.isdisjoint(r[0] for r in world.q("SELECT id FROM note"))
    # the tombstone says what, when, why, how many, which ids; the grant is gone
    (tomb,) = world.q(
        "SELECT target_kind, target, reason, requested_by, log_rows, notes, detail FROM erasure"
    )
    assert tomb[:6] == ("conversation", "matrix:dm-bob", "asked", "ada", 4, 3)
    detail = json.loads(tomb[6])
    assert detail["log_ids"] == erased_ids
    assert sorted(detail["note_ids"]) == sorted([learned, newer, kept_for_chat])
    assert world.q("SELECT count(*) FROM erasure_grant") == [(0,)]
    # the caches serve no old text, and nothing of it is left in the database files
    assert all(SECRET not in r.text for r in world.store.recent(50))
    assert all(SECRET not in r.text for r in world.store.recent(50, conversation="matrix:dm-bob"))
    assert SECRET.encode() not in world.file_bytes()
    assert b"door code" not in world.file_bytes()


def test_outside_an_erasure_the_log_and_notes_stay_append_only(world: World) -> None:
    row, _ = world.say(f"secret {SECRET}")
    note = world.note("a fact", source_conversation="x")
    do_erase(world, "id", str(row.id))
    conn = world.store.conn
    for sql in (
        "UPDATE log SET text = 'changed' WHERE id = 2",
        "DELETE FROM log WHERE id = 2",
        f"UPDATE note SET text = 'changed' WHERE id = {note}",
        f"DELETE FROM note WHERE id = {note}",
        "UPDATE erasure SET reason = 'nothing'",
        "DELETE FROM erasure",
    ):
        with pytest.raises(sqlite3.DatabaseError, match=r"append-only|permanent"):
            conn.execute(sql)
    assert world.q("SELECT count(*) FROM erasure") == [(1,)]


def test_erasing_a_person_covers_linked_handles_and_the_replies_to_them(world: World) -> None:
    bob_m, bob_m_reply = world.say(f"matrix {SECRET}")
    bob_e, bob_e_reply = world.say(
        f"mail {SECRET}", channel="email", sender="bob@example.org", conversation="email:t1"
    )
    carol, _ = world.say(f"carol {SECRET}", sender="@carol:m.org", conversation="matrix:c")
    owner, _ = world.say(f"owner {SECRET}", sender="@me:m.org", privacy=Privacy.OWNER)
    # in a group: bob's words go, the others' stay
    group_bob, _ = world.say("group bob", conversation="matrix:g", privacy=Privacy.GROUP)
    group_carol, _ = world.say(
        "group carol", sender="@carol:m.org", conversation="matrix:g", privacy=Privacy.GROUP
    )
    conn = world.store.conn
    bob, bob_mail = bob_m.entity, bob_e.entity
    assert bob and bob_mail and bob != bob_mail
    a, b = sorted([bob, bob_mail])
    c, d = sorted([bob, str(carol.entity)])
    with world.store.transaction():
        conn.execute(
            "INSERT INTO entity_link (a, b, status, actor, ts) "
            "VALUES (?, ?, 'verified', 'owner', 1)",
            (a, b),
        )
        conn.execute(  # a suggestion merges nothing
            "INSERT INTO entity_link (a, b, status, actor, ts) "
            "VALUES (?, ?, 'suggested', 'model', 1)",
            (c, d),
        )
    world.note("bob's fact", source_entity=bob_mail)

    plan = plan_erasure(conn, "entity", "matrix:@bob:m.org")
    assert plan.entities == sorted([bob, bob_mail])
    result = do_erase(world, "entity", "matrix:@bob:m.org")

    erased = {bob_m.id, bob_m_reply.id, bob_e.id, bob_e_reply.id, group_bob.id, group_bob.id + 1}
    assert result["log_rows"] == len(erased) and result["notes"] == 1
    texts = dict(world.q("SELECT id, text FROM log"))
    assert {i for i, t in texts.items() if t == ""} == erased
    assert texts[carol.id] == f"carol {SECRET}" and texts[owner.id] == f"owner {SECRET}"
    assert texts[group_carol.id] == "group carol"
    assert sorted(fts(world, SECRET)) == sorted([carol.id, owner.id])


def test_rows_from_before_identity_are_matched_by_handle(world: World) -> None:
    msg = InboundMessage(
        channel="matrix",
        session="matrix:old",
        conversation="matrix:old",
        sender="@Bob:m.org",
        privacy=Privacy.DIRECT,
        text=f"old {SECRET}",
        ts=1.0,
        event_id="old",
    )
    with world.store.transaction():
        old = world.store.append_inbound(msg, "1-0", is_owner=False)  # no entity
        create_handle(world.store.conn, "matrix", "@bob:m.org")
    assert old.entity is None
    result = do_erase(world, "entity", "matrix:@bob:m.org")
    assert result["log_rows"] == 1
    assert world.q("SELECT text FROM log WHERE id = ?", old.id) == [("",)]


def test_erasing_one_entry_takes_its_reply_and_the_notes_of_that_turn(world: World) -> None:
    row, reply = world.say(f"one {SECRET}", reply=f"echo {SECRET}")
    other, _ = world.say("two")
    assert reply is not None
    world.note("from that turn", stream_id=row.stream_id)
    world.note("from another turn", stream_id=other.stream_id)
    result = do_erase(world, "id", str(row.id))
    assert (result["log_rows"], result["notes"]) == (2, 1)
    assert world.q("SELECT id FROM log WHERE text = ''") == [(row.id,), (reply.id,)]
    assert world.q("SELECT text FROM note") == [("from another turn",)]


def test_an_erasure_is_idempotent_and_refuses_an_empty_target(world: World) -> None:
    row, _ = world.say(f"x {SECRET}")
    first = do_erase(world, "conversation", row.conversation, sid="5-0")
    again = do_erase(world, "conversation", row.conversation, sid="5-0")  # a replay
    assert again == {**first, "replayed": True}
    assert world.q("SELECT count(*) FROM erasure") == [(1,)]
    with pytest.raises(CommandError, match="nothing to erase"):
        do_erase(world, "conversation", row.conversation, sid="6-0")  # a new request
    with pytest.raises(CommandError, match="no log row"):
        do_erase(world, "id", "999", sid="7-0")
    with pytest.raises(CommandError, match="no entity or handle"):
        do_erase(world, "entity", "nobody", sid="8-0")
    with pytest.raises(CommandError, match="kind must be"):
        do_erase(world, "everything", "x", sid="9-0")
    assert world.q("SELECT count(*) FROM erasure") == [(1,)]


def test_a_failing_erasure_changes_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    row, _ = world.say(f"x {SECRET}")

    def broken(*_args: object, **_kw: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(erasure, "remove", broken)
    with pytest.raises(sqlite3.OperationalError):
        do_erase(world, "conversation", row.conversation)
    assert world.q("SELECT count(*) FROM erasure") == [(0,)]
    assert world.q("SELECT count(*) FROM erasure_grant") == [(0,)]
    assert fts(world, SECRET) == [row.id]
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        world.store.conn.execute("UPDATE log SET text = ''")


def test_erasure_inside_the_workers_batch(world: World) -> None:
    """The worker applies commands inside its batch transaction: rows appended earlier in the
    same batch are erased too, and reads later in the batch already see the erasure."""
    world.say("before", conversation="matrix:dm-bob")
    assert world.store.recent(5, conversation="matrix:dm-bob")  # conversation cache loaded
    ctx = CommandContext(stream_id="77-0", store=world.store)
    with world.store.transaction():
        msg = InboundMessage(
            channel="matrix",
            session="s",
            conversation="matrix:dm-bob",
            sender="@bob:m.org",
            privacy=Privacy.DIRECT,
            text=f"in batch {SECRET}",
            ts=2.0,
            event_id="e-batch",
        )
        world.identity.append_inbound(world.store, msg, "76-0", is_owner=False)
        result = commands.apply(
            ctx,
            "memory.erase",
            {"kind": "conversation", "target": "matrix:dm-bob", "reason": "asked"},
        )
        assert result["ok"] and result["log_rows"] == 3
        assert all(r.text == "" for r in world.store.recent(10, conversation="matrix:dm-bob"))
        assert all(r.text == "" for r in world.store.recent(10))
    assert all(r.text == "" for r in world.store.recent(10))
    assert fts(world, SECRET) == []
    assert SECRET.encode() not in world.file_bytes()


def test_the_command_checks_its_arguments(world: World) -> None:
    ctx = CommandContext(stream_id="1-0", store=world.store)
    bad = commands.apply(ctx, "memory.erase", {"kind": "conversation", "target": "x"})
    assert not bad["ok"] and "reason" in bad["error"]
    empty = commands.apply(
        ctx, "memory.erase", {"kind": "conversation", "target": "x", "reason": " "}
    )
    assert not empty["ok"] and "needs a reason" in empty["error"]
