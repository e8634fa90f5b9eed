"""Capability gaps (memory/gaps.py) through a range's result (memory/profile_apply.py) on a real
SQLite store: new, merged (named or by normalized description), the most private audience of all
their evidence, closed by the owner or by a tool that covers them, reopened only when they come
back, the signature TODO.md is rewritten by, the owner command, and the database's guards."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import Privacy
from memory import commands, gaps
from memory.commands import CommandContext
from memory.identity import OWNER
from memory.rows import LogRow
from tests.unit.test_profile_apply import CAROL, CAROL_DM, TEAM, World


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def gap(entity: str, description: str, rows: list[LogRow], **kw: Any) -> dict[str, Any]:
    return {"entity": entity, "description": description, "evidence": [r.id for r in rows], **kw}


def seen(world: World, rows: list[LogRow], *found: dict[str, Any]) -> Any:
    return world.apply(world.result(rows, gaps=list(found)))


def test_a_new_gap(world: World) -> None:
    a = world.say("can you look up the weather in Oslo?")
    r = world.reply(a, "I cannot browse the web")
    bob = str(a.entity)
    done = seen(world, [a, r], gap(bob, "look up  the weather", [a, r], needs="Web Search"))
    assert done.gaps_new == 1
    (g,) = gaps.listing(world.conn)
    assert (g.entity, g.description, g.needs, g.count, g.status) == (
        bob, "look up the weather", "web_search", 1, "open")  # fmt: skip
    assert g.evidence == (a.id, r.id) and g.source_privacy == "direct"
    assert (g.first_seen, g.last_seen) == (a.ts, r.ts)
    assert gaps.of_entities(world.conn, [bob]) == [g]
    assert gaps.of_entities(world.conn, [OWNER]) == []


def test_a_gap_seen_again_merges_and_narrows_its_audience(world: World) -> None:
    g1 = world.say("book me a table", conversation=TEAM, privacy=Privacy.GROUP)
    bob = str(g1.entity)
    seen(world, [g1], gap(bob, "Book a table.", [g1], needs="booking"))
    (first,) = gaps.listing(world.conn)
    assert first.source_privacy == "group"
    d = world.say("please, book the table")
    seen(world, [d], gap(bob, "reserve a restaurant", [d], same_as=first.id, needs="other"))
    later = world.say("the table, again!")
    seen(world, [later], gap(bob, "book a table", [later]))  # the same, by its words
    (g,) = gaps.listing(world.conn)
    assert (g.id, g.count, g.description, g.needs) == (first.id, 3, "Book a table.", "booking")
    assert g.evidence == (g1.id, d.id, later.id) and g.last_seen == later.ts
    assert g.source_privacy == "direct"  # the most private of all its evidence
    # the same rows again (a range derived again) change nothing
    again = world.apply(world.result([later], gaps=[gap(bob, "book a table", [later])],
                                     first=later.id - 1))  # fmt: skip
    assert again.unchanged == 1 and gaps.listing(world.conn)[0].count == 3


def test_a_gap_of_someone_else_is_not_merged(world: World) -> None:
    b = world.say("translate this")
    c = world.say("translate this", conversation=CAROL_DM, sender=CAROL)
    bob, carol = str(b.entity), str(c.entity)
    seen(world, [b], gap(bob, "translate", [b]))
    (bobs,) = gaps.listing(world.conn)
    done = seen(world, [c], gap(carol, "translate", [c]), gap(carol, "x", [c], same_as=bobs.id))
    assert done.gaps_new == 1 and "not a gap of" in done.refused[0]
    assert sorted(g.entity for g in gaps.listing(world.conn)) == sorted([bob, carol])


def test_bad_gaps_are_refused_alone(world: World) -> None:
    a = world.say("send an email to Sam")
    b = world.say("later")
    bob = str(a.entity)
    done = seen(
        world, [a],
        gap(bob, "email", [b]),
        gap("e-00000000", "email", [a]),
        gap(bob, "   ", [a]),
        gap(bob, "x" * 301, [a]),
        gap(bob, "no evidence", []),
        gap(bob, "send email", [a], needs="send email; rm -rf /"),
    )  # fmt: skip
    assert done.gaps_new == 1 and len(done.refused) == 5
    (g,) = gaps.listing(world.conn)
    assert g.needs is None  # not a word: dropped, the gap kept
    assert gaps.needs_word(" Send-Email ") == "send_email" and gaps.needs_word(3) is None


def test_close_reopen_and_close_covered(world: World) -> None:
    a = world.say("search the web for flights")
    older = world.say("flights?")  # said before the gap is closed, derived after (a backlog)
    bob = str(a.entity)
    seen(world, [a], gap(bob, "search flights", [a], needs="web_search"))
    (g,) = gaps.listing(world.conn)
    closed = gaps.close(world.conn, g.id, "  not now  ", now=older.ts + 1)
    assert not isinstance(closed, str) and closed.status == "closed"
    assert closed.closed_reason == "not now" and gaps.listing(world.conn) == []
    assert gaps.close(world.conn, g.id, "again", now=0) == closed  # a replay: as it is
    assert gaps.close(world.conn, 999, "x", now=0) == "there is no gap 999"
    # an older sighting does not reopen it (merged, counted, still closed)
    seen(world, [older], gap(bob, "search flights", [older]))
    kept = gaps.by_id(world.conn, g.id)
    assert kept is not None and (kept.status, kept.count) == ("closed", 2)
    # it comes back: reopened
    newer = world.say("I still need those flights")
    seen(world, [newer], gap(bob, "search for flights", [newer], same_as=g.id))
    back = gaps.by_id(world.conn, g.id)
    assert back is not None and (back.status, back.reopened, back.closed_reason) == (
        "open", 1, None)  # fmt: skip
    assert back.count == 3 and back.closed_at is None
    other = world.say("what's on my calendar?")
    seen(world, [other], gap(bob, "read the calendar", [other], needs="calendar"))
    assert gaps.close_covered(world.conn, ["Web_Search", "notes"], now=newer.ts + 9) == [g.id]
    covered = gaps.by_id(world.conn, g.id)
    assert covered is not None and covered.closed_reason == "covered by the tool web_search"
    assert [x.needs for x in gaps.listing(world.conn)] == ["calendar"]
    assert [x.status for x in gaps.listing(world.conn, include_closed=True)] == ["open", "closed"]


def test_the_signature_changes_with_every_change_only(world: World) -> None:
    empty = gaps.signature(world.conn)
    a = world.say("order pizza")
    bob = str(a.entity)
    seen(world, [a], gap(bob, "order food", [a]))
    made = gaps.signature(world.conn)
    assert made != empty and gaps.signature(world.conn) == made
    b = world.say("pizza!!")
    seen(world, [b], gap(bob, "order food", [b]))
    merged = gaps.signature(world.conn)
    (g,) = gaps.listing(world.conn)
    gaps.close(world.conn, g.id, "done", now=b.ts + 1)
    closed = gaps.signature(world.conn)
    world.erase_rows(a)
    erased = gaps.signature(world.conn)
    assert len({empty, made, merged, closed, erased}) == 5


def test_the_owner_closes_a_gap_by_command(world: World) -> None:
    a = world.say("call my mum")
    seen(world, [a], gap(str(a.entity), "make a phone call", [a], needs="phone"))
    (g,) = gaps.listing(world.conn)
    ctx = CommandContext(stream_id="1-1", store=world.store, now=a.ts + 10)
    with world.store.transaction():
        done = commands.apply(ctx, "memory.gap_close", {"id": g.id, "why": "no phone line"})
    assert done["ok"] and done["gap"]["status"] == "closed"
    assert done["gap"]["closed_reason"] == "no phone line" and done["gap"]["evidence"] == [a.id]
    with world.store.transaction():
        replay = commands.apply(ctx, "memory.gap_close", {"id": g.id, "why": "no phone line"})
    assert replay == done
    for args in ({"id": 999}, {"id": "1"}, {"id": True}, {"id": g.id, "why": 3}, {}):
        with world.store.transaction():
            bad = commands.apply(ctx, "memory.gap_close", args)
        assert not bad["ok"] and bad["error"], args


def test_the_database_guards_a_gap(world: World) -> None:
    g1 = world.say("fax this", conversation=TEAM, privacy=Privacy.GROUP)
    seen(world, [g1], gap(str(g1.entity), "send a fax", [g1], needs="fax"))
    (g,) = gaps.listing(world.conn)
    for sql in (
        "UPDATE capability_gaps SET description = 'other' WHERE id = ?",
        "UPDATE capability_gaps SET needs = 'other' WHERE id = ?",
        "UPDATE capability_gaps SET count = 0 WHERE id = ?",
        "UPDATE capability_gaps SET first_seen = 0 WHERE id = ?",
        "UPDATE capability_gaps SET erased = 1 WHERE id = ?",
        "UPDATE capability_gaps SET status = 'closed' WHERE id = ?",  # no reason, no time
        "DELETE FROM capability_gaps WHERE id = ?",
        "DELETE FROM gap_evidence WHERE gap = ?",
        "UPDATE gap_evidence SET log_id = 1 WHERE gap = ?",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            world.conn.execute(sql, (g.id,))
    world.conn.execute("UPDATE capability_gaps SET source_privacy = 'direct' WHERE id = ?", (g.id,))
    with pytest.raises(sqlite3.IntegrityError):  # an audience narrows, never widens
        world.conn.execute(
            "UPDATE capability_gaps SET source_privacy = 'group' WHERE id = ?", (g.id,)
        )
