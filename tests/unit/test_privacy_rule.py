"""The privacy rule over the log: owner, direct (per person, across linked handles), group, none.

Every case is checked three ways that must agree: :func:`visible_history` (context building),
:func:`log_visibility_sql` (search and tools) and :func:`log_row_visible` (one row in Python).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Privacy
from memory import commands
from memory.commands import CommandContext
from memory.identity import OWNER, OwnerResolver
from memory.identity_writer import Identity
from memory.privacy import (
    PAGE_ROWS,
    Scope,
    direct_person,
    log_row_visible,
    log_visibility_sql,
    persons_for,
    visible_history,
)
from memory.rows import LogRow
from memory.store import MemoryStore
from tests.support.turns import record_turn

OWNER_CONV = "cli:local"
BOB_DM = "matrix:dm-bob"
BOB_MAIL = "email:thread-bob"
CAROL_DM = "matrix:dm-carol"
TEAM = "matrix:team"

_n = itertools.count(1)


class World:
    """A memory with the owner, Bob (Matrix and e-mail handles), Carol and Alice."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.identity = Identity(
            OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )
        self.entities: dict[str, str] = {}

    def say(self, conversation: str, sender: str, text: str, privacy: Privacy) -> LogRow:
        with self.store.transaction():
            row = record_turn(
                self.store,
                self.identity,
                next(_n),
                conversation=conversation,
                sender=sender,
                text=text,
                privacy=privacy,
            )
        assert row.entity is not None
        self.entities[sender] = row.entity
        return row

    def command(self, op: str, a: str, b: str) -> dict[str, Any]:
        context = CommandContext(stream_id=f"{next(_n)}-9", store=self.store)
        with self.store.transaction():
            return commands.apply(context, op, {"a": a, "b": b})


def populate(world: World) -> None:
    world.say(OWNER_CONV, "me", "owner private: my PIN is 9911", Privacy.OWNER)
    world.say(BOB_DM, "@bob:m.org", "bob dm: the vault code is QX-5531", Privacy.DIRECT)
    world.say(BOB_MAIL, "bob@example.org", "bob mail: hello from my mailbox", Privacy.DIRECT)
    world.say(CAROL_DM, "@carol:m.org", "carol dm: my salary is 80k", Privacy.DIRECT)
    world.say(TEAM, "@alice:m.org", "team: alice says the standup moves", Privacy.GROUP)
    world.say(TEAM, "@bob:m.org", "team: bob agrees in public", Privacy.GROUP)
    world.say(TEAM, "@me:m.org", "team: the owner speaks in the room", Privacy.GROUP)
    world.say(BOB_DM, "@bob:m.org", "bob dm: also my diary password is hunter2", Privacy.DIRECT)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with MemoryStore(tmp_path / "memory.sqlite3", cache_rows=64) as store:
        w = World(store)
        populate(w)
        yield w


def seen(world: World, scope: Scope) -> list[LogRow]:
    """What the scope sees, checked three ways for agreement."""
    store = world.store
    via_history = list(visible_history(store, scope, limit=10_000))
    persons = persons_for(store, scope)
    where, params = log_visibility_sql(scope, persons=persons)
    ids = [
        int(r[0])
        for r in store.conn.execute(
            f"SELECT id FROM log WHERE {where} ORDER BY id DESC",
            params,
        )
    ]
    assert [r.id for r in via_history] == ids
    everything = store.recent(10_000)
    assert [r for r in everything if log_row_visible(scope, r, persons=persons)] == via_history
    return via_history


def texts(rows: list[LogRow]) -> str:
    return "\n".join(r.text for r in rows)


def bob_mail(world: World) -> Scope:
    return Scope(BOB_MAIL, Privacy.DIRECT, world.entities["bob@example.org"])


# -- owner and group ---------------------------------------------------------------------------


def test_the_owner_sees_everything(world: World) -> None:
    rows = seen(world, Scope(OWNER_CONV, Privacy.OWNER, OWNER))
    assert rows == world.store.recent(10_000)
    assert len(rows) == 16


def test_a_group_sees_itself_and_nothing_said_in_direct_conversations(world: World) -> None:
    for entity in (None, world.entities["@bob:m.org"], OWNER):
        rows = seen(world, Scope(TEAM, Privacy.GROUP, entity))
        assert {r.conversation for r in rows} == {TEAM}
        assert len(rows) == 6
        assert "QX-5531" not in texts(rows)
        assert "9911" not in texts(rows)


# -- direct: per person ------------------------------------------------------------------------


