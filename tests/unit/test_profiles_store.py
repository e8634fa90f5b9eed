"""Layer 2's store (memory/profiles.py, migration 19): facts applied idempotently, versions that
supersede, contradictions kept with the conflict visible, evidence inside the job's range, the
source privacy read from the log, and a fact shown only where every piece of its evidence may be."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage, Privacy, Reply
from memory import profiles, summaries
from memory.identity import OWNER, OwnerResolver
from memory.identity_writer import Identity
from memory.privacy import Scope
from memory.rows import LogRow
from memory.store import MemoryStore

_n = itertools.count(1)
BOB_DM = "matrix:dm-bob"
CAROL_DM = "matrix:dm-carol"
TEAM = "matrix:team"
BOB = "@bob:m.org"
CAROL = "@carol:m.org"


class World:
    def __init__(self, home: Path) -> None:
        self.store = MemoryStore(home / "memory.sqlite3")
        self.identity = Identity(OwnerResolver([]), "Ada")

    @property
    def conn(self) -> sqlite3.Connection:
        return self.store.conn

    def say(
        self, text: str, *, conversation: str = BOB_DM, sender: str = BOB,
        privacy: Privacy = Privacy.DIRECT,
    ) -> LogRow:  # fmt: skip
        n = next(_n)
        msg = InboundMessage(
            channel="matrix", session=conversation, conversation=conversation, sender=sender,
            privacy=privacy, text=text, ts=1_795_000_000.0 + n, event_id=f"ev{n}",
        )  # fmt: skip
        with self.store.transaction():
            return self.identity.append_inbound(self.store, msg, f"matrix/{n}-0", is_owner=False)

    def reply(self, row: LogRow, text: str) -> LogRow:
        with self.store.transaction():
            return self.store.append_reply(
                Reply(
                    reply_id=f"r{row.id}", answers=row.stream_id, channel=row.channel,
                    session=row.session, conversation=row.conversation, text=text,
                    created=row.ts + 1,
                ),
                sender="relaybot",
                privacy=Privacy(row.privacy),
            )  # fmt: skip

    def apply(self, p: profiles.Proposal) -> profiles.Fact | str:
        with self.store.transaction():
            return profiles.apply(self.conn, p)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def proposal(
    entity: str, rows: list[LogRow], text: str = "likes tea", **kw: Any
) -> profiles.Proposal:
    first, last = kw.pop("first", rows[0].id), kw.pop("last", rows[-1].id)
    conv = kw.pop("conversation", rows[0].conversation)
    index = kw.pop("index", 0)
    return profiles.Proposal(
        entity=entity, kind=kw.pop("kind", "preference"), text=text,
        confidence=kw.pop("confidence", 0.8), evidence=kw.pop("evidence", (rows[0].id,)),
        conversation=conv, first_id=first, last_id=last,
        job_key=kw.pop("job_key", profiles.job_key(f"profile:{conv}@{first}-{last}/s-", index)),
        **kw,
    )  # fmt: skip


def fact(result: profiles.Fact | str) -> profiles.Fact:
    assert isinstance(result, profiles.Fact), result
    return result


def test_apply_stores_the_fact_with_its_evidence_and_privacy(world: World) -> None:
    a = world.say("I only drink green tea")
    b = world.reply(a, "noted")
    bob = a.entity
    assert bob is not None
    f = fact(world.apply(proposal(bob, [a, b], evidence=(a.id, b.id))))
    assert (f.entity, f.kind, f.text, f.confidence) == (bob, "preference", "likes tea", 0.8)
    assert f.evidence == (a.id, b.id)
    assert f.source_privacy == "direct"
    assert (f.first_seen, f.last_seen) == (a.ts, b.ts)
    assert f.current and f.supersedes is None and f.conflicts_with is None
    assert profiles.current(world.conn, bob) == [f]


def test_apply_is_idempotent_on_the_job_key(world: World) -> None:
    a = world.say("I only drink green tea")
    p = proposal(str(a.entity), [a])
    first = fact(world.apply(p))
    again = fact(world.apply(p))
    assert again == first
    n = world.conn.execute("SELECT count(*) FROM profile_facts").fetchone()[0]
    assert n == 1
    assert world.conn.execute("SELECT count(*) FROM profile_evidence").fetchone()[0] == 1


def test_a_new_version_supersedes_and_inherits_the_evidence(world: World) -> None:
    a = world.say("I like tea")
    b = world.say("green tea, in fact, never black")
    bob = str(a.entity)
    v1 = fact(world.apply(proposal(bob, [a], "likes tea")))
    v2 = fact(world.apply(proposal(bob, [b], "likes green tea, never black", supersedes=v1.id)))
    assert v2.supersedes == v1.id and v2.conflicts_with is None
    assert v2.evidence == (a.id, b.id)  # what the new text was written knowing
    assert v2.first_seen == a.ts and v2.last_seen == b.ts
    assert profiles.current(world.conn, bob) == [v2]
    old, new = profiles.history(world.conn, bob)
    assert old.id == v1.id and old.superseded_by == v2.id and not old.current
    assert new == v2
    # a superseded fact cannot be superseded again: one current version
    c = world.say("and oolong")
    refused = world.apply(proposal(bob, [c], "oolong", supersedes=v1.id))
    assert isinstance(refused, str) and "not a current fact" in refused
    v3 = fact(world.apply(proposal(bob, [c], "green tea and oolong", supersedes=v2.id)))
    assert [f.id for f in profiles.current(world.conn, bob)] == [v3.id]
    assert [f.supersedes for f in profiles.history(world.conn, bob)] == [None, v1.id, v2.id]


def test_a_contradiction_keeps_both_and_the_conflict_is_visible(world: World) -> None:
    a = world.say("I live in Lyon")
    b = world.say("I moved to Oslo")
    bob = str(a.entity)
    old = fact(world.apply(proposal(bob, [a], "lives in Lyon", kind="identity")))
    new = fact(world.apply(proposal(bob, [b], "lives in Oslo", kind="identity",
                                    contradicts=old.id)))  # fmt: skip
    assert new.conflicts_with == old.id and new.supersedes == old.id
    assert new.evidence == (b.id,)  # it does not rest on what it contradicts
    assert profiles.current(world.conn, bob) == [new]
    assert [f.text for f in profiles.history(world.conn, bob)] == ["lives in Lyon", "lives in Oslo"]
    shown = profiles.conflict_of(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), new)
    assert shown is not None and shown.text == "lives in Lyon"
    both = world.apply(proposal(bob, [b], "x", supersedes=new.id, contradicts=new.id, index=1))
    assert isinstance(both, str)


def test_evidence_outside_the_range_is_refused(world: World) -> None:
    a = world.say("one")
    b = world.say("two")
    c = world.say("three")
    bob = str(a.entity)
    out = world.apply(proposal(bob, [a, b], evidence=(c.id,)))
    assert isinstance(out, str) and "outside the range" in out
    other = world.say("elsewhere", conversation=CAROL_DM, sender=CAROL)
    wrong = world.apply(proposal(bob, [a, c], evidence=(other.id,), first=a.id, last=other.id))
    assert isinstance(wrong, str) and "not a message of" in wrong
    none = world.apply(proposal(bob, [a, b], evidence=()))
    assert isinstance(none, str) and "without evidence" in none
    assert world.conn.execute("SELECT count(*) FROM profile_facts").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"kind": "hobby"}, "not one of the kinds"),
        ({"confidence": 1.5}, "outside 0..1"),
        ({"confidence": float("nan")}, "not a number"),
        ({"text": "  "}, "empty fact"),
        ({"text": "x" * 501}, "at most"),
        ({"entity": "e-nobody"}, "entity memory does not know"),
        ({"supersedes": 999}, "not a current fact"),
    ],
)
def test_a_malformed_proposal_is_refused(world: World, change: dict[str, Any], reason: str) -> None:
    a = world.say("hello")
    kw: dict[str, Any] = {"entity": str(a.entity), **change}
    entity = kw.pop("entity")
    out = world.apply(proposal(entity, [a], **kw))
    assert isinstance(out, str) and reason in out, out


def test_the_source_privacy_is_the_most_private_of_its_evidence(world: World) -> None:
    g = world.say("hi all", conversation=TEAM, privacy=Privacy.GROUP)
    d = world.say("between us", conversation=TEAM, privacy=Privacy.DIRECT)  # the room narrowed
    f = fact(world.apply(proposal(str(g.entity), [g, d], evidence=(g.id, d.id))))
    assert f.source_privacy == "direct"


def test_the_database_refuses_edits_and_deletes(world: World) -> None:
    a = world.say("I like tea")
    f = fact(world.apply(proposal(str(a.entity), [a])))
    for sql in (
        "UPDATE profile_facts SET text = 'x' WHERE id = ?",
        "UPDATE profile_facts SET confidence = 0.1 WHERE id = ?",
        "DELETE FROM profile_facts WHERE id = ?",
        "DELETE FROM profile_evidence WHERE fact = ?",
        "UPDATE profile_evidence SET log_id = 1 WHERE fact = ?",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            world.conn.execute(sql, (f.id,))


def test_a_fact_from_bobs_dm_is_shown_only_in_bobs_dm_and_to_the_owner(world: World) -> None:
    a = world.say("my vault code is QX-5531")
    bob = str(a.entity)
    c = world.say("hello", conversation=CAROL_DM, sender=CAROL)
    carol = str(c.entity)
    g = world.say("hi team", conversation=TEAM, privacy=Privacy.GROUP)
    private = fact(world.apply(proposal(bob, [a], "keeps a vault code")))
    public = fact(world.apply(proposal(bob, [g], "is in the team", kind="relationship")))
    scopes = {
        "owner": Scope("cli:local", Privacy.OWNER, OWNER),
        "bob dm": Scope(BOB_DM, Privacy.DIRECT, bob),
        "bob elsewhere": Scope("email:thread-bob", Privacy.DIRECT, bob),
        "carol dm": Scope(CAROL_DM, Privacy.DIRECT, carol),
        "team": Scope(TEAM, Privacy.GROUP),
        "broken": Scope("", Privacy.GROUP),
    }
    seen = {
        name: [f.id for f in profiles.visible(world.conn, s, bob)] for name, s in scopes.items()
    }
    assert seen == {
        "owner": [private.id, public.id],
        "bob dm": [private.id, public.id],
        "bob elsewhere": [private.id, public.id],  # both rest on Bob's own words only
        "carol dm": [],
        "team": [public.id],
        "broken": [],
    }
    for name, s in scopes.items():  # the SQL and the one-fact rule agree
        for f in (private, public):
            assert profiles.shown(world.conn, s, f) == (f.id in seen[name]), (name, f.text)


def test_every_piece_of_evidence_must_be_visible(world: World) -> None:
    a = world.say("I am Bob")
    r = world.reply(a, "hello Bob, I am the assistant")
    bob = str(a.entity)
    f = fact(world.apply(proposal(bob, [a, r], "is called Bob", kind="identity",
                                  evidence=(a.id, r.id))))  # fmt: skip
    # in Bob's own DM both are visible; elsewhere with Bob only his words are: not shown
    assert [
        x.id for x in profiles.visible(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), bob)
    ] == [f.id]
    elsewhere = Scope("email:thread-bob", Privacy.DIRECT, bob)
    assert profiles.visible(world.conn, elsewhere, bob) == []
    assert not profiles.shown(world.conn, elsewhere, f)


def test_a_version_from_a_dm_does_not_reach_the_group_its_old_version_came_from(
    world: World,
) -> None:
    g = world.say("I like tea", conversation=TEAM, privacy=Privacy.GROUP)
    bob = str(g.entity)
    d = world.say("only green tea, my doctor says so")
    v1 = fact(world.apply(proposal(bob, [g], "likes tea")))
    v2 = fact(
        world.apply(proposal(bob, [d], "likes green tea (doctor's advice)", supersedes=v1.id))
    )
    assert v2.source_privacy == "direct"
    assert profiles.visible(world.conn, Scope(TEAM, Privacy.GROUP), bob) == []
    assert [
        f.id for f in profiles.visible(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), bob)
    ] == [v2.id]


# -- through the facade (the worker) and the read-only view (the application) -------------------


class _Role:
    role = None
    project = None
    teams = ()


def test_the_facade_and_the_view_of_layer_2(tmp_path: Path) -> None:
    from memory.facade import Memory, MemorySettings
    from memory.profile_apply import result_of, run_key
    from memory.view import MemoryView

    world = World(tmp_path)
    a = world.say("look up the train times, and I love jazz")
    bob = str(a.entity)
    settings = MemorySettings(
        owner_name="Ada", owner_aliases=[], workspace=tmp_path, assistant_name="relaybot",
        system_prompt="", context_tokens=4000, roles=lambda _c, _s: _Role(),
    )  # fmt: skip
    memory = Memory(world.store, settings)
    s = summaries.apply(world.conn, summaries.Proposal(
        conversation=BOB_DM, first_id=a.id, last_id=a.id, text="Bob asked for trains",
        method="model", job_key="k1", rows=1))  # fmt: skip
    (todo,) = memory.pending_profiles(5) or []
    assert todo.summary == s.id
    before = memory.gaps_signature()
    result = result_of({
        "type": "profile", "run_key": run_key(BOB_DM, a.id, a.id, s.id), "conversation": BOB_DM,
        "first_id": a.id, "last_id": a.id, "summary": s.id, "method": "model",
        "facts": [{"entity": bob, "kind": "preference", "text": "loves jazz", "confidence": 0.8,
                   "evidence": [a.id]}],
        "gaps": [{"entity": bob, "description": "train times", "needs": "web_search",
                  "evidence": [a.id]}],
    })  # fmt: skip
    with memory.write():
        done = memory.apply_profile(result)
    memory.settle()
    assert not isinstance(done, str) and (done.added, done.gaps_new) == (1, 1)
    assert memory.pending_profiles(5) == []
    assert memory.gaps_signature() != before
    (gap,) = memory.open_gaps() or []
    with MemoryView(world.store.path) as view:
        assert [f.text for f in view.profile_facts(None)] == ["loves jazz"]
        assert [f.text for f in view.profile_facts("matrix:@bob:m.org")] == ["loves jazz"]
        assert view.profile_facts(OWNER) == []
        with pytest.raises(LookupError):
            view.profile_facts("matrix:@nobody:m.org")
        assert [g.id for g in view.gaps()] == [gap.id]
        assert view.profile_counts() == {"facts": 1, "entities": 1, "open_gaps": 1, "runs": 1,
                                         "pending": 0}  # fmt: skip
    with memory.write():
        assert memory.close_gaps_covered(["web_search"]) == [gap.id]
    memory.settle()
    assert memory.open_gaps() == []
    with MemoryView(world.store.path) as view:
        assert [g.status for g in view.gaps(include_closed=True)] == ["closed"]
    # a stale result (its summary erased meanwhile) is refused whole, with why
    other = {"run_key": run_key(BOB_DM, a.id, a.id, s.id + 1), "summary": s.id + 1}
    with memory.write():
        assert "no longer current" in str(memory.apply_profile(result.model_copy(update=other)))
    memory.settle()
    world.store.close()
