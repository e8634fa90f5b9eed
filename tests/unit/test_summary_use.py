"""Layer 1 in use: the context's summaries section and search_history's summary hits, under the
privacy rule (a summary is shown only where every message it covers could be shown)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from contract.config import Config
from contract.messages import InboundMessage, Privacy
from memory import summaries, summary_view
from memory.erasure import erase
from memory.facade import Memory
from memory.privacy import Scope
from memory.rows import LogRow
from memory.search import RANKING, Ranking, SearchQuery, search
from memory.store import MemoryStore
from worker.memory_tools import memory_tools
from worker.tools import ToolRegistry
from worker.turn import memory_settings
from worker.turn_context import TurnContext

_n = itertools.count(1)
T0 = 1_795_000_000.0
DM = "matrix:dm-bob"
TEAM = "matrix:team"
HOME = "cli:home"


class World:
    def __init__(self, home: Path) -> None:
        self.cfg = Config(home=home)
        self.store = MemoryStore(self.cfg.memory_path)
        self.memory = Memory(self.store, memory_settings(self.cfg))

    def msg(self, text: str, conversation: str, privacy: Privacy, sender: str) -> InboundMessage:
        n = next(_n)
        return InboundMessage(
            channel=conversation.split(":", 1)[0], session=conversation,
            conversation=conversation, sender=sender, privacy=privacy, text=text, ts=T0 + n,
            event_id=f"e{n}",
        )  # fmt: skip

    def say(self, text: str, conversation: str, privacy: Privacy, sender: str) -> LogRow:
        msg = self.msg(text, conversation, privacy, sender)
        with self.memory.write():
            row, _ = self.memory.record_inbound(msg, f"{msg.channel}/{msg.event_id}")
        self.memory.settle()
        assert row is not None
        return row

    def summarise(self, rows: list[LogRow], text: str) -> summaries.Summary:
        conv = rows[0].conversation
        p = summaries.Proposal(conv, rows[0].id, rows[-1].id, text, "model",
                               summaries.job_key(conv, rows[0].id, rows[-1].id))  # fmt: skip
        with self.memory.write():
            made = self.memory.apply_summary(p)
        self.memory.settle()
        assert isinstance(made, summaries.Summary), made
        return made

    def context(self, text: str, conversation: str, privacy: Privacy, sender: str) -> str:
        row = self.say(text, conversation, privacy, sender)
        msg = self.msg(text, conversation, privacy, sender)
        scope = self.memory.scope_of(msg, row)
        return self.memory.context(msg, row, scope)[0]["content"]

    def search(self, scope: Scope, **args: object) -> str:
        msg = self.msg("x", scope.conversation, scope.privacy, "someone")
        ctx = TurnContext(stream_id="9-0", msg=msg, scope=scope, memory=self.memory)
        return ToolRegistry(memory_tools(ctx)).call("search_history", dict(args))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


@pytest.fixture
def summarised(world: World) -> dict[str, summaries.Summary]:
    dm = [world.say(t, DM, Privacy.DIRECT, "@bob:m.org") for t in
          ("my flat in Lisbon is free", "the key code is 4711", "bye")]  # fmt: skip
    team = [world.say(t, TEAM, Privacy.GROUP, "@carol:m.org") for t in
            ("who comes to Lisbon?", "we fly on friday")]  # fmt: skip
    home = [world.say(t, HOME, Privacy.OWNER, "owner") for t in ("plan the Lisbon trip", "ok")]
    return {
        "dm": world.summarise(dm, "Bob offered his Lisbon flat, key code 4711."),
        "team": world.summarise(team, "The team flies to Lisbon on friday."),
        "home": world.summarise(home, "The owner planned the Lisbon trip."),
    }


def test_a_conversation_sees_its_own_summaries_labelled_with_their_range(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    ctx = world.context("what did we decide?", TEAM, Privacy.GROUP, "@carol:m.org")
    assert "## Summaries of earlier conversation" in ctx
    team = summarised["team"]
    assert (
        f"[matrix / {TEAM}]" in ctx and f"(log {team.first_id}..{team.last_id}, 2 messages)" in ctx
    )
    assert "The team flies to Lisbon on friday." in ctx


def test_a_group_never_sees_a_summary_of_a_direct_or_owner_range(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    ctx = world.context("Lisbon key code flat trip", TEAM, Privacy.GROUP, "@carol:m.org")
    assert "4711" not in ctx and "planned the Lisbon trip" not in ctx
    out = world.search(Scope(TEAM, Privacy.GROUP), query="Lisbon key code trip")
    assert "The team flies to Lisbon" in out
    assert "4711" not in out and "planned the Lisbon trip" not in out
    out = world.search(Scope(TEAM, Privacy.GROUP), query="Lisbon", conversation=DM)
    assert "4711" not in out


def test_the_owner_sees_related_summaries_of_other_conversations(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    ctx = world.context("is bob's flat in Lisbon free?", HOME, Privacy.OWNER, "owner")
    assert "Bob offered his Lisbon flat" in ctx
    out = world.search(Scope(HOME, Privacy.OWNER, "owner"), query="flat")
    assert "summaries of earlier conversation that match" in out
    dm = summarised["dm"]
    assert f"(log {dm.first_id}..{dm.last_id}, 3 messages)" in out
    # the range's raw messages, by the range the hit gives
    raw = world.search(Scope(HOME, Privacy.OWNER, "owner"), query="key code",
                       from_id=dm.first_id, to_id=dm.last_id)  # fmt: skip
    assert "the key code is 4711" in raw


def test_an_erased_message_leaves_no_trace_in_context_or_search(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    dm = summarised["dm"]
    key_row = dm.first_id + 1
    erase(world.store, kind="id", target=str(key_row), reason="asked", requested_by="owner",
          stream_id="cli/1795999999999-0")  # fmt: skip
    ctx = world.context("Lisbon flat key code", HOME, Privacy.OWNER, "owner")
    assert "4711" not in ctx
    out = world.search(Scope(HOME, Privacy.OWNER, "owner"), query="key code flat")
    assert "4711" not in out
    dump = "\n".join(str(r) for r in world.store.conn.execute("SELECT * FROM summary"))
    assert "4711" not in dump
    hits = world.store.conn.execute(
        "SELECT count(*) FROM summary_fts WHERE summary_fts MATCH '4711'"
    ).fetchone()[0]
    assert hits == 0


def test_a_reply_shaped_by_a_summary_is_erased_with_a_message_the_summary_covers(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    from contract.messages import Reply
    from memory.provenance import DrewOn

    row = world.say("what about bob's flat?", HOME, Privacy.OWNER, "owner")
    msg = world.msg("what about bob's flat?", HOME, Privacy.OWNER, "owner")
    drew = DrewOn()
    world.memory.context(msg, row, world.memory.scope_of(msg, row), drew)
    assert summarised["dm"].id in drew.summaries  # offered in the summaries section
    with world.store.transaction():
        reply = world.store.append_reply(
            Reply(reply_id="r-flat", answers=row.stream_id, channel="cli", session=HOME,
                  conversation=HOME, text="Bob's key code is 4711.", created=T0 + 999),
            sender="relaybot", privacy=Privacy.OWNER, extra=drew.as_extra(),
        )  # fmt: skip
    dm = summarised["dm"]
    result = erase(world.store, kind="id", target=str(dm.first_id + 1), reason="asked",
                   requested_by="owner", stream_id="cli/1795999999998-0")  # fmt: skip
    assert result["derived_replies"] >= 1
    text = world.store.conn.execute("SELECT text FROM log WHERE id = ?", (reply.id,)).fetchone()
    assert text[0] == ""


def test_summary_hits_follow_the_search_filters(
    world: World, summarised: dict[str, summaries.Summary]
) -> None:
    owner = Scope(HOME, Privacy.OWNER, "owner")
    dm = summarised["dm"]
    assert "Bob offered his Lisbon flat" in world.search(owner, query="Lisbon flat")
    out = world.search(owner, query="Lisbon flat", from_id=dm.last_id + 1, to_id=dm.last_id + 99)
    assert "Bob offered his Lisbon flat" not in out  # the range does not overlap the filter
    out = world.search(owner, query="Lisbon flat", sender="bob")
    assert "summaries of earlier conversation" not in out  # a summary is nobody's words


# -- summaries in the ranking and the summary hits of a search ----------------------------------

ROOM = "matrix:room"


def test_a_summarised_stretch_is_a_cluster_of_its_own_in_the_ranking(world: World) -> None:
    """In a long-lived room, the stretch (a summary's range) where several messages match lifts
    its messages, not the whole room: of two identical messages, the one in the stretch about
    the flat ranks first (by the room alone, the newer one would)."""
    say = lambda t: world.say(t, ROOM, Privacy.GROUP, "@carol:m.org")  # noqa: E731
    flat = [say(t) for t in ("the flat in Lisbon", "Lisbon flat keys", "a flat viewing",
                             "the flat")]  # fmt: skip
    dinner = [say(t) for t in ("dinner plans", "the flat", "pizza tonight")]
    world.summarise(flat, "Carol found a flat in Lisbon.")
    world.summarise(dinner, "Carol planned dinner.")
    in_flat, in_dinner = flat[-1].id, dinner[1].id
    owner = Scope(HOME, Privacy.OWNER, "owner")

    def order(ranking: Ranking) -> list[int]:
        hits = search(world.store, owner, SearchQuery(text="flat", limit=10), ranking=ranking)
        return [h.row.id for h in hits.hits]

    got = order(RANKING)
    assert got.index(in_flat) < got.index(in_dinner)
    whole_room = order(replace(RANKING, segments=False))  # the room is one cluster
    assert whole_room.index(in_dinner) < whole_room.index(in_flat)


def test_summary_hits_name_first_the_stretches_the_messages_do_not_reach(world: World) -> None:
    say = lambda t: world.say(t, ROOM, Privacy.GROUP, "@carol:m.org")  # noqa: E731
    first = [say(t) for t in ("the boat trip to Porto", "boat tickets bought")]
    second = [say(t) for t in ("the weather", "sunny")]
    world.summarise(first, "Carol booked a boat trip to Porto, boat tickets and boat snacks.")
    world.summarise(second, "Carol mentioned the boat museum.")
    owner = Scope(HOME, Privacy.OWNER, "owner")
    out = world.search(owner, query="boat", limit=1)  # its one message hit is in the first
    lines = out.splitlines()
    at = {n: i for i, line in enumerate(lines) for n in ("booked a boat", "boat museum")
          if n in line}  # fmt: skip
    assert at["boat museum"] < at["booked a boat"], out
    # without message hits in them, the best summary comes first again
    found = summary_view.search(world.store, owner, SearchQuery(text="boat"))
    assert found[0].text.startswith("Carol booked a boat trip")


def test_a_direct_range_never_reaches_a_group_through_its_summary(world: World) -> None:
    """The direct conversation's summary matches best, holds no message hit of the group's
    search (so it would come first) and its range is a cluster of strong matches: the group still
    gets neither the summary nor any of its messages, as hits or as context."""
    dm = [world.say(t, DM, Privacy.DIRECT, "@bob:m.org") for t in
          ("my Lisbon flat: key code 4711", "the Lisbon flat key is under the mat",
           "Lisbon flat, Lisbon key")]  # fmt: skip
    team = [world.say(t, TEAM, Privacy.GROUP, "@carol:m.org") for t in
            ("who has the key for Lisbon?", "we fly to Lisbon")]  # fmt: skip
    world.summarise(dm, "Bob's Lisbon flat: key code 4711, the key under the mat.")
    world.summarise(team, "The team flies to Lisbon.")
    group = Scope(TEAM, Privacy.GROUP)
    hits = search(world.store, group, SearchQuery(text="Lisbon flat key code", limit=50)).hits
    rows = {r.id for h in hits for r in (h.row, h.before, h.after) if r is not None}
    assert rows and rows <= {r.id for r in team}
    found = summary_view.search(world.store, group, SearchQuery(text="Lisbon flat key code"),
                                [h.row for h in hits])  # fmt: skip
    assert [s.conversation for s in found] == [TEAM]
    out = world.search(group, query="Lisbon flat key code mat")
    assert "4711" not in out and "under the mat" not in out and "Bob" not in out
    assert "The team flies to Lisbon." in out