def test_a_direct_conversation_before_any_link_sees_only_itself_and_its_persons_words(
    world: World,
) -> None:
    rows = seen(world, bob_mail(world))
    assert {r.conversation for r in rows} == {BOB_MAIL}
    # Bob on Matrix sees what Bob said on Matrix anywhere (his DM and the room), not the others
    bob_matrix = Scope(BOB_DM, Privacy.DIRECT, world.entities["@bob:m.org"])
    rows = seen(world, bob_matrix)
    assert {r.conversation for r in rows} == {BOB_DM, TEAM}
    outside = [r for r in rows if r.conversation != BOB_DM]
    assert [r.text for r in outside] == ["team: bob agrees in public"]
    assert all(r.direction == "in" and r.entity == world.entities["@bob:m.org"] for r in outside)


def test_a_suggested_link_shares_nothing(world: World) -> None:
    result = world.command("entities.suggest", "matrix:@bob:m.org", "email:bob@example.org")
    assert result["ok"] and result["status"] == "suggested"
    rows = seen(world, bob_mail(world))
    assert {r.conversation for r in rows} == {BOB_MAIL}
    assert "QX-5531" not in texts(rows)


def test_a_verified_link_shares_what_that_person_said_and_only_that(world: World) -> None:
    assert world.command("entities.link", "matrix:@bob:m.org", "email:bob@example.org")["ok"]
    rows = seen(world, bob_mail(world))
    text = texts(rows)
    assert "QX-5531" in text and "hunter2" in text  # Bob's own words on Matrix
    assert "team: bob agrees in public" in text
    for hidden in ("9911", "80k", "alice says", "owner speaks", "reply to bob dm"):
        assert hidden not in text, hidden
    others = [r for r in rows if r.conversation != BOB_MAIL]
    assert others and all(r.direction == "in" for r in others)
    assert len(rows) == 2 + 3  # its own exchange, Bob's three inbound rows on Matrix
    # unlinked: back to itself
    assert world.command("entities.unlink", "@bob:m.org", "bob@example.org")["ok"]
    assert {r.conversation for r in seen(world, bob_mail(world))} == {BOB_MAIL}


def test_another_persons_direct_conversation_never_sees_bob(world: World) -> None:
    assert world.command("entities.link", "matrix:@bob:m.org", "email:bob@example.org")["ok"]
    rows = seen(world, Scope(CAROL_DM, Privacy.DIRECT, world.entities["@carol:m.org"]))
    assert {r.conversation for r in rows} == {CAROL_DM}


def test_the_owner_is_never_the_person_of_a_direct_conversation(world: World) -> None:
    scope = Scope(BOB_MAIL, Privacy.DIRECT, OWNER)
    assert direct_person(scope) is None
    rows = seen(world, scope)
    assert {r.conversation for r in rows} == {BOB_MAIL}
    assert "9911" not in texts(rows)
    # persons handed in by a caller cannot widen it to the owner either
    where, params = log_visibility_sql(bob_mail(world), persons={OWNER, "e-000000"})
    assert OWNER not in params
    # the conversation and the classes it sees of its own rows (never the owner's), then persons
    assert params == [BOB_MAIL, "direct", "group", "e-000000", world.entities["bob@example.org"]]
    assert "entity IN" in where


def test_a_direct_scope_without_an_entity_sees_only_itself(world: World) -> None:
    rows = seen(world, Scope(BOB_DM, Privacy.DIRECT, None))
    assert {r.conversation for r in rows} == {BOB_DM}
    assert len(rows) == 4


# -- fail closed -------------------------------------------------------------------------------


@pytest.mark.parametrize("privacy", ["public", "", "OWNER", None, 3, "direct "])
def test_an_unknown_privacy_sees_nothing(world: World, privacy: Any) -> None:
    scope = Scope(BOB_DM, privacy, world.entities["@bob:m.org"])
    assert list(visible_history(world.store, scope, limit=100)) == []
    assert log_visibility_sql(scope, persons={"x"}) == ("0", [])
    assert persons_for(world.store, scope) == frozenset()
    assert not any(log_row_visible(scope, r) for r in world.store.recent(100))


@pytest.mark.parametrize("privacy", [Privacy.DIRECT, Privacy.GROUP])
@pytest.mark.parametrize("conversation", ["", None])
def test_a_scope_without_a_conversation_sees_nothing(
    world: World, privacy: Privacy, conversation: Any
) -> None:
    scope = Scope(conversation, privacy, world.entities["@bob:m.org"])
    assert list(visible_history(world.store, scope, limit=100)) == []
    assert log_visibility_sql(scope)[0] == "0"


def test_the_predicate_takes_a_table_alias_and_refuses_anything_else(world: World) -> None:
    where, params = log_visibility_sql(bob_mail(world), table="l")
    assert where.startswith("((l.conversation = ? AND l.privacy IN (?, ?))")

    def search(words: str) -> int:
        sql = (
            "SELECT l.id FROM log_fts f JOIN log l ON l.id = f.rowid "
            f"WHERE log_fts MATCH ? AND {where}"
        )
        return len(world.store.conn.execute(sql, [words, *params]).fetchall())

    assert search("mailbox") == 2  # the message and the reply quoting it
    assert search("vault") == 0  # said by Bob on Matrix: not linked yet
    with pytest.raises(ValueError, match="table"):
        log_visibility_sql(bob_mail(world), table="log; DROP TABLE log")


