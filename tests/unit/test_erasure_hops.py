"""Issue 24, items 6 and 7: erasure follows provenance transitively (a bounded number of hops),
says what it takes and why before it takes it, and keeps what the owner chose to keep.

The worlds are recorded the way the worker records them: an inbound row, its reply with the
provenance of its model input (``extra.drew_on``: memory.provenance), notes written in a turn
(``stream_id``). Memory is checked directly: the rows' text, the notes, the tombstone.
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
from memory.commands import CommandError
from memory.erasure import MAX_HOPS, erase, plan_erasure
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore

SECRET = "zanzibarquux"
_n = itertools.count(1)


class World:
    def __init__(self, path: Path) -> None:
        self.store = MemoryStore(path)
        self.identity = Identity(
            OwnerResolver(["ada", OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )

    def turn(
        self,
        text: str,
        reply: str,
        *,
        channel: str = "matrix",
        sender: str = "@bob:m.org",
        conversation: str = "matrix:dm-bob",
        privacy: Privacy = Privacy.DIRECT,
        drew: DrewOn | None = None,
    ) -> tuple[LogRow, LogRow]:
        n = next(_n)
        msg = InboundMessage(
            kind=Kind.MESSAGE, channel=channel, session=conversation, conversation=conversation,
            sender=sender, sender_name=sender.strip("@").split(":")[0].title(), privacy=privacy,
            text=text, ts=1_795_000_000.0 + n, event_id=f"ev{n}",
        )  # fmt: skip
        sid = f"{channel}/{1_795_000_000_000 + n}-0"
        is_owner = self.identity.resolver.is_owner(channel, sender)
        with self.store.transaction():
            row = self.identity.append_inbound(self.store, msg, sid, is_owner=is_owner)
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
                extra=(drew or DrewOn()).as_extra(),
            )
        return row, out

    def owner_turn(self, text: str, reply: str, **kw: Any) -> tuple[LogRow, LogRow]:
        return self.turn(
            text, reply, sender="@me:m.org", conversation="matrix:dm-me", privacy=Privacy.OWNER,
            **kw,
        )  # fmt: skip

    def terminal(self, text: str, reply: str = "ok") -> tuple[LogRow, LogRow]:
        return self.turn(
            text, reply, channel="cli", sender="ada", conversation="cli:home",
            privacy=Privacy.OWNER,
        )  # fmt: skip

    def note(self, text: str, *, turn: LogRow | None = None, **fields: Any) -> int:
        values: dict[str, Any] = {
            "type": "fact", "topic": "", "text": text, "scope": "shared",
            "visibility": "public", "created_ts": 1_795_000_500.0 + next(_n),
            "stream_id": turn.stream_id if turn is not None else None, **fields,
        }  # fmt: skip
        cols = ", ".join(values)
        with self.store.transaction():
            cur = self.store.conn.execute(
                f"INSERT INTO note ({cols}) VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
        return int(cur.lastrowid or 0)

    def text(self, row_id: int) -> str:
        return str(self.q("SELECT text FROM log WHERE id = ?", row_id)[0][0])

    def notes(self) -> list[int]:
        return [int(r[0]) for r in self.q("SELECT id FROM note ORDER BY id")]

    def q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.store.conn.execute(sql, params).fetchall()

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


def do_erase(
    world: World, kind: str, target: str, keep: list[str] | None = None, sid: str = "cli/9-0"
) -> dict[str, Any]:
    return erase(
        world.store, kind=kind, target=target, reason="asked", requested_by="ada",
        stream_id=sid, keep=keep or [],
    )  # fmt: skip


def hops(detail: dict[str, Any], key: str = "derived") -> dict[tuple[str, int], int]:
    return {(d["kind"], d["id"]): d["hop"] for d in detail.get(key, [])}


# -- item 6: two hops away ------------------------------------------------------------------------


def test_a_reply_that_drew_on_a_derived_reply_or_its_note_is_erased_too(world: World) -> None:
    """The owner's DM reply quoted a terminal secret (hop 1) and wrote a shared note in its
    turn; a contact's later reply was shown that note, and the owner's next reply held the
    first in its history (hop 2 both). Erasing the terminal conversation takes all of them."""
    secret, _ = world.terminal(f"the vault code is {SECRET}")
    asked, r1 = world.owner_turn(
        "what is the vault code?", f"it is {SECRET}", drew=DrewOn(history_from=secret.id)
    )
    note = world.note(f"the vault code is {SECRET}", turn=asked)
    _, r2 = world.turn("any codes?", f"yes: {SECRET}", drew=DrewOn(notes={note}))
    _, r3 = world.owner_turn("and again?", f"again {SECRET}", drew=DrewOn(history_from=r1.id))
    unrelated = world.note("ada likes tea")

    plan = plan_erasure(world.store.conn, "conversation", "cli:home")
    assert plan.derived_ids == sorted([r1.id, r2.id, r3.id])
    result = do_erase(world, "conversation", "cli:home")

    assert all(world.text(r.id) == "" for r in (r1, r2, r3))
    assert world.notes() == [unrelated]
    detail = world.tombstone()
    assert hops(detail) == {("reply", r1.id): 1, ("note", note): 1, ("reply", r2.id): 2,
                            ("reply", r3.id): 2}  # fmt: skip
    assert {d["drew_on"] for d in detail["derived"] if d["id"] == r2.id} == {f"note #{note}"}
    assert detail["hop_bound"] == MAX_HOPS
    assert result["derived_replies"] == 3


def test_the_chain_stops_at_the_bound_and_the_tombstone_says_what_it_left(world: World) -> None:
    secret, _ = world.terminal(f"the vault code is {SECRET}")
    prev = secret
    chain = []
    for i in range(MAX_HOPS + 1):  # each reply's history holds only the one before
        _, reply = world.owner_turn(f"hop {i + 1}?", f"reply {i + 1}",
                                    drew=DrewOn(history_from=prev.id))  # fmt: skip
        chain.append(reply)
        prev = reply
    do_erase(world, "conversation", "cli:home")
    detail = world.tombstone()
    assert hops(detail) == {("reply", r.id): i + 1 for i, r in enumerate(chain[:MAX_HOPS])}
    assert world.text(chain[-1].id) == f"reply {MAX_HOPS + 1}"  # beyond the bound: kept
    assert detail["beyond_bound"] == [chain[-1].id]


def test_a_version_of_a_derived_note_goes_and_replies_shown_it_go_a_hop_later(
    world: World,
) -> None:
    secret, _ = world.terminal(f"the vault code is {SECRET}")
    asked, _ = world.owner_turn("code?", "noted", drew=DrewOn(history_from=secret.id))
    first = world.note(f"vault {SECRET}", turn=asked)
    newer = world.note(f"vault code {SECRET}", supersedes=first)  # written later, elsewhere
    _, shown = world.turn("codes?", f"{SECRET}", drew=DrewOn(notes={newer}))
    do_erase(world, "conversation", "cli:home")
    detail = world.tombstone()
    assert world.notes() == []
    assert hops(detail)[("note", newer)] == 1
    assert hops(detail)[("reply", shown.id)] == 2
    assert world.text(shown.id) == ""


# -- item 7: a preview you can read, and --keep ---------------------------------------------------


def small_talk_and_a_locker_code(world: World) -> tuple[LogRow, LogRow, int, LogRow]:
    """Two messages of small talk with bob; later the owner's turn whose window held them wrote
    an unrelated note (a locker code)."""
    hello, hello_reply = world.turn("nice weather today", "it is lovely")
    _, later = world.owner_turn(
        "remember my locker code 4711", "noted", drew=DrewOn(history_from=hello.id)
    )
    later_in = world.q("SELECT id FROM log WHERE direction = 'in' AND stream_id = ?",
                       later.stream_id)[0][0]  # fmt: skip
    in_row = LogRow(**{**later.__dict__, "id": int(later_in), "direction": "in"})
    locker = world.note("locker code 4711", turn=in_row)
    return hello, hello_reply, locker, later


def test_the_plan_lists_every_reply_and_note_with_its_words_hop_and_source(world: World) -> None:
    hello, _hello_reply, locker, later = small_talk_and_a_locker_code(world)
    plan = plan_erasure(world.store.conn, "conversation", "matrix:dm-bob")
    listed = {(i.kind, i.id): i for i in plan.items}
    assert set(listed) == {("reply", later.id), ("note", locker)}
    note = listed[("note", locker)]
    assert (note.hop, note.words) == (1, "locker code 4711")
    assert note.drew_on == f"log #{hello.id}"  # the erased row its turn's window held
    reply = listed[("reply", later.id)]
    assert (reply.hop, reply.words, reply.drew_on) == (1, "noted", f"log #{hello.id}")


def test_keep_leaves_a_listed_note_and_the_tombstone_records_the_choice(world: World) -> None:
    hello, hello_reply, locker, later = small_talk_and_a_locker_code(world)
    # a reply shown the kept note is not erased because of it
    _, shown = world.turn("locker?", "4711", conversation="matrix:dm-carol", sender="@carol:m.org",
                          drew=DrewOn(notes={locker}))  # fmt: skip
    result = do_erase(world, "conversation", "matrix:dm-bob", keep=[f"note:{locker}"])
    assert world.notes() == [locker]
    assert world.text(hello.id) == "" and world.text(hello_reply.id) == ""
    assert world.text(later.id) == ""  # keeping a note keeps only that note, not its turn's reply
    assert world.text(shown.id) == "4711"
    detail = world.tombstone()
    assert detail["kept"] == [
        {"kind": "note", "id": locker, "hop": 1, "drew_on": f"log #{hello.id}"}
    ]
    assert ("note", locker) not in hops(detail)
    assert result["kept"] == [f"note:{locker}"]


def test_keeping_a_reply_keeps_only_that_reply(world: World) -> None:
    secret, _ = world.terminal(f"the vault code is {SECRET}")
    asked, r1 = world.owner_turn("weather?", "sunny", drew=DrewOn(history_from=secret.id))
    note = world.note(f"vault {SECRET}", turn=asked)  # the same turn's note still goes
    _, r2 = world.owner_turn("more?", "more sun", drew=DrewOn(history_from=r1.id))
    do_erase(world, "conversation", "cli:home", keep=[f"reply:{r1.id}"])
    assert world.text(r1.id) == "sunny"
    assert note not in world.notes()
    # r2 drew on r1 only (kept): nothing erased makes it derived
    assert world.text(r2.id) == "more sun"
    assert world.tombstone()["kept"][0]["id"] == r1.id


def test_keep_of_something_the_erasure_does_not_remove_is_refused(world: World) -> None:
    hello, hello_reply, locker, _later = small_talk_and_a_locker_code(world)
    other = world.note("unrelated")
    for bad, why in (
        (f"note:{other}", "not among"),
        (f"reply:{hello_reply.id}", "the erasure's own"),  # the conversation's own reply
        ("log:1", "reply:ID or note:ID"),
        ("note:x", "reply:ID or note:ID"),
    ):
        with pytest.raises(CommandError, match=why):
            do_erase(world, "conversation", "matrix:dm-bob", keep=[bad])
    assert world.q("SELECT count(*) FROM erasure") == [(0,)]
    assert world.text(hello.id) == "nice weather today" and locker in world.notes()


def test_keeping_a_newer_version_needs_the_older_one_kept_too(world: World) -> None:
    secret, _ = world.terminal(f"the vault code is {SECRET}")
    asked, _ = world.owner_turn("code?", "noted", drew=DrewOn(history_from=secret.id))
    first = world.note(f"vault {SECRET}", turn=asked)
    newer = world.note("the vault moved to the basement", supersedes=first)
    with pytest.raises(CommandError, match=f"note #{newer} supersedes note #{first}"):
        do_erase(world, "conversation", "cli:home", keep=[f"note:{newer}"])
    do_erase(world, "conversation", "cli:home", keep=[f"note:{newer}", f"note:{first}"])
    assert world.notes() == [first, newer]


def test_a_replay_with_keep_answers_from_the_tombstone(world: World) -> None:
    _hello, _r, locker, _later = small_talk_and_a_locker_code(world)
    first = do_erase(world, "conversation", "matrix:dm-bob", keep=[f"note:{locker}"], sid="c/5-0")
    again = do_erase(world, "conversation", "matrix:dm-bob", keep=[f"note:{locker}"], sid="c/5-0")
    assert again == {**first, "replayed": True}


def test_a_note_the_owner_wrote_takes_its_commands_entry_with_it(world: World) -> None:
    """The owner's ``notes supersede`` of a derived note went with it; the command's stream entry
    holds the new version's text: the copies the worker deletes name it."""
    from memory.copies import copies_of

    secret, _ = world.terminal(f"the vault code is {SECRET}")
    asked, _ = world.owner_turn("code?", "noted", drew=DrewOn(history_from=secret.id))
    first = world.note(f"vault {SECRET}", turn=asked)
    world.note(f"vault code {SECRET}", supersedes=first, op_key="cmd:cli/1795000000999-0",
               stream_id="cli/1795000000999-0", author="owner")  # fmt: skip
    result = do_erase(world, "conversation", "cli:home")
    assert world.notes() == []
    assert "cli/1795000000999-0" in copies_of(world.store.conn, result["erasure"]).entries
