"""Erasure reaches scheduled items (memory/schedule_erasure.py, memory/erasure_plan.py).

Erasing a conversation or a person ends their items for good (``erased``, text blanked) and
erases the log rows of those items' occurrences (recorded with the scheduler as the sender, so a
person's own rows alone would miss them), with the cascade for what drew on them; an item set in
a turn that goes (a message erased by id, a derived reply's turn) goes at that hop. Nothing of
the text is left in memory (tables, full-text indexes, files), the tombstone and the command's
answer list the items, and a restored backup that still holds them has them erased again.

The worlds are recorded the way the worker records them: an inbound row and its reply (with
what its model input drew on), an item added by the turn that set it, and each occurrence as
the worker's scheduled path records it (kind ``scheduled``, sender ``scheduler``, event id
``schedule:<id>:<occurrence>``, the item's conversation and privacy) with its run.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Kind, Privacy, Reply, ReplyKind
from memory import commands, schedule
from memory.backup import restore, snapshot
from memory.command_types import CommandContext
from memory.copies import copies_of
from memory.erasure import plan_erasure
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.schedule import Item
from memory.schedule_erasure import occurrence_rows
from memory.store import MemoryStore
from relaybot.cli_erase import render_preview, render_receipt

SECRET = "zanzibarquux"
T0 = 1_800_000_000
_n = itertools.count(1)


class World:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = MemoryStore(path)
        self.identity = Identity(
            OwnerResolver(["ada", OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )

    def _record(
        self, msg: InboundMessage, sid: str, reply: str | None, drew: DrewOn | None
    ) -> tuple[LogRow, LogRow | None]:
        is_owner = self.identity.resolver.is_owner(msg.channel, msg.sender)
        with self.store.transaction():
            row = self.identity.append_inbound(self.store, msg, sid, is_owner=is_owner)
            out = None
            if reply is not None:
                out = self.store.append_reply(
                    Reply(
                        reply_id=f"r-{sid}", answers=sid, kind=ReplyKind.REPLY,
                        channel=msg.channel, session=msg.session, conversation=msg.conversation,
                        text=reply, created=msg.ts + 1,
                    ),
                    sender="relaybot",
                    privacy=msg.privacy,
                    extra=(drew or DrewOn()).as_extra(),
                )  # fmt: skip
        return row, out

    def turn(
        self,
        text: str,
        reply: str = "ok",
        *,
        sender: str = "@bob:m.org",
        conversation: str = "matrix:dm-bob",
        privacy: Privacy = Privacy.DIRECT,
        channel: str = "matrix",
        drew: DrewOn | None = None,
    ) -> tuple[LogRow, LogRow]:
        n = next(_n)
        msg = InboundMessage(
            kind=Kind.MESSAGE, channel=channel, session=conversation, conversation=conversation,
            sender=sender, sender_name=sender.strip("@").split(":")[0].title(), privacy=privacy,
            text=text, ts=T0 - 10_000.0 + n, event_id=f"ev{n}",
        )  # fmt: skip
        row, out = self._record(msg, f"{T0 * 1000 + n}-0", reply, drew)
        assert out is not None
        return row, out

    def set_item(self, turn: LogRow, text: str, **over: Any) -> Item:
        """What the ``schedule`` tool stores in the turn of ``turn``."""
        fields: dict[str, Any] = {
            "created": turn.recorded_ts, "created_by": turn.stream_id,
            "setter_entity": turn.entity, "setter": turn.sender, "channel": turn.channel,
            "session": turn.session, "conversation": turn.conversation,
            "privacy": turn.privacy, "text": text, "first_due": T0 + next(_n), "cron": None,
            "until": None, "late": "deliver", "grace": 900.0, "zone": "UTC", **over,
        }  # fmt: skip
        with self.store.transaction():
            item, added = schedule.add(self.store.conn, **fields)
        assert added
        return item

    def fire(
        self, item: Item, reply: str | None = None, *, drew: DrewOn | None = None
    ) -> tuple[LogRow, LogRow | None]:
        """An occurrence of ``item`` as the worker records it, answered with ``reply``."""
        now = schedule.get(self.store.conn, item.id)
        assert now is not None and now.next_due is not None
        occ = now.next_due
        msg = InboundMessage(
            kind=Kind.SCHEDULED, channel=item.channel, session=item.session,
            conversation=item.conversation, sender="scheduler", sender_name="scheduler",
            privacy=Privacy(item.privacy), text=f"Reminder #{item.id} (set by {item.setter}): "
            f"{item.text}", ts=float(occ), event_id=schedule.event_id(item.id, occ),
            extra={"type": "occurrence", "item": item.id, "occurrence": occ},
        )  # fmt: skip
        sid = f"{occ * 1000}-{item.id}"
        row, out = self._record(msg, sid, reply if reply is not None else f"⏰ {item.text}", drew)
        with self.store.transaction():
            nxt = occ + 86400 if item.recurring else None
            assert schedule.record_run(
                self.store.conn, item.id, occ, outcome="delivered", stream_id=sid,
                at=float(occ), next_due=nxt,
            )  # fmt: skip
        return row, out

    def item(self, item_id: int) -> Item:
        found = schedule.get(self.store.conn, item_id)
        assert found is not None
        return found

    def text(self, row_id: int) -> str:
        return str(self.q("SELECT text FROM log WHERE id = ?", row_id)[0][0])

    def q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.store.conn.execute(sql, params).fetchall()

    def fts(self, word: str) -> list[int]:
        return [r[0] for r in self.q("SELECT rowid FROM log_fts WHERE log_fts MATCH ?", word)]

    def everywhere(self, word: str) -> list[str]:
        """Every table (full-text shadow tables too) whose rows hold ``word``, and the files."""
        found = []
        tables = [r[0] for r in self.q("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in self.q(f'SELECT * FROM "{table}"'):
                for value in row:
                    if (isinstance(value, str) and word in value) or (
                        isinstance(value, bytes) and word.encode() in value
                    ):
                        found.append(table)
        self.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for path in self.path.parent.iterdir():
            if path.name.startswith(self.path.name) and word.encode() in path.read_bytes():
                found.append(path.name)
        return found

    def erase(self, kind: str, target: str, sid: str = "1899999999999-0") -> dict[str, Any]:
        ctx = CommandContext(stream_id=sid, store=self.store)
        args = {"kind": kind, "target": target, "reason": "asked", "requested_by": "ada"}
        result = commands.apply(ctx, "memory.erase", args)
        assert result["ok"], result
        self.erased_texts = ctx.erased_texts
        return result

    def tombstone(self) -> dict[str, Any]:
        (raw,) = self.q("SELECT detail FROM erasure ORDER BY id DESC LIMIT 1")[0]
        detail = json.loads(raw)
        assert isinstance(detail, dict)
        return detail


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "memory.sqlite3")
    yield w
    w.store.close()


def _erased(item: Item) -> bool:
    return (item.status, item.text, item.next_due, item.end_reason) == ("erased", "", None,
                                                                         "erased")  # fmt: skip


# -- a conversation -------------------------------------------------------------------------


def test_erasing_a_conversation_ends_its_items_and_erases_their_occurrences(
    world: World,
) -> None:
    said, _ = world.turn(f"remind me: the {SECRET} pill at nine")
    pill = world.set_item(said, f"take the {SECRET} pill", cron="0 9 * * *")
    occ_row, occ_reply = world.fire(pill)
    assert occ_reply is not None
    # an item the owner set there from the terminal (an owner command: cmd:<its stream id>)
    by_owner = world.set_item(
        said, f"ask bob about {SECRET}", created_by=schedule.command_key("77-0"),
        setter_entity="owner", setter="ada",
    )  # fmt: skip
    mine, _ = world.turn("buy milk", sender="ada", channel="cli", conversation="cli:home",
                         privacy=Privacy.OWNER)  # fmt: skip
    milk = world.set_item(mine, "buy milk")
    before = world.everywhere(SECRET)
    assert {"log", "scheduled", "log_fts_data"} <= set(before), before

    result = world.erase("conversation", "matrix:dm-bob")

    assert _erased(world.item(pill.id)) and _erased(world.item(by_owner.id))
    assert world.item(pill.id).fired == 1  # what it did stays (no text in it)
    assert world.item(milk.id).active and world.item(milk.id).text == "buy milk"
    assert world.text(occ_row.id) == "" and world.text(occ_reply.id) == ""
    assert world.everywhere(SECRET) == [] and world.fts("pill") == []
    # nothing of them is due, or asks for a job, any more
    assert schedule.needs_job(world.store.conn) == [(milk.id, milk.first_due)]
    assert [i.id for i in schedule.listing(world.store.conn)] == [milk.id]
    # the receipt and the tombstone list them (no text); the command's entry is a copy
    assert [(s["id"], s["hop"]) for s in result["scheduled"]] == [(pill.id, 0), (by_owner.id, 0)]
    detail = world.tombstone()
    assert detail["scheduled_ids"] == [pill.id, by_owner.id]
    assert detail["scheduled_keys"] == [[pill.id, said.stream_id], [by_owner.id, "cmd:77-0"]]
    assert occ_row.id in detail["log_ids"] and SECRET not in json.dumps(detail)
    copies = copies_of(world.store.conn, result["erasure"])
    assert "77-0" in copies.entries and occ_row.stream_id in copies.entries
    texts = world.erased_texts[result["erasure"]]
    assert f"take the {SECRET} pill" in texts and f"ask bob about {SECRET}" in texts
    receipt = render_receipt("conversation", "matrix:dm-bob", result)
    assert f"scheduled:     2 items cancelled, text blanked: #{pill.id} (hop 0)" in receipt


def test_a_replayed_turn_does_not_bring_an_erased_item_back(world: World) -> None:
    said, _ = world.turn(f"remind me of {SECRET}")
    item = world.set_item(said, f"the {SECRET} thing", first_due=T0 + 5)
    world.erase("conversation", "matrix:dm-bob")
    with world.store.transaction():
        again, added = schedule.add(
            world.store.conn, created=T0, created_by=said.stream_id, setter_entity=said.entity,
            setter=said.sender, channel="matrix", session="matrix:dm-bob",
            conversation="matrix:dm-bob", privacy="direct", text=f"the {SECRET} thing",
            first_due=T0 + 5, cron=None, until=None, late="deliver", grace=60.0, zone="UTC",
        )  # fmt: skip
    assert (again.id, added, again.status) == (item.id, False, "erased")
    assert world.everywhere(SECRET) == []


def test_a_conversation_with_nothing_but_an_item_is_erased(world: World) -> None:
    said, _ = world.turn("hello", sender="ada", channel="cli", conversation="cli:home",
                         privacy=Privacy.OWNER)  # fmt: skip
    # the owner set it from the terminal into a room no message was recorded in yet
    item = world.set_item(
        said, f"post the {SECRET} agenda", created_by="cmd:5-0", conversation="matrix:new-room",
        session="matrix:new-room", channel="matrix", privacy="group",
    )  # fmt: skip
    plan = plan_erasure(world.store.conn, "conversation", "matrix:new-room")
    assert not plan.empty and plan.log_ids == [] and plan.scheduled_ids == [item.id]
    world.erase("conversation", "matrix:new-room")
    assert _erased(world.item(item.id)) and world.everywhere(SECRET) == []


# -- a person -------------------------------------------------------------------------------


def test_erasing_a_person_ends_the_items_they_set_anywhere(world: World) -> None:
    in_room, _ = world.turn(f"remind us about {SECRET} friday", conversation="matrix:room",
                            privacy=Privacy.GROUP)  # fmt: skip
    group_item = world.set_item(in_room, f"{SECRET} on friday, everyone")
    occ_row, occ_reply = world.fire(group_item)
    assert occ_reply is not None
    in_dm, _ = world.turn(f"and me about {SECRET} monday")
    dm_item = world.set_item(in_dm, f"{SECRET} on monday")
    # Carol's item in the same room, fired by the same scheduler entity: kept
    carol, _ = world.turn("remind us of lunch", sender="@carol:m.org",
                          conversation="matrix:room", privacy=Privacy.GROUP)  # fmt: skip
    lunch = world.set_item(carol, "lunch at noon")
    lunch_row, _ = world.fire(lunch)
    # a later reply in the room whose history held the occurrence: derived from it
    later, later_reply = world.turn(
        "what was that reminder?", sender="@carol:m.org", conversation="matrix:room",
        privacy=Privacy.GROUP, reply=f"it said {SECRET}",
        drew=DrewOn(history_from=occ_row.id),
    )  # fmt: skip
    assert occ_row.entity is not None and occ_row.entity == lunch_row.entity  # the scheduler's

    plan = plan_erasure(world.store.conn, "entity", "matrix:@bob:m.org")
    assert plan.scheduled_ids == [group_item.id, dm_item.id]
    assert occ_row.id in plan.log_ids and plan.occurrences == {occ_row.id: 0}
    preview = render_preview(plan)
    assert "2 scheduled items" in preview and f"scheduled:{group_item.id}" in preview

    result = world.erase("entity", "matrix:@bob:m.org")

    assert _erased(world.item(group_item.id)) and _erased(world.item(dm_item.id))
    assert world.item(lunch.id).text == "lunch at noon"
    assert world.text(occ_row.id) == "" and world.text(occ_reply.id) == ""
    assert world.text(later_reply.id) == ""  # drew on the occurrence (hop 1)
    assert world.text(later.id) == "what was that reminder?"  # Carol's own words stay
    assert world.text(lunch_row.id).endswith("lunch at noon")
    assert world.everywhere(SECRET) == []
    assert {(s["id"], s["hop"], s["drew_on"]) for s in result["scheduled"]} == {
        (group_item.id, 0, "entity matrix:@bob:m.org"),
        (dm_item.id, 0, "entity matrix:@bob:m.org"),
    }
    assert {d["id"] for d in result["derived"] if d["kind"] == "reply"} >= {
        occ_reply.id, later_reply.id,
    }  # fmt: skip


def test_an_item_stored_without_an_entity_is_found_by_the_setters_handle(world: World) -> None:
    said, _ = world.turn(f"ping me about {SECRET}")
    item = world.set_item(said, f"{SECRET} ping", setter_entity=None, created_by="elsewhere-1")
    world.erase("entity", "matrix:@bob:m.org")
    assert _erased(world.item(item.id)) and world.everywhere(SECRET) == []


# -- items set in a turn that goes ----------------------------------------------------------


def test_an_item_set_in_a_derived_turn_goes_at_that_hop(world: World) -> None:
    carol, _ = world.turn(f"my {SECRET} surgery is friday", sender="@carol:m.org",
                          conversation="matrix:room", privacy=Privacy.GROUP)  # fmt: skip
    # the owner asks in the room; the model's input held Carol's message, and it set an item
    ask, _ = world.turn(
        "remind me to ask her how it went", sender="@me:m.org", conversation="matrix:room",
        privacy=Privacy.GROUP, drew=DrewOn(history_from=carol.id),
    )  # fmt: skip
    derived_item = world.set_item(ask, f"ask Carol how the {SECRET} surgery went")
    occ_row, occ_reply = world.fire(derived_item)
    assert occ_reply is not None
    unrelated = world.set_item(ask, "unrelated, set in an earlier turn", created_by="other-0")

    result = world.erase("entity", "matrix:@carol:m.org")

    assert _erased(world.item(derived_item.id)) and world.item(unrelated.id).active
    assert [(s["id"], s["hop"]) for s in result["scheduled"]] == [(derived_item.id, 1)]
    assert world.text(occ_row.id) == "" and world.text(occ_reply.id) == ""
    hops = {d["id"]: d["hop"] for d in result["derived"]}
    assert hops[occ_reply.id] == 2  # the reply that delivered it: the hop after the item
    assert world.text(ask.id) == "remind me to ask her how it went"  # the owner's words stay
    assert world.everywhere(SECRET) == []
    # Carol's message and its answer, the reply that drew on it, the occurrence and its reply
    assert result["log_rows"] == 5


def test_erasing_the_message_that_set_an_item_takes_the_item(world: World) -> None:
    said, _ = world.turn(f"remind me about the {SECRET} call")
    item = world.set_item(said, f"the {SECRET} call")
    occ_row, _ = world.fire(item)
    result = world.erase("id", str(said.id))
    assert _erased(world.item(item.id)) and world.text(occ_row.id) == ""
    assert [(s["id"], s["hop"]) for s in result["scheduled"]] == [(item.id, 1)]
    assert world.everywhere(SECRET) == []


# -- a restore applies the erasure again ----------------------------------------------------


def test_a_restored_backup_has_the_items_erased_again(world: World, tmp_path: Path) -> None:
    said, _ = world.turn(f"remind me: {SECRET}")
    item = world.set_item(said, f"{SECRET} reminder")
    occ_row, _ = world.fire(item)
    keep_row, _ = world.turn("milk", sender="ada", channel="cli", conversation="cli:home",
                             privacy=Privacy.OWNER)  # fmt: skip
    kept = world.set_item(keep_row, "buy milk")
    backup = snapshot(world.path, tmp_path / "backup.sqlite3")
    world.erase("conversation", "matrix:dm-bob")
    world.store.close()

    done = restore(backup.path, world.path)

    assert len(done.reapplied) == 1
    with MemoryStore(world.path) as store:
        back = schedule.get(store.conn, item.id)
        assert back is not None and _erased(back)
        still = schedule.get(store.conn, kept.id)
        assert still is not None and still.text == "buy milk" and still.active
        (text,) = store.conn.execute("SELECT text FROM log WHERE id = ?", (occ_row.id,)).fetchone()
        assert text == ""
    world.store = MemoryStore(world.path)
    assert world.everywhere(SECRET) == []


def test_occurrence_rows_by_event_id_and_by_run(world: World) -> None:
    said, _ = world.turn("set them")
    items = [world.set_item(said, f"item {n}") for n in range(12)]
    first, twelfth = items[0], items[11]
    assert str(twelfth.id).startswith(str(first.id))  # schedule:1:… is a prefix of schedule:12:…
    row_1, _ = world.fire(first)
    row_12, _ = world.fire(twelfth)
    assert occurrence_rows(world.store.conn, [first.id]) == {row_1.id: ("in", row_1.stream_id)}
    assert set(occurrence_rows(world.store.conn, [twelfth.id])) == {row_12.id}
    # a row its run names is one of its occurrences, whatever its event id says
    other, _ = world.turn("recorded elsewhere")
    with world.store.transaction():
        world.store.conn.execute(
            "INSERT INTO scheduled_runs (item, occurrence, outcome, stream_id, at) "
            "VALUES (?, 1, 'delivered', ?, 1.0)",
            (items[2].id, other.stream_id),
        )
    assert set(occurrence_rows(world.store.conn, [items[2].id])) == {other.id}
    assert occurrence_rows(world.store.conn, [items[3].id, 999]) == {}