# -- reading: lazy, bounded, ordered -----------------------------------------------------------


def test_limit_and_before_id_hold_for_merged_direct_history(world: World) -> None:
    assert world.command("entities.link", "matrix:@bob:m.org", "email:bob@example.org")["ok"]
    scope = bob_mail(world)
    full = list(visible_history(world.store, scope, limit=100))
    assert [r.id for r in full] == sorted((r.id for r in full), reverse=True)
    assert len({r.id for r in full}) == len(full)
    assert list(visible_history(world.store, scope, limit=3)) == full[:3]
    middle = (full[2].recorded_ts, full[2].id)
    below = list(visible_history(world.store, scope, limit=100, before=middle))
    assert below == full[3:]
    assert list(visible_history(world.store, scope, limit=0)) == []


class Spy:
    """Counts the rows each store read returns."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.conn = store.conn
        self.rows_read = 0
        self.calls: list[tuple[str, int]] = []

    def recent(self, limit: int, **kwargs: Any) -> list[LogRow]:
        rows = self.store.recent(limit, **kwargs)
        self.calls.append(("recent", limit))
        self.rows_read += len(rows)
        return rows

    def recent_of_entity(self, entity: str, limit: int, **kwargs: Any) -> list[LogRow]:
        rows = self.store.recent_of_entity(entity, limit, **kwargs)
        self.calls.append(("entity", limit))
        self.rows_read += len(rows)
        return rows


def test_direct_history_reads_pages_lazily_and_not_the_whole_log(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "big.sqlite3", cache_rows=64) as store:
        w = World(store)
        w.say(BOB_MAIL, "bob@example.org", "first mail", Privacy.DIRECT)
        for i in range(600):  # lots of Bob on Matrix, lots of everyone else
            w.say(BOB_DM, "@bob:m.org", f"bob {i}", Privacy.DIRECT)
            w.say(TEAM, "@alice:m.org", f"alice {i}", Privacy.GROUP)
        w.command("entities.link", "matrix:@bob:m.org", "email:bob@example.org")
        spy = Spy(store)
        rows = visible_history(spy, bob_mail(w), limit=1000)  # type: ignore[arg-type]
        assert spy.calls == []  # nothing read until asked
        first = list(itertools.islice(rows, 10))
        assert [r.text for r in first] == [f"bob {i}" for i in range(599, 589, -1)]
        # one page from each stream, not the log (2400 rows) nor all of Bob's (600)
        assert spy.rows_read <= 2 * PAGE_ROWS
        rest = list(rows)
        assert len(first) + len(rest) == 600 + 2  # Bob's 600 plus the mail exchange


def test_the_entity_stream_uses_its_index(world: World) -> None:
    plan = world.store.conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM log WHERE entity = ? AND direction = 'in' "
        "AND recorded_ts <= ? AND (recorded_ts < ? OR id < ?) "
        "ORDER BY recorded_ts DESC, id DESC LIMIT ?",
        ("e-1", 10.0, 10.0, 10, 5),
    ).fetchall()
    detail = " ".join(str(r[-1]) for r in plan)
    assert "log_entity_time" in detail
    assert "TEMP B-TREE" not in detail  # ordered by the index, no sort of all the person's rows


def test_direct_context_cost_is_flat_with_the_size_of_the_log(tmp_path: Path) -> None:
    """Reading a direct scope's history takes about as long over 20k rows as over 2k."""

    def cost(rows: int) -> float:
        with MemoryStore(tmp_path / f"flat-{rows}.sqlite3", cache_rows=64) as store:
            w = World(store)
            w.say(BOB_MAIL, "bob@example.org", "mail", Privacy.DIRECT)
            w.say(BOB_DM, "@bob:m.org", "matrix", Privacy.DIRECT)
            w.command("entities.link", "matrix:@bob:m.org", "email:bob@example.org")
            with store.transaction():
                for i in range(rows // 2):
                    n = next(_n)
                    msg = InboundMessage(
                        channel="matrix",
                        session=TEAM,
                        conversation=TEAM,
                        sender=f"@u{i % 50}:m.org",
                        privacy=Privacy.GROUP,
                        text=f"noise {i}",
                        ts=1_795_000_000.0 + n,
                        event_id=f"ev{n}",
                    )
                    w.identity.append_inbound(store, msg, f"{n}-0", is_owner=False)
            scope = bob_mail(w)
            best = float("inf")
            for _ in range(20):
                started = time.perf_counter()
                got = list(visible_history(store, scope, limit=400))
                best = min(best, time.perf_counter() - started)
            assert len(got) == 3  # the mail exchange and Bob's words on Matrix
            return best

    small, large = cost(2_000), cost(20_000)
    assert large < small * 4 + 0.002, (small, large)
