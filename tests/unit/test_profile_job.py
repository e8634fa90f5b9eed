"""The profile job (worker/profile_job.py) with a scripted in-process model: what it proposes for
a range (facts, same insight, relevance, gaps), its fallbacks, a model that is down, a range
that changed, and its entry applied by the worker (worker/commands.py ``apply_profile``)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy, Reply
from memory import gaps, profile_apply, profiles, summaries
from memory.erasure import erase
from memory.facade import Memory
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.rows import LogRow
from memory.store import MemoryStore
from worker.admission import admit
from worker.commands import apply_profile
from worker.model import Completion, ModelError, NoModel
from worker.profile_job import RESULT_CHARS, fit, profile, propose
from worker.turn import memory_settings

_n = itertools.count(1)
DM = "matrix:dm-bob"
ROOM = "matrix:room"


class Model:
    """Answers each question (by its ``TASK:`` line) from its own script; records the prompts."""

    name = "scripted"

    def __init__(self, **script: list[str | Exception]) -> None:
        self.script = {k.replace("_", " "): list(v) for k, v in script.items()}
        self.asked: list[str] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[Any]) -> Completion:
        prompt = messages[-1]["content"]
        self.asked.append(prompt)
        task = prompt.splitlines()[0].removeprefix("TASK: ")
        answers = self.script.get(task)
        if not answers:
            raise AssertionError(f"not scripted: {task}")
        step = answers.pop(0)
        if isinstance(step, Exception):
            raise step
        return Completion(content=step)

    def tasks(self) -> list[str]:
        return [p.splitlines()[0].removeprefix("TASK: ") for p in self.asked]


def facts(*items: dict[str, Any]) -> str:
    return json.dumps({"facts": list(items)})


def fact(
    text: str, evidence: list[int], entity: str = "E1", kind: str = "preference"
) -> dict[str, Any]:
    return {"entity": entity, "kind": kind, "text": text, "confidence": 0.8, "evidence": evidence}


NO_GAPS = json.dumps({"gaps": []})
DOWN = ModelError("connection refused", kind="connect")


class World:
    def __init__(self, home: Path) -> None:
        self.cfg = Config(home=home)
        self.store = MemoryStore(self.cfg.memory_path)
        self.identity = Identity(OwnerResolver([]), "Ada")

    @property
    def conn(self) -> Any:
        return self.store.conn

    def say(self, text: str, *, conversation: str = DM, sender: str = "@bob:m.org",
            privacy: Privacy = Privacy.DIRECT, owner: bool = False) -> LogRow:  # fmt: skip
        n = next(_n)
        msg = InboundMessage(
            channel="matrix", session=conversation, conversation=conversation, sender=sender,
            sender_name=sender.strip("@").split(":")[0].title(), privacy=privacy, text=text,
            ts=1_795_000_000.0 + n, event_id=f"ev{n}",
        )  # fmt: skip
        with self.store.transaction():
            return self.identity.append_inbound(self.store, msg, f"matrix/{n}-0", is_owner=owner)

    def reply(self, row: LogRow, text: str) -> LogRow:
        with self.store.transaction():
            return self.store.append_reply(
                Reply(reply_id=f"r{row.id}", answers=row.stream_id, channel=row.channel,
                      session=row.session, conversation=row.conversation, text=text,
                      created=row.ts + 0.5),
                sender="relaybot", privacy=Privacy(row.privacy),
            )  # fmt: skip

    def summary(self, rows: list[LogRow], text: str = "they talked") -> profile_apply.PendingRange:
        conv, first, last = rows[0].conversation, rows[0].id, rows[-1].id
        key = summaries.job_key(conv, first, last)
        p = summaries.Proposal(conversation=conv, first_id=first, last_id=last, text=text,
                               method="model", job_key=key)  # fmt: skip
        with self.store.transaction():
            made = summaries.apply(self.conn, p)
        return profile_apply.PendingRange(conv, first, last, made.id)

    def propose(self, model: Any, rng: profile_apply.PendingRange, **kw: Any) -> Any:
        return propose(self.conn, model, rng, assistant_name="relaybot", owner_name="Ada",
                       tool_names=kw.pop("tool_names", ["clock"]), **kw)  # fmt: skip

    def apply(self, result: dict[str, object]) -> profile_apply.Applied:
        with self.store.transaction():
            return profile_apply.apply_result(self.conn, profile_apply.result_of(result))

    def bob(self) -> str:
        row = self.conn.execute("SELECT entity FROM log WHERE sender = '@bob:m.org'").fetchone()
        return str(row[0])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def tea_range(world: World) -> tuple[profile_apply.PendingRange, list[LogRow]]:
    a = world.say("I only drink green tea, never coffee")
    b = world.reply(a, "Noted!")
    return world.summary([a, b]), [a, b]


# -- facts ----------------------------------------------------------------------------------


def test_a_range_derived_again_after_an_erasure_has_a_run_key_of_its_own(world: World) -> None:
    rng, (a, _b) = tea_range(world)
    again = dataclasses.replace(rng, again=2)
    result = world.propose(Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                                 capability_gaps=[NO_GAPS]), again)  # fmt: skip
    assert isinstance(result, dict) and result["again"] == 2
    assert result["run_key"] == profile_apply.run_key(DM, a.id, rng.last_id, rng.summary, 2)
    assert str(result["run_key"]).endswith("/a2")
    assert profile_apply.result_of(result).again == 2


def test_a_range_gives_facts_with_memory_ids_and_its_run_key(world: World) -> None:
    rng, (a, _b) = tea_range(world)
    model = Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]),
                                       fact("made up", [a.id - 1]))],  # outside: dropped
                  capability_gaps=[NO_GAPS])  # fmt: skip
    result = world.propose(model, rng)
    assert model.tasks() == ["profile facts", "capability gaps"]  # nothing known: no SAME
    assert "Summary of this part:\nthey talked" in model.asked[0]
    assert result["method"] == "model" and result["note"] == ""
    assert result["run_key"] == profile_apply.run_key(DM, rng.first_id, rng.last_id, rng.summary)
    [f] = result["facts"]
    assert f == {
        "entity": world.bob(),
        "kind": "preference",
        "text": "Bob drinks green tea",
        "confidence": 0.8,
        "evidence": [a.id],
        "same_as": None,
        "contradicts": None,
    }
    done = world.apply(result)
    assert done.added == 1 and not done.refused
    [made] = profiles.current(world.conn, world.bob())
    assert made.text == "Bob drinks green tea" and made.evidence == (a.id,)
    assert world.apply(result).replayed  # the entry replayed: nothing twice


def test_same_insight_makes_a_new_version_not_a_second_fact(world: World) -> None:
    rng, (a, _b) = tea_range(world)
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                                    capability_gaps=[NO_GAPS]), rng))  # fmt: skip
    [old] = profiles.current(world.conn, world.bob())
    c = world.say("green tea again for me please")
    rng2 = world.summary([c])
    model = Model(
        profile_facts=[facts(fact("Bob likes green tea", [c.id]))],
        same_insight=[json.dumps({"decisions": [{"new": 0, "same_as": old.id}]})],
        capability_gaps=[NO_GAPS],
    )
    result = world.propose(model, rng2)
    # the fact the range named is the same insight: no RELEVANT question about it
    assert model.tasks() == ["profile facts", "same insight", "capability gaps"]
    assert f"F{old.id} [E1 Bob · preference] Bob drinks green tea" in model.asked[1]
    assert result["facts"][0]["same_as"] == old.id
    done = world.apply(result)
    assert done.superseded == 1
    [head] = profiles.current(world.conn, world.bob())
    assert head.supersedes == old.id and head.evidence == (a.id, c.id)
    assert head.text == "Bob drinks green tea"  # the known fact's text, kept


def test_same_insight_garbage_twice_falls_back_to_normalized_text(world: World) -> None:
    rng, (a, _b) = tea_range(world)
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                                    capability_gaps=[NO_GAPS]), rng))  # fmt: skip
    [old] = profiles.current(world.conn, world.bob())
    c = world.say("still green tea")
    model = Model(
        profile_facts=[facts(fact("bob drinks GREEN tea!", [c.id]), fact("Bob is 40", [c.id]))],
        same_insight=["sure!", '{"decisions": "all new"}'],
        still_relevant=['{"stale": []}'],
        capability_gaps=[NO_GAPS],
    )
    result = world.propose(model, world.summary([c]))
    assert [f["same_as"] for f in result["facts"]] == [old.id, None]
    assert "same insight: no usable answer twice" in result["note"]
    assert result["method"] == "model"


def test_garbage_twice_learns_nothing_and_says_why(world: World) -> None:
    rng, _rows = tea_range(world)
    model = Model(profile_facts=["I think Bob likes tea", '{"facts": "tea"}'],
                  capability_gaps=["?", "??"])  # fmt: skip
    result = world.propose(model, rng)
    assert result["method"] == "fallback" and result["facts"] == []
    assert "profile facts: no usable answer twice" in result["note"]
    assert "capability gaps: no usable answer twice" in result["note"]
    done = world.apply(result)
    assert done.added == 0 and done.run > 0  # the run is recorded: not planned again
    assert profile_apply.pending(world.conn, 10) == []


def test_a_model_refusing_the_prompt_counts_as_an_unusable_answer(world: World) -> None:
    rng, _rows = tea_range(world)
    too_long = ModelError("context length", kind="status", status=400, retryable=False)
    model = Model(profile_facts=[too_long, too_long], capability_gaps=[NO_GAPS])
    assert world.propose(model, rng)["method"] == "fallback"


@pytest.mark.parametrize("question", ["profile_facts", "same_insight", "still_relevant",
                                      "capability_gaps"])  # fmt: skip
def test_a_model_that_is_down_at_any_question_ends_the_job_model_down(
    world: World, question: str
) -> None:
    rng, (a, _b) = tea_range(world)
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                                    capability_gaps=[NO_GAPS]), rng))  # fmt: skip
    c = world.say("I moved to Rome")
    script: dict[str, list[str | Exception]] = {
        "profile_facts": [facts(fact("Bob lives in Rome", [c.id], kind="identity"))],
        "same_insight": [json.dumps({"decisions": [{"new": 0}]})],
        "still_relevant": ['{"stale": []}'],
        "capability_gaps": [NO_GAPS],
    }
    script[question] = ["garbage", DOWN] if question == "profile_facts" else [DOWN]
    assert world.propose(Model(**script), world.summary([c])) == "model_down"


def test_no_model_is_model_down_never_a_fallback(world: World) -> None:
    rng, _rows = tea_range(world)
    assert world.propose(NoModel(), rng) == "model_down"


# -- relevance ------------------------------------------------------------------------------


def test_relevant_retires_what_no_longer_holds(world: World) -> None:
    a = world.say("I'm flying to Rome next week")
    rng = world.summary([a])
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob plans a trip to Rome", [a.id],
                                                              kind="event"))],
                                    capability_gaps=[NO_GAPS]), rng))  # fmt: skip
    [trip] = profiles.current(world.conn, world.bob())
    c = world.say("back home from Rome, it was lovely")
    model = Model(
        profile_facts=[facts(fact("Bob visited Rome", [c.id], kind="event"))],
        same_insight=[json.dumps({"decisions": [{"new": 0, "same_as": None}]})],
        still_relevant=[json.dumps({"stale": [{"id": trip.id, "why": "the trip happened"},
                                              {"id": 424242, "why": "not listed"}]})],
        capability_gaps=[NO_GAPS],
    )  # fmt: skip
    result = world.propose(model, world.summary([c]))
    assert model.tasks() == ["profile facts", "same insight", "still relevant", "capability gaps"]
    assert result["retire"] == [{"id": trip.id, "why": "the trip happened"}]
    done = world.apply(result)
    assert done.retired == 1 and done.added == 1
    assert [f.text for f in profiles.current(world.conn, world.bob())] == ["Bob visited Rome"]


def test_relevant_garbage_twice_keeps_everything(world: World) -> None:
    a = world.say("I'm flying to Rome next week")
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob plans a trip", [a.id]))],
                                    capability_gaps=[NO_GAPS]), world.summary([a])))  # fmt: skip
    c = world.say("I like cats")
    model = Model(profile_facts=[facts(fact("Bob likes cats", [c.id]))],
                  same_insight=[json.dumps({"decisions": [{"new": 0}]})],
                  still_relevant=["no idea", "[1, 2]"], capability_gaps=[NO_GAPS])  # fmt: skip
    result = world.propose(model, world.summary([c]))
    assert (
        result["retire"] == [] and "still relevant (E1): no usable answer twice" in result["note"]
    )


# -- privacy: the job is shown only what the range's audience may see ----------------------


def test_a_group_range_is_never_shown_a_fact_learnt_in_a_dm(world: World) -> None:
    a = world.say("my divorce is final next month")
    world.apply(world.propose(Model(profile_facts=[facts(fact("Bob is getting divorced", [a.id],
                                                              kind="event"))],
                                    capability_gaps=[NO_GAPS]), world.summary([a])))  # fmt: skip
    g = world.say("hi all, I like jazz", conversation=ROOM, privacy=Privacy.GROUP)
    model = Model(profile_facts=[facts(fact("Bob likes jazz", [g.id]))],
                  capability_gaps=[NO_GAPS])  # fmt: skip
    result = world.propose(model, world.summary([g]))
    assert model.tasks() == ["profile facts", "capability gaps"]  # nothing it may see: no SAME
    assert not any("divorce" in p for p in model.asked)
    assert result["facts"][0]["same_as"] is None


def test_a_group_range_is_never_shown_a_gap_from_a_dm(world: World) -> None:
    """Bob asked in his DM for something the assistant could not do: a group range's GAPS
    question does not list that gap (the model could copy it into a gap resting on the group's
    rows, which an erasure of the DM would not take); a same_as naming it makes a new gap."""
    a = world.say("book my chemotherapy appointment")
    b = world.reply(a, "I can't book appointments.")
    dm_gap = {"entity": "E1", "description": "book chemotherapy appointments",
              "needs": "calendar", "evidence": [a.id, b.id], "same_as": None}  # fmt: skip
    world.apply(world.propose(Model(profile_facts=[facts()],
                                    capability_gaps=[json.dumps({"gaps": [dm_gap]})]),
                              world.summary([a, b])))  # fmt: skip
    [made] = gaps.of_entities(world.conn, [world.bob()])
    g = world.say("hi all, book us a table", conversation=ROOM, privacy=Privacy.GROUP)
    h = world.reply(g, "I can't book tables.")
    forged = {"entity": "E1", "description": "book a table", "needs": "calendar",
              "evidence": [g.id, h.id], "same_as": made.id}  # fmt: skip
    model = Model(profile_facts=[facts()], capability_gaps=[json.dumps({"gaps": [forged]})])
    result = world.propose(model, world.summary([g, h]))
    assert not any("chemotherapy" in p for p in model.asked)
    done = world.apply({**result, "gaps": [{**forged, "entity": world.bob()}]})
    assert (done.gaps_new, done.gaps_merged) == (1, 0)


# -- gaps -----------------------------------------------------------------------------------


def test_gaps_from_the_model_and_the_known_ones_it_is_shown(world: World) -> None:
    a = world.say("what's the weather in Paris?")
    b = world.reply(a, "Sorry, I can't check the weather.")
    gap = {"entity": "E1", "description": "check the weather", "needs": "web_search",
           "evidence": [a.id, b.id], "same_as": None}  # fmt: skip
    model = Model(profile_facts=[facts()], capability_gaps=[json.dumps({"gaps": [gap]})])
    result = world.propose(model, world.summary([a, b]), tool_names=["clock", "recall"])
    assert "Its tools: clock, recall" in model.asked[-1]
    assert result["gaps"] == [{**gap, "entity": world.bob()}]
    done = world.apply(result)
    assert done.gaps_new == 1
    [made] = gaps.of_entities(world.conn, [world.bob()])
    c = world.say("weather in Paris, please?")
    d = world.reply(c, "I still cannot check the weather.")
    again = Model(profile_facts=[facts()], capability_gaps=[json.dumps({"gaps": [
        {**gap, "evidence": [c.id, d.id], "same_as": made.id}]})])  # fmt: skip
    result = world.propose(again, world.summary([c, d]))
    assert f"G{made.id} [E1 · open · needs web_search] check the weather" in again.asked[-1]
    assert result["read_gaps"] == [made.id]  # what the run was shown: an erasure of it reaches it
    assert world.apply(result).gaps_merged == 1
    [merged] = gaps.of_entities(world.conn, [world.bob()])
    assert merged.count == 2 and merged.evidence == (a.id, b.id, c.id, d.id)


def test_gaps_garbage_twice_uses_the_detector(world: World) -> None:
    a = world.say("book a table at Luigi's for Friday")
    b = world.reply(a, "I'm unable to make reservations.")
    model = Model(profile_facts=[facts()], capability_gaps=["none", "nope"])
    result = world.propose(model, world.summary([a, b]))
    assert result["gaps"] == [{"entity": world.bob(), "description": "book a table at Luigi's "
                               "for Friday", "needs": None, "evidence": [a.id, b.id],
                               "same_as": None}]  # fmt: skip
    assert world.apply(result).gaps_new == 1


# -- a range that changed -------------------------------------------------------------------


def test_a_range_that_changed_is_stale(world: World) -> None:
    rng, (a, b) = tea_range(world)
    grown = profile_apply.PendingRange(DM, a.id, b.id + 5, rng.summary)
    assert world.propose(Model(), grown) == "stale"  # its last row is not there
    assert world.propose(Model(), profile_apply.PendingRange(DM, a.id, b.id, 987654)) == "stale"
    erase(world.store, kind="id", target=str(b.id), reason="asked", requested_by="ada",
          stream_id="cli/1795999999990-0")  # fmt: skip
    assert world.propose(Model(), rng) == "stale"  # its edge was erased, its summary too


# -- the entry: bounded, published, applied by the worker, never a gateway's ---------------


def test_a_result_too_big_for_one_entry_is_cut_least_confident_first() -> None:
    one = {"entity": "e", "kind": "event", "text": "x" * 500, "evidence": [1], "same_as": None}
    many = [{**one, "confidence": i / 200, "contradicts": None} for i in range(200)]
    result: dict[str, object] = {"note": "", "facts": many, "gaps": []}
    cut = fit(result)
    kept = cut["facts"]
    assert isinstance(kept, list) and 0 < len(kept) < 200
    assert min(f["confidence"] for f in kept) > max(f["confidence"] for f in many if f not in kept)
    wire = json.dumps(cut, separators=(",", ":"), ensure_ascii=False)  # as the entry holds it
    assert len(wire) <= RESULT_CHARS and "left out to fit" in str(cut["note"])


def test_the_rq_entry_publishes_one_entry_the_worker_applies(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng, (a, _b) = tea_range(world)
    model = Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                  capability_gaps=[NO_GAPS])  # fmt: skip
    monkeypatch.setattr("worker.summarize_job.load_config", lambda: world.cfg)
    monkeypatch.setattr("worker.profile_job.make_model", lambda _cfg: model)
    r = fakeredis.FakeRedis()
    monkeypatch.setattr("redis.Redis.from_url", lambda *_a, **_k: r)
    world.cfg = Config.model_validate({"home": world.cfg.home, "redis": {"url": "redis://x"}})
    assert profile(DM, rng.first_id, rng.last_id, rng.summary, tool_names=["clock"]) == "proposed"
    [(sid, fields)] = r.xrange(world.cfg.keys.inbound)
    msg = admit(world.cfg, Memory(world.store, memory_settings(world.cfg)), sid.decode(),
                fields, None)  # fmt: skip
    assert isinstance(msg, InboundMessage) and msg.kind is Kind.DERIVED and msg.text == ""
    assert msg.conversation == DM and msg.extra["type"] == "profile"
    # the same entry on a gateway's stream is refused with its own reason
    refused = admit(world.cfg, Memory(world.store, memory_settings(world.cfg)), sid.decode(),
                    fields, "matrix")  # fmt: skip
    assert not isinstance(refused, InboundMessage)
    assert (
        refused.dead_reason == "a profile comes only from the jobs (the stream without a channel)"
    )
    memory = Memory(world.store, memory_settings(world.cfg))
    with memory.write():
        assert apply_profile(memory, msg) == ""
        assert apply_profile(memory, msg) == ""  # replayed: the run is there, nothing twice
    memory.settle()
    assert len(profiles.current(world.conn, world.bob())) == 1
    forged = msg.model_copy(update={"conversation": ROOM})
    assert apply_profile(memory, forged) == "invalid"
    bad = msg.model_copy(update={"extra": {**msg.extra, "run_key": "profile:x@1-2/s1"}})
    assert apply_profile(memory, bad) == "invalid"
