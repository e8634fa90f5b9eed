"""Layer 2 under an erasure (memory/profile_erasure.py, memory/erasure.py): a fact resting on an
erased row is blanked (its text gone from the database file too), its predecessor current again
when its own evidence survives, gaps blanked, runs marked, the receipt and the preview name them,
the range derived again from its new summary; and a fact is shown only where all of its evidence
may be."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import Privacy
from memory import gaps, profiles
from memory.erasure import erase, plan_erasure
from memory.identity import OWNER
from memory.privacy import Scope
from memory.profile_apply import pending, run_key
from memory.profile_erasure import cascade
from memory.profiles import Refused
from relaybot.cli_erase import render_preview, render_receipt
from tests.unit.test_profile_apply import BOB_DM, CAROL, CAROL_DM, OWNER_DM, TEAM, World, fact, only


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def database_bytes(world: World) -> bytes:
    path = world.store.path
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def test_an_erased_row_takes_its_facts_and_gaps_to_the_bytes(world: World) -> None:
    a = world.say("call me at the zebra-quokka hotel")
    b = world.say("I like tea")
    bob = str(a.entity)
    s = world.summarize([a, b])
    world.apply(world.result(
        [a, b], summary=s.id,
        facts=[fact(bob, "stays at the Zebra-Quokka hotel", [a.id], kind="event"),
               fact(bob, "likes tea", [b.id])],
        gaps=[{"entity": bob, "description": "book the zebra-quokka suite", "evidence": [a.id],
               "needs": "booking"}],
    ))  # fmt: skip
    hotel, tea = profiles.current(world.conn, bob)
    (gap,) = gaps.listing(world.conn)
    world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert database_bytes(world).lower().count(b"quokka") >= 3  # the row, the fact, the gap
    preview = plan_erasure(world.conn, "id", str(a.id))
    shown = render_preview(preview)
    assert f"2 profile facts (fact:{hotel.id}, fact:{tea.id}) and 1 capability gaps" in shown
    # the tea fact rests on row b only, but the job that wrote it read row a: it goes too
    assert (preview.fact_ids, preview.gap_ids) == ([hotel.id, tea.id], [gap.id])
    receipt = erase(world.store, kind="id", target=str(a.id), reason="asked",
                    requested_by="owner", stream_id="77-1")  # fmt: skip
    assert (receipt["facts"], receipt["gaps"]) == ([hotel.id, tea.id], [gap.id])
    said = render_receipt("id", str(a.id), {**receipt, "cleaned": {"todo_md": "rewritten"}})
    assert f"layer 2:       2 profile facts (fact:{hotel.id}, fact:{tea.id}), 1 capability" in said
    assert "TODO.md:       rewritten" in said
    replay = erase(world.store, kind="id", target=str(a.id), reason="asked",
                   requested_by="owner", stream_id="77-1")  # fmt: skip
    assert replay["replayed"] and (replay["facts"], replay["gaps"]) == (
        [hotel.id, tea.id],
        [gap.id],
    )
    blank = profiles.by_id(world.conn, hotel.id)
    assert blank is not None and blank.text == "" and blank.erased == receipt["erasure"]
    assert profiles.current(world.conn, bob) == []  # derived again from what remains
    gone = gaps.by_id(world.conn, gap.id)
    assert gone is not None and (gone.description, gone.needs, gone.erased) == (
        "", None, receipt["erasure"])  # fmt: skip
    assert gaps.listing(world.conn, include_closed=True) == []
    (erased_run,) = world.conn.execute("SELECT erased, note FROM profile_runs")
    assert tuple(erased_run) == (receipt["erasure"], "")
    detail = world.conn.execute("SELECT detail FROM erasure").fetchone()[0]
    assert f'"facts":[{hotel.id},{tea.id}]' in detail and f'"gaps":[{gap.id}]' in detail
    # secure_delete in the grant, the WAL checkpointed after the commit: not a byte left
    assert database_bytes(world).lower().count(b"quokka") == 0


def test_the_predecessor_is_current_again_when_its_evidence_survives(world: World) -> None:
    a = world.say("I like tea")
    b = world.say("green tea, my doctor says")
    c = world.say("still tea")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "likes tea", [a.id])]))
    v1 = profiles.current(world.conn, bob)[0]
    world.apply(world.result([b], facts=[fact(bob, "tea", [b.id], same_as=v1.id)]))
    v2 = profiles.current(world.conn, bob)[0]
    world.apply(world.result([c], facts=[fact(bob, "tea", [c.id], same_as=v2.id)]))
    v3 = profiles.current(world.conn, bob)[0]
    receipt = world.erase_rows(b)
    assert receipt["facts"] == [v2.id, v3.id]  # v3 inherited b
    back = profiles.current(world.conn, bob)
    assert [f.id for f in back] == [v1.id] and back[0].superseded_by is None
    assert profiles.by_id(world.conn, v2.id).supersedes is None  # type: ignore[union-attr]
    # its chain goes on from v1 (the one-successor index was freed)
    d = world.say("tea, once more")
    done = world.apply(world.result([d], facts=[fact(bob, "tea", [d.id], same_as=v1.id)]))
    assert done.superseded == 1
    assert profiles.current(world.conn, bob)[0].evidence == (a.id, d.id)


def test_an_erased_contradiction_gives_the_older_fact_back(world: World) -> None:
    a = world.say("I live in Lyon")
    b = world.say("I moved to Oslo")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "lives in Lyon", [a.id])]))
    lyon = profiles.current(world.conn, bob)[0]
    world.apply(world.result([b], facts=[fact(bob, "lives in Oslo", [b.id], contradicts=lyon.id)]))
    oslo = profiles.current(world.conn, bob)[0]
    world.erase_rows(b)
    assert [f.text for f in profiles.current(world.conn, bob)] == ["lives in Lyon"]
    erased = profiles.by_id(world.conn, oslo.id)
    assert erased is not None and (erased.supersedes, erased.conflicts_with) == (None, None)


def test_a_contradiction_stays_when_what_it_contradicts_is_erased(world: World) -> None:
    a = world.say("I live in Lyon")
    b = world.say("I moved to Oslo")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "lives in Lyon", [a.id])]))
    lyon = profiles.current(world.conn, bob)[0]
    world.apply(world.result([b], facts=[fact(bob, "lives in Oslo", [b.id], contradicts=lyon.id)]))
    oslo = profiles.current(world.conn, bob)[0]
    world.erase_rows(a)
    assert profiles.current(world.conn, bob) == [oslo]
    scope = Scope(BOB_DM, Privacy.DIRECT, bob)
    assert profiles.conflict_of(world.conn, scope, oslo) is None  # a blank is never shown


def test_a_kept_contradiction_above_an_erased_version_stays_the_current_one(world: World) -> None:
    a, b, c = world.say("tea"), world.say("green tea"), world.say("no, coffee now")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "likes tea", [a.id])]))
    v1 = profiles.current(world.conn, bob)[0]
    world.apply(world.result([b], facts=[fact(bob, "tea", [b.id], same_as=v1.id)]))
    v2 = profiles.current(world.conn, bob)[0]
    world.apply(world.result([c], facts=[fact(bob, "likes coffee", [c.id], contradicts=v2.id)]))
    v3 = profiles.current(world.conn, bob)[0]
    world.erase_rows(b)  # v2 goes; v3 rests on c alone and stays: v1 is not current again
    assert [f.id for f in profiles.history(world.conn, bob) if f.current] == [v3.id]


def test_the_range_is_derived_again_from_its_new_summary(world: World) -> None:
    a, b, c = world.say("one"), world.say("two, a secret"), world.say("three")
    bob = str(a.entity)
    s = world.summarize([a, b, c])
    world.apply(world.result([a, b, c], summary=s.id, facts=[fact(bob, "counts", [a.id, b.id])]))
    assert pending(world.conn, 10) == []
    world.erase_rows(b)
    assert pending(world.conn, 10) == []  # layer 1 has to summarise what remains first
    again = world.summarize([a, c], version=2)
    (todo,) = pending(world.conn, 10)
    assert (todo.summary, todo.first_id, todo.last_id) == (again.id, a.id, c.id)
    done = world.apply(world.result([a, c], summary=again.id, facts=[fact(bob, "counts", [a.id])]))
    assert done.added == 1 and pending(world.conn, 10) == []


def test_the_database_refuses_changes_outside_an_erasure(world: World) -> None:
    a = world.say("tea")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "likes tea", [a.id])]))
    with pytest.raises(sqlite3.IntegrityError):  # outside an erasure's grant: refused
        cascade(world.conn, 1, [a.id])
    for sql in (
        "UPDATE profile_runs SET erased = 1",
        "UPDATE profile_runs SET facts = 0",
        "DELETE FROM profile_runs",
        "UPDATE profile_facts SET text = ''",
        "DELETE FROM profile_facts",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            world.conn.execute(sql)


@pytest.mark.parametrize(
    ("scope", "shown"),
    [
        ("bob dm", True),
        ("owner", True),
        ("bob by mail", True),  # what Bob himself said, elsewhere to Bob
        ("team", False),
        ("carol dm", False),
    ],
)
def test_a_fact_from_bobs_dm_is_shown_only_where_all_its_evidence_may_be(
    world: World, scope: str, shown: bool
) -> None:
    a = world.say("my vault code is QX-5531")
    c = world.say("hi", conversation=CAROL_DM, sender=CAROL)
    bob, carol = str(a.entity), str(c.entity)
    world.apply(world.result([a], facts=[fact(bob, "keeps a vault code", [a.id])]))
    scopes: dict[str, Any] = {
        "bob dm": Scope(BOB_DM, Privacy.DIRECT, bob),
        "owner": Scope(OWNER_DM, Privacy.OWNER, OWNER),
        "bob by mail": Scope("email:bob-thread", Privacy.DIRECT, bob),
        "team": Scope(TEAM, Privacy.GROUP),
        "carol dm": Scope(CAROL_DM, Privacy.DIRECT, carol),
    }
    seen = profiles.visible(world.conn, scopes[scope], bob)
    assert bool(seen) is shown
    (f,) = profiles.current(world.conn, bob)
    assert profiles.shown(world.conn, scopes[scope], f) is shown


def test_erasing_a_person_takes_their_profile_whoever_said_it(world: World) -> None:
    """The owner told the assistant about Bob in her own conversation: that fact is Bob's
    profile, and erasing Bob takes it (and the gaps about him), though no row of Bob's is its
    evidence; a fact about Carol from the same range stays."""
    bob_row = world.say("hello")  # Bob exists as an entity
    bob = str(bob_row.entity)
    carol = str(world.say("hi", conversation=CAROL_DM, sender=CAROL).entity)
    said = world.say("Bob is allergic to walnuts, Carol to nothing", conversation=OWNER_DM,
                     sender="@me:m.org", privacy=Privacy.OWNER, owner=True)  # fmt: skip
    s = world.summarize([said])
    world.apply(world.result(
        [said], summary=s.id,
        facts=[fact(bob, "is allergic to walnuts", [said.id], kind="need"),
               fact(carol, "has no allergies", [said.id], kind="need")],
        gaps=[{"entity": bob, "description": "order walnut-free cake", "evidence": [said.id]}],
    ))  # fmt: skip
    (about_bob,) = profiles.current(world.conn, bob)
    (gap,) = gaps.listing(world.conn)
    preview = plan_erasure(world.conn, "entity", bob)
    assert about_bob.id in preview.fact_ids and gap.id in preview.gap_ids
    receipt = erase(world.store, kind="entity", target=bob, reason="asked",
                    requested_by="owner", stream_id="78-1")  # fmt: skip
    assert about_bob.id in receipt["facts"] and gap.id in receipt["gaps"]
    assert profiles.current(world.conn, bob) == []
    assert [f.text for f in profiles.current(world.conn, carol)] == ["has no allergies"]
    assert gaps.listing(world.conn, include_closed=True) == []
    blank = profiles.by_id(world.conn, about_bob.id)
    assert blank is not None and blank.text == "" and blank.erased == receipt["erasure"]
    # the owner's own words stay: an erasure of Bob takes his rows and his profile, not hers


def test_a_retirement_judged_by_an_erased_range_is_taken_back(world: World) -> None:
    """Bob's DM: "I love espresso" (a fact), later "I quit espresso: stomach ulcer" (a job
    retires it, the why quoting the ulcer). Erasing the later rows takes the judgement back: the
    fact is current again, the why gone from the database."""
    a = world.say("I love espresso")
    bob = str(a.entity)
    world.apply(world.result([a], summary=world.summarize([a]).id,
                             facts=[fact(bob, "loves espresso", [a.id])]))  # fmt: skip
    (loved,) = profiles.current(world.conn, bob)
    b = world.say("I quit espresso: stomach ulcer")
    done = world.apply(world.result([b], summary=world.summarize([b]).id, retire=[
        {"id": loved.id, "why": "he quit espresso: stomach ulcer"}]))  # fmt: skip
    assert done.retired == 1 and profiles.current(world.conn, bob) == []
    world.erase_rows(b)
    back = profiles.by_id(world.conn, loved.id)
    assert back is not None and back.current and back.retired_why is None
    world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert b"ulcer" not in database_bytes(world)


def test_a_fact_made_from_a_range_goes_with_an_uncited_row_of_it(world: World) -> None:
    """The job read "for my cancer treatment" but cited only "I move to Berlin in May": erasing
    the uncited row takes the fact (its words may be that row's), and the new version that kept
    its text; the range is derived again from what remains."""
    a = world.say("I move to Berlin in May")
    b = world.say("for my cancer treatment")
    bob = str(a.entity)
    world.apply(world.result([a, b], summary=world.summarize([a, b]).id, facts=[
        fact(bob, "moves to Berlin for cancer treatment", [a.id], kind="event")]))  # fmt: skip
    (moved,) = profiles.current(world.conn, bob)
    c = world.say("Berlin in May, yes")
    world.apply(world.result([c], summary=world.summarize([c]).id, facts=[
        fact(bob, "moving to Berlin", [c.id], kind="event", same_as=moved.id)]))  # fmt: skip
    (version,) = profiles.current(world.conn, bob)
    assert version.supersedes == moved.id and version.text == moved.text
    receipt = world.erase_rows(b)
    assert receipt["facts"] == [moved.id, version.id]
    assert profiles.current(world.conn, bob) == []
    world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert b"cancer" not in database_bytes(world)


def test_a_later_range_whose_version_went_with_an_older_row_is_derived_again(
    world: World,
) -> None:
    """Range 1 learnt "likes tea" (row a); range 2 said it again (row c): a new version resting on
    a and c. Erasing row a takes both versions, and range 2, whose own row still says it, is
    derived again (its summary unchanged: a new run key, ``/a1``), so the fact comes back from
    what remains."""
    a = world.say("I like tea")
    bob = str(a.entity)
    world.apply(world.result([a], summary=world.summarize([a]).id,
                             facts=[fact(bob, "likes tea", [a.id])]))  # fmt: skip
    c = world.say("tea, always tea")
    s2 = world.summarize([c])
    world.apply(
        world.result(
            [c], summary=s2.id, facts=[fact(bob, "drinks tea", [c.id], same_as=only(bob, world).id)]
        )
    )
    assert only(bob, world).evidence == (a.id, c.id)
    assert pending(world.conn, 10) == []
    receipt = world.erase_rows(a)
    assert len(receipt["facts"]) == 2 and profiles.current(world.conn, bob) == []
    (todo,) = pending(world.conn, 10)
    assert (todo.summary, todo.again) == (s2.id, 1)
    again = world.result([c], summary=s2.id, facts=[fact(bob, "drinks tea", [c.id])])
    again = again.model_copy(update={"again": 1, "run_key": run_key(
        c.conversation, c.id, c.id, s2.id, 1)})  # fmt: skip
    assert world.apply(again).added == 1 and pending(world.conn, 10) == []
    assert [f.text for f in profiles.current(world.conn, bob)] == ["drinks tea"]


def test_what_a_run_wrote_after_it_was_shown_an_erased_fact_or_gap_goes(world: World) -> None:
    """A later run's questions showed the model a fact ("malignant tumour") and a gap ("find an
    oncologist for the malignant tumour"); its retirement's why and its new gap took their words.
    Erasing the older row takes them back: the retirement undone, the new gap blanked, the run
    derived again; a result in flight that read the erased fact is refused (derived again)."""
    trip_row = world.say("I'm planning a trip to Oslo in May")
    bob = str(trip_row.entity)
    world.apply(world.result([trip_row], summary=world.summarize([trip_row]).id,
                             facts=[fact(bob, "plans a trip to Oslo", [trip_row.id])]))  # fmt: skip
    trip = only(bob, world)
    x = world.say("the tumour is malignant, find me an oncologist")
    r1 = world.reply(x, "I can't search the web")
    world.apply(world.result(
        [x, r1], summary=world.summarize([x, r1]).id,
        facts=[fact(bob, "has a malignant tumour", [x.id], kind="event")],
        gaps=[{"entity": bob, "description": "find an oncologist (malignant tumour)",
               "evidence": [x.id, r1.id]}]))  # fmt: skip
    tumour = next(f for f in profiles.current(world.conn, bob) if "tumour" in f.text)
    (older_gap,) = gaps.listing(world.conn)
    z = world.say("I cancelled the trip, still need that appointment")
    r2 = world.reply(z, "I can't book appointments")
    s3 = world.summarize([z, r2])
    later = world.result(
        [z, r2],
        summary=s3.id,
        retire=[{"id": trip.id, "why": "cancelled: malignant tumour"}],
        gaps=[
            {
                "entity": bob,
                "description": "book the malignant-tumour oncologist visit",
                "evidence": [z.id, r2.id],
                "needs": "booking",
            }
        ],
    ).model_copy(update={"read_facts": [trip.id, tumour.id], "read_gaps": [older_gap.id]})
    assert world.apply(later).retired == 1
    receipt = world.erase_rows(x)
    assert older_gap.id in receipt["gaps"] and len(receipt["gaps"]) == 2
    back = profiles.by_id(world.conn, trip.id)
    assert back is not None and back.current and back.retired_why is None
    assert gaps.listing(world.conn, include_closed=True) == []
    assert any(p.summary == s3.id and p.again == 1 for p in pending(world.conn, 10))
    world.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert b"malignant" not in database_bytes(world)


def test_a_result_that_read_a_fact_erased_since_is_refused(world: World) -> None:
    a = world.say("my HIV meds make me tired")
    bob = str(a.entity)
    world.apply(world.result([a], summary=world.summarize([a]).id,
                             facts=[fact(bob, "takes HIV medication", [a.id])]))  # fmt: skip
    read = only(bob, world)
    b = world.say("I sleep a lot")
    in_flight = world.result(
        [b], summary=world.summarize([b]).id, facts=[fact(bob, "sleeps a lot (HIV meds)", [b.id])]
    ).model_copy(update={"read_facts": [read.id]})
    world.erase_rows(a)
    with pytest.raises(Refused, match="erased since"):
        world.apply(in_flight)
