"""Replies derived from erased text are erased with it (memory/derived.py, memory.provenance).

A reply is derived from a row when its model input held the row: the row lies in the reply's
history span and its conversation could see it, or a tool showed it; from a note when the
context or recall showed the note. Replies that could not have seen the row stay.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Kind, Privacy, Reply, ReplyKind
from memory import commands
from memory.commands import CommandContext
from memory.erasure import erase, plan_erasure
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.import_file import parse_file
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore
from relaybot.import_parts import command_args

SECRET = "zanzibarquux"
_n = itertools.count(1)


class World:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = MemoryStore(path)
        self.identity = Identity(
            OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )

    def turn(
        self,
        text: str,
        reply: str,
        *,
        sender: str = "@bob:m.org",
        conversation: str = "matrix:dm-bob",
        privacy: Privacy = Privacy.DIRECT,
        drew: DrewOn | None = None,
    ) -> tuple[LogRow, LogRow]:
        n = next(_n)
        msg = InboundMessage(
            kind=Kind.MESSAGE,
            channel="matrix",
            session=conversation,
            conversation=conversation,
            sender=sender,
            sender_name=sender.strip("@").split(":")[0].title(),
            privacy=privacy,
            text=text,
            ts=1_795_000_000.0 + n,
            event_id=f"ev{n}",
        )
        sid = f"matrix/{1_795_000_000_000 + n}-0"
        is_owner = self.identity.resolver.is_owner("matrix", sender)
        with self.store.transaction():
            row = self.identity.append_inbound(self.store, msg, sid, is_owner=is_owner)
            out = self.store.append_reply(
                Reply(
                    reply_id=f"r{n}",
                    answers=sid,
                    kind=ReplyKind.REPLY,
                    channel="matrix",
                    session=conversation,
                    conversation=conversation,
                    text=reply,
                    created=msg.ts + 1,
                ),
                sender="relaybot",
                privacy=privacy,
                extra=(drew or DrewOn()).as_extra(),
            )
        return row, out

    def note(self, text: str, stream_id: str | None = None, **fields: str) -> int:
        with self.store.transaction():
            cur = self.store.conn.execute(
                "INSERT INTO note (type, topic, text, scope, visibility, created_ts, stream_id, "
                "source_conversation) VALUES ('fact', '', ?, 'chat', 'private', ?, ?, ?)",
                (text, 1_795_000_500.0 + next(_n), stream_id, fields.get("source_conversation")),
            )
        return int(cur.lastrowid or 0)

    def text(self, row_id: int) -> str:
        return str(
            self.store.conn.execute("SELECT text FROM log WHERE id = ?", (row_id,)).fetchone()[0]
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "memory.sqlite3")
    yield w
    w.store.close()


def erase_id(world: World, row_id: int) -> dict[str, object]:
    return erase(
        world.store,
        kind="id",
        target=str(row_id),
        reason="asked",
        requested_by="ada",
        stream_id="cli/1795999999999-0",
    )


def test_a_reply_whose_history_held_the_text_is_erased_one_that_could_not_see_it_stays(
    world: World,
) -> None:
    before, before_reply = world.turn("hello", "hi bob")
    secret, _secret_reply = world.turn(f"my pin is {SECRET}", "noted")
    # the owner's own conversation sees everything: its history span covers the secret
    _, owner_reply = world.turn(
        "what did bob say?",
        f"bob said his pin is {SECRET}",
        sender="@me:m.org",
        conversation="matrix:dm-me",
        privacy=Privacy.OWNER,
        drew=DrewOn(history_from=before.id),
    )
    # a group's span covers the secret's id, but the group could never see bob's DM
    _, group_reply = world.turn(
        "hello all",
        "hello group",
        sender="@carol:m.org",
        conversation="matrix:room",
        privacy=Privacy.GROUP,
        drew=DrewOn(history_from=before.id),
    )
    # bob's own DM, later: its history held his own message
    _, dm_reply = world.turn(
        "what is my pin?", f"it is {SECRET}", drew=DrewOn(history_from=secret.id)
    )
    # a span that starts after the secret did not hold it, but held a reply that did: derived
    # at the second hop (memory/erasure_plan.py)
    _, late_reply = world.turn("bye", "bye bob", drew=DrewOn(history_from=dm_reply.id))
    # a span that holds neither
    bye_again = world.turn("bye again", "see you", drew=None)[1]

    plan = plan_erasure(world.store.conn, "id", str(secret.id))
    assert plan.derived_ids == sorted([owner_reply.id, dm_reply.id, late_reply.id])
    assert {i.id: i.hop for i in plan.items if i.kind == "reply"} == {
        _secret_reply.id: 1,
        owner_reply.id: 1,
        dm_reply.id: 1,
        late_reply.id: 2,
    }
    result = erase_id(world, secret.id)
    assert result["derived_replies"] == 3
    assert world.text(owner_reply.id) == "" and world.text(dm_reply.id) == ""
    assert world.text(late_reply.id) == ""
    assert world.text(group_reply.id) == "hello group"
    assert world.text(bye_again.id) == "see you"
    assert world.text(before.id) == "hello" and world.text(before_reply.id) == "hi bob"
    assert (
        SECRET.encode()
        not in b"".join(p.read_bytes() for p in world.path.parent.iterdir() if p.is_file())
        or not world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    )


def test_a_reply_a_tool_showed_the_text_to_is_erased_in_any_conversation(world: World) -> None:
    secret, _ = world.turn(f"my pin is {SECRET}", "noted")
    _, searched = world.turn(
        "search it",
        f"found: {SECRET}",
        sender="@carol:m.org",
        conversation="matrix:room",
        privacy=Privacy.GROUP,
        drew=DrewOn(rows={secret.id}),  # a tool showed it (had the rule failed, say)
    )
    result = erase_id(world, secret.id)
    assert result["derived_replies"] == 1 and world.text(searched.id) == ""


def test_a_reply_that_showed_an_erased_note_is_erased_and_so_are_notes_of_derived_turns(
    world: World,
) -> None:
    secret, _ = world.turn(f"my pin is {SECRET}", "noted")
    learned = world.note(f"bob's pin is {SECRET}", stream_id=secret.stream_id)
    recalled_in, recalled = world.turn(
        "what is bob's pin?",
        f"it is {SECRET}",
        sender="@me:m.org",
        conversation="matrix:dm-me",
        privacy=Privacy.OWNER,
        drew=DrewOn(notes={learned}),
    )
    copied = world.note(f"remember: {SECRET}", stream_id=recalled_in.stream_id)
    other = world.note("ada likes tea", source_conversation="matrix:dm-me")
    plan = plan_erasure(world.store.conn, "id", str(secret.id))
    assert plan.derived_ids == [recalled.id]
    assert plan.note_ids == sorted([learned, copied])
    erase_id(world, secret.id)
    assert world.text(recalled.id) == ""
    left = [r[0] for r in world.store.conn.execute("SELECT id FROM note")]
    assert left == [other]


def test_provenance_reads_back_leniently() -> None:
    drew = DrewOn(history_from=5, rows={3, 1}, notes={9})
    assert DrewOn.from_extra(drew.as_extra()) == drew
    assert DrewOn().as_extra() == {}
    assert DrewOn.from_extra({"drew_on": {"from": "x", "rows": [1, "2", True, -3]}}) == DrewOn(
        rows={1}
    )
    assert DrewOn.from_extra({"drew_on": []}) == DrewOn()


def test_the_context_tells_what_it_held(world: World, tmp_path: Path) -> None:
    """memory.context records the oldest history row that fit the budget (not the oldest row it
    read) and the notes its notes section showed."""
    from contract.config import Config, WorkerConfig
    from memory.facade import Memory
    from memory.privacy import Scope
    from worker.turn import memory_settings

    rows = [world.turn(f"message number {i} " + "words " * 40, "ok")[0] for i in range(12)]
    with world.store.transaction():  # a note kept for bob's conversation
        note = int(
            world.store.conn.execute(
                "INSERT INTO note (type, topic, text, scope, visibility, chat, "
                "source_conversation, source_privacy, created_ts) VALUES ('fact', '', "
                "'the zanzibarquux gate code', 'chat', 'internal', 'matrix:dm-bob', "
                "'matrix:dm-bob', 'direct', 1.0)"
            ).lastrowid
            or 0
        )
    cfg = Config(home=tmp_path, worker=WorkerConfig(context_tokens=600))
    memory = Memory(world.store, memory_settings(cfg))
    current = world.turn("what about zanzibarquux?", "?")[0]
    msg = InboundMessage(
        channel="matrix", session="matrix:dm-bob", conversation="matrix:dm-bob",
        sender="@bob:m.org", privacy=Privacy.DIRECT, text=current.text, ts=1.0, event_id="x",
    )  # fmt: skip
    drew = DrewOn()
    memory.context(msg, current, Scope("matrix:dm-bob", Privacy.DIRECT, current.entity), drew)
    assert rows[0].id < drew.history_from < current.id  # the budget cut the oldest rows off
    held = [r for r in rows if r.id >= drew.history_from]
    assert held and len(held) < len(rows)
    assert drew.notes == {note}  # bob's own conversation's note, shown in the notes section


def test_a_history_span_is_in_time_order_when_imported_rows_came_later(world: World) -> None:
    """An imported history's older rows have higher ids: a context that starts at one of them
    holds the live rows after it in time, whatever their ids (issue 13: the log's time order)."""
    secret, _ = world.turn(f"my pin is {SECRET}", "noted")
    line = json.dumps(
        {
            "role": "user",
            "content": "an old note",
            "timestamp": "2025-01-01T10:00:00Z",
            "channel": "matrix",
            "sender_id": "@me:m.org",
        }
    )
    parsed = parse_file(iter([line]), resolver=world.identity.resolver)
    for args in command_args(parsed.items, fmt=parsed.format):
        with world.store.transaction():
            commands.apply(
                CommandContext("cli/1795999999998-0", world.store), "memory.import", args
            )
    (old,) = world.store.conn.execute("SELECT id FROM log WHERE text = 'an old note'").fetchone()
    assert old > secret.id  # imported later: a higher id, an older time
    _, owner_reply = world.turn(
        "what do you know?",
        f"bob's pin is {SECRET}",
        sender="@me:m.org",
        conversation="matrix:dm-me",
        privacy=Privacy.OWNER,
        drew=DrewOn(history_from=old),  # the context began with the old note: oldest in time
    )
    assert erase_id(world, secret.id)["derived_replies"] == 1
    assert world.text(owner_reply.id) == ""


def test_erasing_a_message_erases_its_edits_too(world: World) -> None:
    original, _ = world.turn("my pin is 0000", "noted")
    n = next(_n)
    edit = InboundMessage(
        kind=Kind.MESSAGE, channel="matrix", session="matrix:dm-bob",
        conversation="matrix:dm-bob", sender="@bob:m.org", privacy=Privacy.DIRECT,
        text=f"[edit of an earlier message] my pin is {SECRET}", ts=1_795_000_000.0 + n,
        event_id=f"ev{n}", extra={"edit_of": original.event_id, "no_reply": True},
    )  # fmt: skip
    with world.store.transaction():
        row = world.identity.append_inbound(
            world.store, edit, f"matrix/{1_795_000_000_000 + n}-0", is_owner=False
        )
    erase_id(world, original.id)
    assert world.text(row.id) == ""  # the edit repeated the text: it goes with it
