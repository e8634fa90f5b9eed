"""A range's profile result applied (memory/profile_apply.py) on a real SQLite store: idempotent on
the run key, every fact checked again (one bad fact refused and counted, the rest applied), the
same insight as a new version of the chain's head, contradictions, retirements, one current
version when results race, and the planner's pending ranges."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage, Privacy, Reply
from memory import profiles, summaries
from memory.erasure import erase
from memory.identity import OWNER, OwnerResolver
from memory.identity_writer import Identity
from memory.privacy import Scope
from memory.profile_apply import (
    Applied,
    RangeResult,
    Refused,
    apply_result,
    counts,
    pending,
    result_of,
    run_key,
)
from memory.rows import LogRow
from memory.store import MemoryStore

_n = itertools.count(1)
_e = itertools.count(1)
BOB_DM = "matrix:dm-bob"
CAROL_DM = "matrix:dm-carol"
TEAM = "matrix:team"
BOB = "@bob:m.org"
CAROL = "@carol:m.org"
OWNER_DM = "matrix:dm-me"


class World:
    """A store, people who say things, summaries over their ranges, results applied."""

    def __init__(self, home: Path) -> None:
        self.store = MemoryStore(home / "memory.sqlite3")
        self.identity = Identity(OwnerResolver(["@me:m.org"]), "Ada")

    @property
    def conn(self) -> sqlite3.Connection:
        return self.store.conn

    def say(
        self, text: str, *, conversation: str = BOB_DM, sender: str = BOB,
        privacy: Privacy = Privacy.DIRECT, owner: bool = False,
    ) -> LogRow:  # fmt: skip
        n = next(_n)
        msg = InboundMessage(
            channel="matrix", session=conversation, conversation=conversation, sender=sender,
            privacy=privacy, text=text, ts=1_795_000_000.0 + n * 10, event_id=f"ev{n}",
        )  # fmt: skip
        with self.store.transaction():
            return self.identity.append_inbound(self.store, msg, f"matrix/{n}-0", is_owner=owner)

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

    def summarize(self, rows: list[LogRow], version: int = 1) -> summaries.Summary:
        conv, first, last = rows[0].conversation, rows[0].id, rows[-1].id
        live = summaries.live_rows(self.conn, conv, first, last)
        p = summaries.Proposal(
            conversation=conv, first_id=first, last_id=last, text="they talked about tea",
            method="model", job_key=summaries.job_key(conv, first, last, version), rows=len(live),
        )  # fmt: skip
        with self.store.transaction():
            return summaries.apply(self.conn, p)

    def result(
        self, rows: list[LogRow], *, summary: int | None = None, facts: list[dict[str, Any]] = (),  # type: ignore[assignment]
        gaps: list[dict[str, Any]] = (), retire: list[dict[str, Any]] = (),  # type: ignore[assignment]
        first: int | None = None, last: int | None = None, method: str = "model",
    ) -> RangeResult:  # fmt: skip
        conv = rows[0].conversation
        lo = rows[0].id if first is None else first
        hi = rows[-1].id if last is None else last
        return result_of({
            "type": "profile", "run_key": run_key(conv, lo, hi, summary), "conversation": conv,
            "first_id": lo, "last_id": hi, "summary": summary, "method": method, "note": "",
            "facts": list(facts), "gaps": list(gaps), "retire": list(retire),
        })  # fmt: skip

    def apply(self, result: RangeResult) -> Applied:
        with self.store.transaction():
            return apply_result(self.conn, result)

    def erase_rows(self, *rows: LogRow) -> dict[str, Any]:
        return erase(
            self.store, kind="id", target=",".join(str(r.id) for r in rows), reason="asked",
            requested_by="owner", stream_id=f"{next(_e)}-7",
        )  # fmt: skip

    def count(self, table: str) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def fact(
    entity: str, text: str, evidence: list[int], **kw: Any
) -> dict[str, Any]:  # fmt: skip
    return {"entity": entity, "kind": kw.pop("kind", "preference"), "text": text,
            "confidence": kw.pop("confidence", 0.6), "evidence": evidence, **kw}  # fmt: skip


def only(entity: str, world: World) -> profiles.Fact:
    (f,) = profiles.current(world.conn, entity)
    return f


def test_a_replayed_result_adds_nothing(world: World) -> None:
    a = world.say("I only drink green tea")
    b = world.reply(a, "noted")
    bob = str(a.entity)
    s = world.summarize([a, b])
    result = world.result([a, b], summary=s.id, facts=[fact(bob, "drinks green tea", [a.id])],
                          gaps=[{"entity": bob, "description": "wants tea ordered",
                                 "evidence": [a.id], "needs": "shopping"}])  # fmt: skip
    first = world.apply(result)
    assert (first.added, first.gaps_new, first.replayed) == (1, 1, False)
    tables = {t: world.count(t) for t in ("profile_facts", "profile_evidence", "capability_gaps",
                                          "gap_evidence", "profile_runs")}  # fmt: skip
    again = world.apply(result)
    assert again.replayed and again.run == first.run
    assert (again.added, again.gaps_new, again.superseded) == (1, 1, 0)
    assert {t: world.count(t) for t in tables} == tables
    (run,) = world.conn.execute("SELECT facts, gaps, refused, summary FROM profile_runs")
    assert tuple(run) == (1, 1, 0, s.id)


def test_every_fact_is_checked_again_and_a_bad_one_is_refused_alone(world: World) -> None:
    a = world.say("I like tea")
    gone = world.say("my password is hunter2")
    elsewhere = world.say("hello", conversation=CAROL_DM, sender=CAROL)  # inside a..b's ids
    b = world.say("and biscuits")
    after = world.say("later")
    bob = str(a.entity)
    world.erase_rows(gone)
    s = world.summarize([a, b])  # re-derived over what remains: a hole where gone was
    bad = [
        fact(bob, "outside", [after.id]),
        fact(bob, "another conversation", [elsewhere.id]),
        fact(bob, "erased", [gone.id]),
        fact("e-00000000", "nobody", [a.id]),
        fact(bob, "a hobby", [a.id], kind="hobby"),
        fact(bob, "not a number", [a.id], confidence=float("nan")),
        fact(bob, "too sure", [a.id], confidence=2.0),
        fact(bob, "x" * 501, [a.id]),
        fact(bob, "", [a.id]),
        fact(bob, "no evidence", []),
        fact(bob, "both", [a.id], same_as=1, contradicts=1),
    ]
    good = fact(bob, "likes tea and biscuits", [a.id, b.id])
    done = world.apply(world.result([a, b], summary=s.id, facts=[*bad[:5], good, *bad[5:]]))
    assert done.added == 1
    assert len(done.refused) == len(bad)
    reasons = " | ".join(done.refused)
    for why in ("outside the range", "not a message of", "was erased", "does not know",
                "not one of the kinds", "not a number", "outside 0..1", "at most", "empty fact",
                "without evidence", "not both"):  # fmt: skip
        assert why in reasons, why
    assert [f.text for f in profiles.current(world.conn, bob)] == ["likes tea and biscuits"]
    assert world.conn.execute("SELECT refused FROM profile_runs").fetchone()[0] == len(bad)


def test_the_same_insight_is_a_new_version_keeping_the_old_text(world: World) -> None:
    a = world.say("I like tea")
    b = world.say("tea again, always")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "Likes tea", [a.id], confidence=0.9)]))
    old = only(bob, world)
    fond = fact(bob, "is fond of tea", [b.id], confidence=0.5, same_as=old.id, kind="event")
    done = world.apply(world.result([b], facts=[fond]))
    assert done.superseded == 1 and done.added == 0
    new = only(bob, world)
    assert (new.text, new.kind, new.supersedes, new.conflicts_with) == (
        "Likes tea", "preference", old.id, None)  # fmt: skip
    assert new.evidence == (a.id, b.id)  # union: shown only where both may be
    assert new.confidence == 0.9  # the higher
    assert (new.first_seen, new.last_seen) == (a.ts, b.ts)
    assert profiles.by_id(world.conn, old.id).superseded_by == new.id  # type: ignore[union-attr]


def test_same_as_a_superseded_fact_supersedes_the_current_head(world: World) -> None:
    rows = [world.say(f"tea, {i}") for i in range(3)]
    bob = str(rows[0].entity)
    world.apply(world.result([rows[0]], facts=[fact(bob, "likes tea", [rows[0].id])]))
    v1 = only(bob, world)
    world.apply(world.result([rows[1]], facts=[fact(bob, "tea", [rows[1].id], same_as=v1.id)]))
    v2 = only(bob, world)
    # a job that read v1 before v2 was made names v1: its head, v2, gets the version
    world.apply(world.result([rows[2]], facts=[fact(bob, "tea!", [rows[2].id], same_as=v1.id)]))
    v3 = only(bob, world)
    assert v3.supersedes == v2.id and v3.evidence == tuple(r.id for r in rows)
    assert [f.id for f in profiles.history(world.conn, bob) if f.current] == [v3.id]


def test_same_as_a_retired_or_erased_fact_is_a_new_fact(world: World) -> None:
    a = world.say("I like tea")
    b = world.say("I like chess")
    c = world.say("tea is nice")
    d = world.say("chess is fun")
    bob = str(a.entity)
    world.apply(world.result([a, b], facts=[fact(bob, "likes tea", [a.id]),
                                            fact(bob, "likes chess", [b.id])]))  # fmt: skip
    tea, chess = profiles.current(world.conn, bob)
    world.apply(world.result([c], retire=[{"id": tea.id, "why": "said long ago"}]))
    world.erase_rows(b)
    done = world.apply(world.result([c, d], facts=[
        fact(bob, "enjoys tea", [c.id], same_as=tea.id),
        fact(bob, "enjoys chess", [d.id], same_as=chess.id)]))  # fmt: skip
    assert (done.added, done.superseded, done.refused) == (2, 0, [])
    now = profiles.current(world.conn, bob)
    assert [(f.text, f.supersedes) for f in now] == [("enjoys tea", None), ("enjoys chess", None)]


def test_a_normalized_duplicate_is_the_same_insight(world: World) -> None:
    a = world.say("tea please")
    b = world.say("more tea")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "Likes  tea.", [a.id])]))
    done = world.apply(world.result([b], facts=[fact(bob, "likes tea", [b.id])]))
    assert done.superseded == 1 and done.added == 0
    assert only(bob, world).text == "Likes  tea." and only(bob, world).evidence == (a.id, b.id)
    # seen again from the very same rows (a range derived again): nothing new
    again = world.apply(world.result([b], facts=[fact(bob, "LIKES TEA", [b.id])], summary=None,
                                     first=b.id - 1))  # fmt: skip
    assert (again.superseded, again.added, again.unchanged) == (0, 0, 1)
    assert profiles.normalized("  Likes,   tea!! ") == "likes tea"


def test_a_duplicate_the_range_may_not_see_is_not_merged(world: World) -> None:
    d = world.say("I like tea, between us")
    g = world.say("I like tea", conversation=TEAM, privacy=Privacy.GROUP)
    bob = str(d.entity)
    world.apply(world.result([d], facts=[fact(bob, "likes tea", [d.id])]))
    done = world.apply(world.result([g], facts=[fact(bob, "likes tea", [g.id])]))
    assert done.added == 1  # a fact of its own: the DM's fact stays out of the group
    team = [f.id for f in profiles.visible(world.conn, Scope(TEAM, Privacy.GROUP), bob)]
    assert len(team) == 1 and profiles.by_id(world.conn, team[0]).evidence == (g.id,)  # type: ignore[union-attr]
    # and a job cannot name the DM's fact from the group
    dm_fact = profiles.current(world.conn, bob)[0]
    g2 = world.say("tea again", conversation=TEAM, privacy=Privacy.GROUP)
    out = world.apply(world.result([g2], facts=[fact(bob, "x", [g2.id], same_as=dm_fact.id)]))
    assert out.added == 0 and "may see" in out.refused[0]


def test_a_contradiction_supersedes_and_names_the_old_fact(world: World) -> None:
    a = world.say("I live in Lyon")
    b = world.say("I moved to Oslo")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "lives in Lyon", [a.id], kind="identity")]))
    old = only(bob, world)
    done = world.apply(world.result([b], facts=[
        fact(bob, "lives in Oslo", [b.id], kind="identity", contradicts=old.id)]))  # fmt: skip
    assert done.contradicted == 1
    new = only(bob, world)
    assert (new.text, new.conflicts_with, new.supersedes, new.evidence) == (
        "lives in Oslo", old.id, old.id, (b.id,))  # fmt: skip
    shown = profiles.conflict_of(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), new)
    assert shown is not None and shown.text == "lives in Lyon"


def test_two_results_superseding_one_fact_leave_one_current_version(world: World) -> None:
    a, b, c = (world.say(f"tea {i}") for i in range(3))
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "likes tea", [a.id])]))
    old = only(bob, world)
    r1 = world.result([b], facts=[fact(bob, "tea", [b.id], same_as=old.id)])
    r2 = world.result([c], facts=[fact(bob, "lives on tea", [c.id], contradicts=old.id)])
    world.apply(r1)
    world.apply(r2)
    current = [f for f in profiles.history(world.conn, bob) if f.current]
    assert len(current) == 1 and current[0].conflicts_with == current[0].supersedes
    # the database itself refuses a second successor of one fact
    with pytest.raises(sqlite3.IntegrityError):
        world.conn.execute(
            "INSERT INTO profile_facts (entity, kind, text, confidence, source_privacy, "
            "conversation, first_id, last_id, first_seen, last_seen, method, supersedes, "
            "job_key, created) VALUES (?, 'preference', 't', 0.5, 'direct', ?, 1, 1, 1, 1, "
            "'model', ?, 'raced', 1)",
            (bob, BOB_DM, old.id),
        )


def test_retire_a_fact_judged_no_longer_relevant(world: World) -> None:
    a = world.say("I am in Paris this week")
    b = world.say("back home now")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "is in Paris", [a.id], kind="event")]))
    paris = only(bob, world)
    # a range not after the fact's may not judge it; an unknown fact is refused
    judged = [{"id": paris.id, "why": "old"}, {"id": 999}]
    same = world.apply(world.result([a], first=a.id, last=b.id, retire=judged))
    assert same.retired == 0 and len(same.refused) == 2
    done = world.apply(world.result([b], retire=[{"id": paris.id, "why": "the week is over"}]))
    assert done.retired == 1
    gone = profiles.by_id(world.conn, paris.id)
    assert gone is not None and not gone.current and gone.retired_why == "the week is over"
    assert profiles.current(world.conn, bob) == []
    assert profiles.visible(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), bob) == []
    for sql in (
        "UPDATE profile_facts SET retired = NULL, retired_why = NULL WHERE id = ?",
        "UPDATE profile_facts SET retired = 5 WHERE id = ?",
        "UPDATE profile_facts SET retired_why = 'other' WHERE id = ?",
        "UPDATE profile_facts SET superseded_by = 1 WHERE id = ?",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            world.conn.execute(sql, (paris.id,))


def test_the_database_allows_one_change_of_a_current_fact_only(world: World) -> None:
    a, b = world.say("tea"), world.say("more tea")
    bob = str(a.entity)
    world.apply(world.result([a], facts=[fact(bob, "likes tea", [a.id])]))
    f = only(bob, world)
    for sql in (
        "UPDATE profile_facts SET retired_why = 'why' WHERE id = ?",  # a why without a when
        "UPDATE profile_facts SET superseded_by = id, retired = 1 WHERE id = ?",  # both at once
        "UPDATE profile_facts SET confidence = 0.1 WHERE id = ?",
        "UPDATE profile_facts SET erased = 1 WHERE id = ?",
        "UPDATE profile_facts SET id = id WHERE id = ?",  # no change at all is no change
    ):
        with pytest.raises(sqlite3.IntegrityError):
            world.conn.execute(sql, (f.id,))
    world.apply(world.result([b], facts=[fact(bob, "tea", [b.id], same_as=f.id)]))
    with pytest.raises(sqlite3.IntegrityError):  # a superseded fact cannot be retired
        world.conn.execute("UPDATE profile_facts SET retired = 1 WHERE id = ?", (f.id,))


def test_a_stale_result_is_refused_whole(world: World) -> None:
    a = world.say("I like tea")
    b = world.say("and coffee")
    bob = str(a.entity)
    s = world.summarize([a, b])
    stale = world.result([a, b], summary=s.id, facts=[fact(bob, "likes tea", [a.id])])
    world.erase_rows(b)  # the summary is tombstoned: the job read a range that is gone
    with pytest.raises(Refused, match="was erased since the job read its range"):
        world.apply(stale)
    assert world.count("profile_facts") == 0 and world.count("profile_runs") == 0
    c = world.say("tea", conversation=CAROL_DM, sender=CAROL)
    with pytest.raises(Refused, match="erased"):  # a range without a summary, holding a hole
        world.apply(world.result([a, c], first=a.id, last=b.id))
    wrong = world.summarize([a])
    with pytest.raises(Refused, match="not summary"):
        world.apply(world.result([a, b], summary=wrong.id))


@pytest.mark.parametrize(
    "change",
    [
        {"run_key": "profile:elsewhere@1-2/s-"},
        {"first_id": 9, "last_id": 3},
        {"type": "summary"},
        {"method": "guess"},
        {"facts": [{"entity": "x"}]},
        {"facts": "many"},
        {"first_id": 0},
    ],
)
def test_a_result_that_is_not_one_is_a_value_error(change: dict[str, Any]) -> None:
    good = {"type": "profile", "run_key": run_key("c", 1, 2, None), "conversation": "c",
            "first_id": 1, "last_id": 2, "method": "model"}  # fmt: skip
    assert result_of(good).facts == []
    with pytest.raises(ValueError):  # noqa: PT011 (the reason is the validator's)
        result_of({**good, **change})


def test_pending_offers_current_summaries_without_a_run_oldest_first(world: World) -> None:
    rows = [world.say(f"message {i}") for i in range(6)]
    team = [world.say(f"team {i}", conversation=TEAM, privacy=Privacy.GROUP) for i in range(2)]
    s1 = world.summarize(rows[0:2])
    s3 = world.summarize(team)
    s2 = world.summarize(rows[2:4])
    gone = world.summarize(rows[4:6])
    world.erase_rows(rows[5])  # tombstones its summary: a blanked summary is not pending
    assert [p.summary for p in pending(world.conn, 10)] == [s1.id, s2.id, s3.id]
    assert [p.summary for p in pending(world.conn, 2)] == [s1.id, s2.id]
    assert pending(world.conn, 0) == []
    first = pending(world.conn, 1)[0]
    assert (first.conversation, first.first_id, first.last_id) == (BOB_DM, rows[0].id, rows[1].id)
    world.apply(world.result(rows[0:2], summary=s1.id, method="fallback"))  # nothing learnt
    assert [p.summary for p in pending(world.conn, 10)] == [s2.id, s3.id]
    assert gone.id not in [p.summary for p in pending(world.conn, 10)]
    assert counts(world.conn) == {"facts": 0, "entities": 0, "open_gaps": 0, "runs": 1,
                                  "pending": 2}  # fmt: skip


def test_the_scope_of_a_range(world: World) -> None:
    a = world.say("hi")
    r = world.reply(a, "hello")
    bob = str(a.entity)
    assert profiles.range_scope(world.conn, BOB_DM, a.id, r.id) == Scope(BOB_DM, Privacy.DIRECT,
                                                                         bob)  # fmt: skip
    only_reply = world.reply(world.say("x"), "y")
    assert profiles.range_scope(world.conn, BOB_DM, only_reply.id, only_reply.id).entity == bob
    g = world.say("hi all", conversation=TEAM, privacy=Privacy.GROUP)
    d = world.say("psst", conversation=TEAM, privacy=Privacy.DIRECT)
    assert profiles.range_scope(world.conn, TEAM, g.id, d.id) == Scope(TEAM, Privacy.GROUP)
    o = world.say("note to self", conversation=OWNER_DM, sender="@me:m.org",
                  privacy=Privacy.OWNER, owner=True)  # fmt: skip
    assert profiles.range_scope(world.conn, OWNER_DM, o.id, o.id).privacy is Privacy.OWNER
    nothing = profiles.range_scope(world.conn, "matrix:none", 1, 2)
    assert profiles.visible(world.conn, nothing, bob) == []


def test_for_review_lists_older_visible_facts_oldest_first(world: World) -> None:
    rows = [world.say(f"fact {i}") for i in range(4)]
    g = world.say("group fact", conversation=TEAM, privacy=Privacy.GROUP)
    bob = str(rows[0].entity)
    for r in rows:
        world.apply(world.result([r], facts=[fact(bob, f"knows {r.text}", [r.id])]))
    world.apply(world.result([g], facts=[fact(bob, "is in the team", [g.id])]))
    scope = Scope(BOB_DM, Privacy.DIRECT, bob)
    got = profiles.for_review(world.conn, scope, bob, before_id=rows[3].id, limit=2)
    assert [f.text for f in got] == ["knows fact 0", "knows fact 1"]
    group = profiles.for_review(world.conn, Scope(TEAM, Privacy.GROUP), bob, before_id=10**9)
    assert [f.text for f in group] == ["is in the team"]


def test_a_fact_about_the_owner(world: World) -> None:
    o = world.say("I am vegetarian", conversation=OWNER_DM, sender="@me:m.org",
                  privacy=Privacy.OWNER, owner=True)  # fmt: skip
    done = world.apply(world.result([o], facts=[fact(OWNER, "is vegetarian", [o.id],
                                                     kind="identity")]))  # fmt: skip
    assert done.added == 1
    owner_scope = Scope(OWNER_DM, Privacy.OWNER, OWNER)
    assert [f.text for f in profiles.visible(world.conn, owner_scope, OWNER)] == ["is vegetarian"]
    bob_scope = Scope(BOB_DM, Privacy.DIRECT, "e-12345678")
    assert profiles.visible(world.conn, bob_scope, OWNER) == []


def test_a_narrower_range_never_changes_what_a_wider_audience_knows(world: World) -> None:
    """A fact the team knows (learnt in the group) is not given a new version, contradicted or
    retired from Bob's DM: the team would see it vanish (and learn that something was said
    elsewhere). The DM's fact stands alone beside it; the team's stays current and shown."""
    g = world.say("I love espresso", conversation=TEAM, privacy=Privacy.GROUP)
    bob = str(g.entity)
    world.apply(world.result([g], summary=world.summarize([g]).id,
                             facts=[fact(bob, "loves espresso", [g.id])]))  # fmt: skip
    team_fact = only(bob, world)
    d = world.say("I quit espresso, doctor's orders")
    e = world.say("I love espresso")
    done = world.apply(world.result(
        [d, e], summary=world.summarize([d, e]).id,
        facts=[fact(bob, "quit espresso", [d.id], contradicts=team_fact.id),
               fact(bob, "loves espresso", [e.id], same_as=team_fact.id),
               fact(bob, "Loves espresso!", [e.id])],  # the normalized fallback: the same
        retire=[{"id": team_fact.id, "why": "he quit: doctor's orders"}],
    ))  # fmt: skip
    assert (done.added, done.superseded, done.contradicted, done.unchanged) == (2, 0, 0, 1), done
    assert done.refused == [f"retire {team_fact.id}: fact {team_fact.id} is known to a wider "
                            "audience than this range's"]  # fmt: skip
    kept = profiles.by_id(world.conn, team_fact.id)
    assert kept is not None and kept.current and kept.retired_why is None
    team = [f.id for f in profiles.visible(world.conn, Scope(TEAM, Privacy.GROUP), bob)]
    assert team == [team_fact.id]
    dm = {f.text for f in profiles.visible(world.conn, Scope(BOB_DM, Privacy.DIRECT, bob), bob)}
    assert {"loves espresso", "quit espresso"} <= dm


def test_a_same_as_raced_by_a_contradiction_stands_alone(world: World) -> None:
    """Two jobs read memory while "loves green tea" was current: one contradicts it, the other
    says it is the same. Applied in that order, the second's evidence ("still my favourite") is
    not filed under "dislikes tea": its fact stands alone, both current, the conflict visible."""
    a = world.say("I love green tea")
    bob = str(a.entity)
    world.apply(world.result([a], summary=world.summarize([a]).id,
                             facts=[fact(bob, "loves green tea", [a.id])]))  # fmt: skip
    loved = only(bob, world)
    b = world.say("I can't stand tea any more")
    c = world.say("Green tea is still my favourite")
    world.apply(
        world.result(
            [b],
            summary=world.summarize([b]).id,
            facts=[fact(bob, "dislikes tea", [b.id], contradicts=loved.id)],
        )
    )
    done = world.apply(
        world.result(
            [c],
            summary=world.summarize([c]).id,
            facts=[fact(bob, "loves green tea", [c.id], same_as=loved.id)],
        )
    )
    assert (done.added, done.superseded) == (1, 0)
    now = {f.text: f for f in profiles.current(world.conn, bob)}
    assert set(now) == {"dislikes tea", "loves green tea"}
    assert (
        now["dislikes tea"].conflicts_with == loved.id and c.id not in now["dislikes tea"].evidence
    )
    assert now["loves green tea"].evidence == (c.id,)
