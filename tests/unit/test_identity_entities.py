"""Entities on first sight, handles, links and the person they make, the owner commands."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Kind, Privacy
from memory import commands
from memory.commands import CommandContext
from memory.identity import (
    OWNER,
    OwnerResolver,
    current_links,
    get_entity,
    handle_entity,
    handles_of,
    link_state,
    person_of,
    resolve_ref,
)
from memory.identity_writer import COMMANDS, Identity, create_handle, resolve_or_create
from memory.rows import LogRow
from memory.store import MemoryStore

_ids = itertools.count(1)


def message(
    channel: str,
    sender: str,
    text: str = "hi",
    *,
    conversation: str | None = None,
    privacy: Privacy = Privacy.DIRECT,
    name: str = "",
    kind: Kind = Kind.MESSAGE,
) -> InboundMessage:
    n = next(_ids)
    return InboundMessage(
        kind=kind,
        channel=channel,
        session=f"{channel}:s",
        conversation=conversation or f"{channel}:dm-{sender.strip().strip('@').split(':')[0]}",
        sender=sender,
        sender_name=name,
        privacy=privacy,
        text=text,
        ts=1_795_000_000.0 + n,
        event_id=f"ev{n}",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


@pytest.fixture
def identity() -> Identity:
    resolver = OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix"), "me@example.org"])
    return Identity(resolver, "Ada")


def record(
    store: MemoryStore, identity: Identity, msg: InboundMessage, sid: str | None = None
) -> LogRow:
    sid = sid or f"{next(_ids)}-0"
    is_owner = identity.resolver.is_owner(msg.channel, msg.sender)
    with store.transaction():
        return identity.append_inbound(store, msg, sid, is_owner=is_owner)


# -- first sight -------------------------------------------------------------------------------


def test_an_unknown_sender_gets_an_entity_and_a_handle_on_first_sight(
    store: MemoryStore, identity: Identity
) -> None:
    row = record(store, identity, message("matrix", "@Bob:m.org", name="Bob B."))
    assert row.entity is not None and row.entity.startswith("e-")
    assert not row.is_owner
    entity = get_entity(store.conn, row.entity)
    assert entity is not None and entity.kind == "person" and entity.name == "Bob B."
    [handle] = handles_of(store.conn, row.entity)
    assert (handle.channel, handle.address, handle.display) == ("matrix", "@bob:m.org", "Bob B.")
    # the same handle later, any case or padding: the same entity, nothing new
    again = record(store, identity, message("matrix", "  @BOB:m.org "))
    assert again.entity == row.entity
    assert store.conn.execute("SELECT count(*) FROM entity").fetchone()[0] == 1
    # the same address on another channel is another handle, so another entity (until linked)
    other = record(store, identity, message("email", "@bob:m.org"))
    assert other.entity not in (None, row.entity)


def test_the_owner_is_the_owner_entity_and_gets_no_handle(
    store: MemoryStore, identity: Identity
) -> None:
    rows = [
        record(store, identity, message("matrix", "@me:m.org", privacy=Privacy.OWNER)),
        record(store, identity, message("email", "ME@example.org", privacy=Privacy.OWNER)),
        record(store, identity, message("cli", "whoever", privacy=Privacy.OWNER)),
    ]
    assert [(r.entity, r.is_owner) for r in rows] == [(OWNER, True)] * 3
    owner = get_entity(store.conn, OWNER)
    assert owner is not None and owner.name == "Ada"
    assert store.conn.execute("SELECT count(*) FROM handle").fetchone()[0] == 0
    # the scoped matrix alias wins: the unscoped address is a stranger on matrix
    stranger = record(store, identity, message("matrix", "me@example.org"))
    assert stranger.entity != OWNER and not stranger.is_owner


def test_every_inbound_row_has_an_entity_and_a_replay_adds_nothing(
    store: MemoryStore, identity: Identity
) -> None:
    msg = message("email", "carol@example.org", conversation="email:t1", privacy=Privacy.GROUP)
    first = record(store, identity, msg, "77-0")
    replay = record(store, identity, msg, "77-0")
    assert replay == first
    assert store.conn.execute("SELECT count(*) FROM log").fetchone()[0] == 1
    assert store.conn.execute("SELECT count(*) FROM entity").fetchone()[0] == 1


def test_a_scheduled_sender_is_a_service(store: MemoryStore, identity: Identity) -> None:
    row = record(store, identity, message("cron", "reminders", kind=Kind.SCHEDULED))
    assert row.entity is not None
    entity = get_entity(store.conn, row.entity)
    assert entity is not None and entity.kind == "service"


def test_the_row_is_recorded_even_when_the_identity_tables_fail(
    store: MemoryStore, identity: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_a: Any, **_k: Any) -> str:
        raise sqlite3.OperationalError("no such table: handle")

    monkeypatch.setattr("memory.identity_writer.create_handle", broken)
    row = record(store, identity, message("matrix", "@dan:m.org"))
    assert row.entity is None  # narrower (its direct conversation sees only itself), never wider


def test_a_blank_sender_is_recorded_without_an_entity(
    store: MemoryStore, identity: Identity
) -> None:
    row = record(store, identity, message("matrix", "   ", conversation="matrix:dm-x"))
    assert row.entity is None
    assert store.conn.execute("SELECT count(*) FROM handle").fetchone()[0] == 0


def test_the_store_refuses_the_owner_entity_on_someone_else(store: MemoryStore) -> None:
    with pytest.raises(ValueError, match="owner"):
        store.append_inbound(message("matrix", "@x:m.org"), "1-0", is_owner=False, entity=OWNER)
    row = store.append_inbound(message("cli", "me"), "2-0", is_owner=True, entity="e-123456")
    assert row.entity == OWNER


# -- references --------------------------------------------------------------------------------


def test_references_name_entities_by_id_handle_or_unique_address(store: MemoryStore) -> None:
    conn = store.conn
    bob = create_handle(conn, "matrix", "@bob:m.org")
    bob_mail = create_handle(conn, "email", "bob@example.org")
    create_handle(conn, "xmpp", "bob@example.org")
    assert resolve_ref(conn, bob) == bob
    assert resolve_ref(conn, bob.upper()) == bob
    assert resolve_ref(conn, "owner") == OWNER
    assert resolve_ref(conn, "matrix:@Bob:m.org") == bob
    assert resolve_ref(conn, "@bob:m.org") == bob  # bare, on one channel only
    assert resolve_ref(conn, "email:bob@example.org") == bob_mail
    with pytest.raises(LookupError, match="several channels"):
        resolve_ref(conn, "bob@example.org")
    with pytest.raises(LookupError, match="no entity"):
        resolve_ref(conn, "e-999999")
    with pytest.raises(LookupError, match="has been seen"):
        resolve_ref(conn, "email:nobody@example.org")
    with pytest.raises(LookupError):
        resolve_ref(conn, "  ")
    made = resolve_or_create(conn, "email:new@example.org")
    assert handle_entity(conn, "email", "NEW@example.org") == made


# -- links and persons -------------------------------------------------------------------------


def ctx(store: MemoryStore, sid: str) -> CommandContext:
    return CommandContext(stream_id=sid, store=store)


_sids = itertools.count(1)


def run(store: MemoryStore, op: str, a: str, b: str, sid: str | None = None) -> dict[str, Any]:
    context = ctx(store, sid or f"{next(_sids)}-1")
    return commands.apply(context, op, {"a": a, "b": b, "reason": "test"})


def test_the_identity_commands_are_offered_to_the_worker() -> None:
    assert set(COMMANDS) == {
        "entities.link",
        "entities.suggest",
        "entities.unlink",
        "entities.reject",
        "entities.merge",
        "entities.unmerge",
    }
    assert set(COMMANDS) <= set(commands.handlers())


def test_a_verified_link_joins_a_person_transitively_and_unlink_splits_it(
    store: MemoryStore,
) -> None:
    conn = store.conn
    a = create_handle(conn, "matrix", "@bob:m.org")
    b = create_handle(conn, "email", "bob@example.org")
    c = create_handle(conn, "xmpp", "bob@jabber.org")
    assert person_of(conn, a) == {a}
    result = run(store, "entities.link", "matrix:@bob:m.org", "email:bob@example.org")
    assert result["ok"] and result["changed"] and result["status"] == "verified"
    assert result["person_a"] == sorted({a, b})
    assert run(store, "entities.link", b, c)["ok"]
    assert person_of(conn, a) == person_of(conn, c) == {a, b, c}
    assert run(store, "entities.unlink", a, b)["status"] == "unlinked"
    assert person_of(conn, a) == {a}
    assert person_of(conn, b) == {b, c}
    # the history stays: three events, the newest per pair is its state
    assert [link.status for link in current_links(conn)] == ["verified", "unlinked"]
    assert conn.execute("SELECT count(*) FROM entity_link").fetchone()[0] == 3


def test_a_suggestion_merges_nothing(store: MemoryStore) -> None:
    conn = store.conn
    a = create_handle(conn, "matrix", "@bob:m.org")
    b = create_handle(conn, "email", "bob@example.org")
    result = run(store, "entities.suggest", a, b)
    assert result["ok"] and result["status"] == "suggested"
    assert person_of(conn, a) == {a} and person_of(conn, b) == {b}
    assert run(store, "entities.reject", a, b)["status"] == "rejected"
    assert person_of(conn, a) == {a}
    # confirmed later by the owner: now one person
    assert run(store, "entities.link", a, b)["status"] == "verified"
    assert person_of(conn, a) == {a, b}
    # a suggestion never downgrades a verified link
    again = run(store, "entities.suggest", a, b)
    assert again["ok"] and not again["changed"] and again["status"] == "verified"
    assert person_of(conn, a) == {a, b}


def test_commands_are_idempotent_on_the_stream_id(store: MemoryStore) -> None:
    conn = store.conn
    first = run(store, "entities.link", "matrix:@bob:m.org", "email:bob@example.org", "5-0")
    assert first["ok"]  # both handles were created by the link
    replay = run(store, "entities.link", "matrix:@bob:m.org", "email:bob@example.org", "5-0")
    assert replay == first
    assert conn.execute("SELECT count(*) FROM entity_link").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM entity").fetchone()[0] == 2
    # a second link command for the same pair changes nothing and records nothing
    same = run(store, "entities.link", "@bob:m.org", "bob@example.org")
    assert same["ok"] and not same["changed"]
    assert conn.execute("SELECT count(*) FROM entity_link").fetchone()[0] == 1


@pytest.mark.parametrize(
    ("op", "a", "b", "error"),
    [
        ("entities.link", "matrix:@bob:m.org", "@bob:m.org", "same entity"),
        ("entities.link", "owner", "matrix:@bob:m.org", "owner.aliases"),
        ("entities.suggest", "matrix:@bob:m.org", "OWNER", "owner.aliases"),
        ("entities.link", "matrix:@bob:m.org", "e-424242", "no entity"),
        ("entities.unlink", "matrix:@bob:m.org", "email:bob@example.org", "not linked"),
        ("entities.reject", "matrix:@bob:m.org", "email:bob@example.org", "not linked"),
        ("entities.unlink", "matrix:@bob:m.org", "email:nobody@example.org", "has been seen"),
        ("entities.link", "matrix:@bob:m.org", "", "argument 'b'"),
    ],
)
def test_bad_link_commands_say_why_and_record_nothing(
    store: MemoryStore, op: str, a: str, b: str, error: str
) -> None:
    create_handle(store.conn, "matrix", "@bob:m.org")
    create_handle(store.conn, "email", "bob@example.org")
    result = run(store, op, a, b)
    assert not result["ok"]
    assert error in result["error"]
    assert store.conn.execute("SELECT count(*) FROM entity_link").fetchone()[0] == 0


def test_groups_do_not_link_and_verified_links_cannot_be_rejected(store: MemoryStore) -> None:
    conn = store.conn
    a = create_handle(conn, "matrix", "@bob:m.org")
    room = create_handle(conn, "matrix", "#room:m.org", kind="group")
    assert "group" in run(store, "entities.link", a, room)["error"]
    b = create_handle(conn, "email", "bob@example.org")
    assert run(store, "entities.link", a, b)["ok"]
    refused = run(store, "entities.reject", a, b)
    assert not refused["ok"] and "verified" in refused["error"]
    assert link_state(conn, a, b) == "verified"


def test_a_link_with_the_owner_that_got_in_anyway_joins_nothing(store: MemoryStore) -> None:
    conn = store.conn
    conn.execute(
        "INSERT INTO entity (id, kind, name, created_ts) VALUES ('owner', 'person', '', 0)"
    )
    bob = create_handle(conn, "matrix", "@bob:m.org")
    a, b = sorted((OWNER, bob))
    conn.execute(
        "INSERT INTO entity_link (a, b, status, actor, ts) VALUES (?, ?, 'verified', 'system', 0)",
        (a, b),
    )
    assert person_of(conn, bob) == {bob}
    assert person_of(conn, OWNER) == {OWNER}
    assert person_of(conn, "") == frozenset()
