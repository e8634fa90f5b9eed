"""What a reply was shown of layer 2 (a fact, a contradicted fact it quoted) goes with an erasure
that takes that fact (memory/derived.py, memory/provenance.py ``facts``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import Privacy, Reply
from memory import profiles, summaries
from memory.erasure import erase, plan_erasure
from memory.privacy import Scope
from memory.profile_apply import apply_result, result_of, run_key
from memory.provenance import DrewOn
from memory.rows import LogRow
from tests.support.profiles_world import BOB_DM, HOME, World

_e = itertools.count(1)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def summarize(world: World, rows: list[LogRow]) -> int:
    conv, first, last = rows[0].conversation, rows[0].id, rows[-1].id
    live = summaries.live_rows(world.conn, conv, first, last)
    p = summaries.Proposal(
        conversation=conv, first_id=first, last_id=last, text="they talked about things",
        method="model", job_key=summaries.job_key(conv, first, last, 1), rows=len(live),
    )  # fmt: skip
    with world.store.transaction():
        return summaries.apply(world.conn, p).id


def derive(
    world: World,
    rows: list[LogRow],
    facts: list[dict[str, Any]],
    retire: list[dict[str, Any]] = (),  # type: ignore[assignment]
    gaps: list[dict[str, Any]] = (),
) -> None:  # type: ignore[assignment]
    """A range's job result applied as the worker applies it (a real run row, run key)."""
    s = summarize(world, rows)
    conv, lo, hi = rows[0].conversation, rows[0].id, rows[-1].id
    result = result_of({
        "type": "profile", "run_key": run_key(conv, lo, hi, s), "conversation": conv,
        "first_id": lo, "last_id": hi, "summary": s, "method": "model", "note": "",
        "facts": facts, "gaps": list(gaps), "retire": list(retire),
    })  # fmt: skip
    with world.store.transaction():
        apply_result(world.conn, result)


def fact(entity: str, text: str, evidence: list[int], **kw: Any) -> dict[str, Any]:
    return {"entity": entity, "kind": kw.pop("kind", "preference"), "text": text,
            "confidence": kw.pop("confidence", 0.8), "evidence": evidence, **kw}  # fmt: skip


def record_reply(world: World, row: LogRow, text: str, drew: DrewOn) -> LogRow:
    with world.store.transaction():
        return world.store.append_reply(
            Reply(reply_id=f"r{row.id}", answers=row.stream_id, channel=row.channel,
                  session=row.session, conversation=row.conversation, text=text,
                  created=row.ts + 1),
            sender="relaybot", privacy=Privacy(row.privacy), extra=drew.as_extra(),
        )  # fmt: skip


def erase_ids(world: World, *ids: int) -> dict[str, Any]:
    return erase(world.store, kind="id", target=",".join(str(i) for i in ids), reason="asked",
                 requested_by="owner", stream_id=f"{next(_e)}-9")  # fmt: skip


def test_a_reply_shown_a_contradiction_quotes_the_older_fact_and_goes_with_its_evidence(
    world: World,
) -> None:
    """The section's line for a contradiction quotes the older fact's text; the reply drew on
    that text, so an erasure of the older fact's evidence must take the reply (hop 1)."""
    a = world.say("I'm vegetarian, and my HIV meds make me careful", name="Bob")
    bob = str(a.entity)
    derive(world, [a], [fact(bob, "Bob is vegetarian because of his HIV medication", [a.id])])
    (old,) = profiles.current(world.conn, bob)
    b = world.say("I eat fish again")
    derive(world, [b], [fact(bob, "Bob eats fish again", [b.id], contradicts=old.id)])
    # the owner's terminal asks the profile tool about Bob
    drew = DrewOn()
    asked = world.say("what do you know about Bob?", HOME, Privacy.OWNER, sender="ada")
    shown = world.tool(Scope(HOME, Privacy.OWNER), drew=drew, entity="Bob")
    assert "HIV medication" in shown  # the contradicted fact's text, quoted in the line
    reply = record_reply(
        world,
        asked,
        "Bob eats fish again (he was vegetarian due to HIV meds)",
        DrewOn(history_from=asked.id, rows=drew.rows, facts=drew.facts),
    )
    # what the reply was shown rests on log a too
    assert a.id in drew.rows, f"drew on {sorted(drew.rows)}: the quoted fact's evidence is missing"
    plan = plan_erasure(world.conn, "id", str(a.id))
    assert reply.id in plan.derived_ids


def test_a_reply_shown_a_fact_goes_when_the_fact_goes_with_an_uncited_row_of_its_range(
    world: World,
) -> None:
    """Round 1: a fact a job made from a range holding an erased row goes, cited or not (its
    words may be the erased row's). A reply that was shown that fact holds the same words, yet it
    drew only on the cited rows, so it stays."""
    a = world.say("keep it between us: I was diagnosed with HIV", name="Bob")
    b = world.say("so I have to be careful with raw food")
    bob = str(a.entity)
    # the model cited only b; its text carries a's words
    derive(world, [a, b], [fact(bob, "Bob has HIV and avoids raw food", [b.id], kind="need")])
    drew = DrewOn()
    asked = world.say("anything about Bob I should know for the dinner?", HOME, Privacy.OWNER,
                      sender="ada")  # fmt: skip
    shown = world.tool(Scope(HOME, Privacy.OWNER), drew=drew, entity="Bob")
    assert "HIV" in shown
    drew.history_from = asked.id
    reply = record_reply(world, asked, "Bob has HIV, so no raw food for him", drew)
    plan = plan_erasure(world.conn, "id", str(a.id))
    assert plan.fact_ids  # the fact goes ...
    receipt = erase_ids(world, a.id)
    text = world.conn.execute("SELECT text FROM log WHERE id = ?", (reply.id,)).fetchone()[0]
    # ... and so must the reply that repeated it
    assert "HIV" not in text, (receipt.get("derived"), plan.derived_ids)


def test_a_fact_from_an_owner_range_is_not_shown_to_bob(world: World) -> None:
    """Held: the owner's range (a reply there repeating Bob's DM secret) gives an owner-class
    fact, shown to the owner only, even when its text is Bob's and Bob asks in his DM."""
    b = world.say("secret: I am moving to Lisbon", name="Bob")
    bob = str(b.entity)
    q = world.say("what did Bob tell you?", HOME, Privacy.OWNER, sender="ada")
    y = world.reply(q, "Bob said he is moving to Lisbon")
    derive(world, [q, y], [fact(bob, "Bob is moving to Lisbon", [y.id], kind="event")])
    (f,) = profiles.current(world.conn, bob)
    assert f.source_privacy == "owner"
    for args in ({}, {"entity": "Bob"}, {"entity": bob}):
        assert "Lisbon" not in world.tool(Scope(BOB_DM, Privacy.DIRECT, bob), **args)
    ctx = world.context("where do I live?")
    assert "Bob is moving to Lisbon" not in ctx  # (his own message "moving to Lisbon" is there)
