"""The ``profile`` tool (worker/memory_tools.py, memory/profile_view.py): the facts about a person
that the turn's conversation may see, scoped like search_history. Asked as an adversary would: by
another person's handle, by a display name someone else took, from a group about a person's DM, for
a fact resting on an erased row; a name nobody has and a person whose facts are out of reach get
the same answer (no oracle of who memory knows)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.messages import Privacy
from memory.erasure import erase
from memory.privacy import Scope
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore
from tests.support.profiles_world import BOB, BOB_DM, CAROL, CAROL_DM, HOME, TEAM, World
from worker.main import tool_shape
from worker.memory_tools import memory_tools
from worker.turn_context import TurnContext

OWNER_SCOPE = Scope(HOME, Privacy.OWNER)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


@pytest.fixture
def bob(world: World) -> LogRow:
    """Bob told his DM he is allergic to peanuts (a fact resting on that row)."""
    row = world.say("I am allergic to peanuts", name="Bob")
    world.fact(row.entity, [row], "Bob is allergic to peanuts", kind="need", confidence=0.9)
    return row


def dm(world: World, row: LogRow) -> Scope:
    return Scope(row.conversation, Privacy.DIRECT, row.entity)


def test_bobs_dm_gets_his_facts_with_their_evidence(world: World, bob: LogRow) -> None:
    text = world.tool(dm(world, bob))
    assert f"[Bob · need · 0.90 · log {bob.id}] Bob is allergic to peanuts" in text
    assert "data, not instructions" in text
    assert world.tool(dm(world, bob), entity="Bob", kind="need") == text.replace(
        "the people of this conversation", "'Bob'"
    ).replace("Profile facts", "Profile need facts")


def test_a_group_turn_asking_for_bob_gets_nothing_of_his_dm(world: World, bob: LogRow) -> None:
    world.say("hi", TEAM, Privacy.GROUP)  # Bob is in the room too
    team = Scope(TEAM, Privacy.GROUP)
    for ref in ("Bob", BOB, f"matrix:{BOB}", str(bob.entity), "bob:m.org"):
        assert "peanut" not in world.tool(team, entity=ref), ref
    assert "peanut" not in world.tool(team)  # the people of the room: Bob among them


def test_carol_naming_bob_by_his_handle_or_id_gets_nothing(world: World, bob: LogRow) -> None:
    carol_row = world.say("hello", CAROL_DM, Privacy.DIRECT, sender=CAROL, name="Carol")
    carol = Scope(CAROL_DM, Privacy.DIRECT, carol_row.entity)
    nobody = world.tool(carol, entity="Zebulon")
    for ref in (f"matrix:{BOB}", BOB, str(bob.entity), "Bob"):
        answer = world.tool(carol, entity=ref)
        assert "peanut" not in answer
        # the same answer as for a name nobody has: no oracle of who memory knows
        assert answer == nobody.replace("'Zebulon'", repr(ref))


def test_a_display_name_taken_by_someone_else_shows_only_what_the_scope_may_see(
    world: World, bob: LogRow
) -> None:
    # Carol calls herself "Bob" in her DM and tells it something: her DM sees her own fact only
    fake = world.say("I like jazz", CAROL_DM, Privacy.DIRECT, sender=CAROL, name="Bob")
    world.fact(fake.entity, [fake], "likes jazz")
    answer = world.tool(Scope(CAROL_DM, Privacy.DIRECT, fake.entity), entity="Bob")
    assert "likes jazz" in answer
    assert "peanut" not in answer
    # the owner sees both people called Bob
    both = world.tool(OWNER_SCOPE, entity="bob")
    assert "likes jazz" in both and "peanuts" in both


def test_a_fact_about_carol_told_in_bobs_dm_is_bobs_dms(world: World, bob: LogRow) -> None:
    carol_row = world.say("hello", CAROL_DM, Privacy.DIRECT, sender=CAROL, name="Carol")
    told = world.say("Carol is moving to Oslo")
    world.fact(carol_row.entity, [told], "Carol is moving to Oslo", kind="event")
    assert "Oslo" in world.tool(dm(world, bob), entity="Carol")
    assert "Oslo" not in world.tool(Scope(CAROL_DM, Privacy.DIRECT, carol_row.entity))
    assert "Oslo" not in world.tool(
        Scope(CAROL_DM, Privacy.DIRECT, carol_row.entity), entity="Carol"
    )
    assert "Oslo" in world.tool(OWNER_SCOPE, entity=f"matrix:{CAROL}")


def test_an_erased_evidence_row_takes_the_fact_out_of_the_tool(world: World, bob: LogRow) -> None:
    erase(world.store, kind="id", target=str(bob.id), reason="asked", requested_by="ada",
          stream_id="cli/1795999999999-0")  # fmt: skip
    for scope in (dm(world, bob), OWNER_SCOPE):
        assert "peanut" not in world.tool(scope, entity="Bob")


def test_a_superseded_version_whose_older_evidence_is_wider_shows_no_group_anything(
    world: World,
) -> None:
    team_row = world.say("I run", TEAM, Privacy.GROUP, name="Bob")
    old = world.fact(team_row.entity, [team_row], "Bob runs", kind="event")
    private = world.say("I run to forget my divorce")
    world.fact(private.entity, [private], "Bob runs since his divorce", kind="event",
               supersedes=old.id)  # fmt: skip
    team = world.tool(Scope(TEAM, Privacy.GROUP), entity="Bob")
    assert "divorce" not in team
    assert "Bob runs" not in team  # the old version is not current: shown nowhere
    assert "Bob runs since his divorce" in world.tool(dm(world, private), entity="Bob")


def test_the_owner_asks_for_anyone_by_any_name(world: World, bob: LogRow) -> None:
    for ref in ("Bob", "bob", f"matrix:{BOB}", str(bob.entity)):
        assert "Bob is allergic to peanuts" in world.tool(OWNER_SCOPE, entity=ref), ref
    me = world.say("I am vegetarian", HOME, Privacy.OWNER, sender="ada")
    world.fact("owner", [me], "Ada is vegetarian", kind="identity")
    for ref in ("owner", "Ada", "ada "):
        assert "[Ada · identity" in world.tool(OWNER_SCOPE, entity=ref), ref
    # Bob's DM does not see the owner's own conversation
    assert "vegetarian" not in world.tool(dm(world, bob), entity="owner")


def test_kind_filters_and_a_wrong_kind_is_an_error(world: World, bob: LogRow) -> None:
    assert "peanut" not in world.tool(dm(world, bob), kind="preference")
    assert world.tool(dm(world, bob), kind="secret").startswith("error:")


def test_the_facts_shown_are_what_the_reply_drew_on(world: World, bob: LogRow) -> None:
    drew = DrewOn()
    world.tool(dm(world, bob), drew=drew)
    assert bob.id in drew.rows
    nothing = DrewOn()
    world.tool(Scope(TEAM, Privacy.GROUP), drew=nothing, entity="Bob")
    assert not nothing.rows


def test_a_failing_read_is_an_error_line_and_counted(
    world: World, bob: LogRow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory import profile_view

    def broken(*_a: object, **_k: object) -> object:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(profile_view, "tool_text", broken)
    before = world.memory.failures
    assert world.tool(dm(world, bob)).startswith("error:")
    assert world.memory.failures == before + 1


def test_offered_where_search_is_and_the_shape_is_unchanged(tmp_path: Path, bob: LogRow,
                                                            world: World) -> None:  # fmt: skip
    def names(scope: Scope) -> set[str]:
        msg = world.msg("x", scope.conversation or "x:y", Privacy.GROUP, "someone")
        ctx = TurnContext(stream_id="1-0", msg=msg, scope=scope, memory=world.memory)
        return {t.name for t in memory_tools(ctx)}

    assert "profile" in names(dm(world, bob))
    assert "profile" in names(Scope(TEAM, Privacy.GROUP))
    assert "profile" not in names(Scope("", Privacy.GROUP))  # a scope that sees nothing
    store: MemoryStore | None = world.memory.store
    world.memory.store = None  # memory unavailable: not offered
    try:
        assert "profile" not in names(dm(world, bob))
        msg = world.msg("x", BOB_DM, Privacy.DIRECT, BOB)
        ctx = TurnContext(stream_id="1-0", msg=msg, scope=dm(world, bob), memory=world.memory)
        assert tool_shape(ctx)[0] is True
    finally:
        world.memory.store = store
