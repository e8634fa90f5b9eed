"""Poison ``derived`` profile entries through the worker's own path (worker/turn.py
``Turns.apply`` -> worker/commands.py ``apply_profile`` -> Memory.apply_profile), real SQLite."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage
from memory import profile_apply
from memory.errors import MemoryUnwritable
from memory.identity import OWNER
from tests.unit.test_profile_job import World, tea_range
from worker.model import NoModel
from worker.tools import ToolRegistry
from worker.turn import Turns


def entry(rng: profile_apply.PendingRange, **over: Any) -> InboundMessage:
    extra: dict[str, Any] = {
        "type": "profile",
        "run_key": profile_apply.run_key(rng.conversation, rng.first_id, rng.last_id, rng.summary),
        "conversation": rng.conversation, "first_id": rng.first_id, "last_id": rng.last_id,
        "summary": rng.summary, "method": "model", "note": "", "facts": [], "retire": [],
        "gaps": [],
    }  # fmt: skip
    extra.update(over)
    fields = {
        "v": "1", "kind": "derived", "channel": "matrix", "session": rng.conversation,
        "conversation": rng.conversation, "sender": "jobs", "sender_name": "",
        "privacy": "direct", "text": "", "ts": "1795000100.0", "event_id": "evp",
        "extra": json.dumps(extra),
    }  # fmt: skip
    return InboundMessage.from_fields(fields)


def turns_for(world: World) -> Turns:
    return Turns(world.cfg, world.store, NoModel(), ToolRegistry([]))


def bob_fact(
    rng: profile_apply.PendingRange, ev: list[int], entity: str, **over: Any
) -> dict[str, Any]:
    f = {"entity": entity, "kind": "preference", "text": "likes green tea", "confidence": 0.8,
         "evidence": ev, "same_as": None, "contradicts": None}  # fmt: skip
    f.update(over)
    return f


BIG = 2**63  # one past SQLite's INTEGER


@pytest.mark.parametrize(
    "poison",
    [
        {"facts": "F_SAME"},
        {"facts": "F_CONTRA"},
        {"retire": [{"id": BIG, "why": "x"}]},
        {"gaps": "G_SAME"},
    ],
    ids=["fact.same_as=2**63", "fact.contradicts=2**63", "retire.id=2**63", "gap.same_as=2**63"],
)
def test_a_huge_id_in_a_profile_entry_is_refused_not_a_rollback_of_the_batch(
    tmp_path: Path, poison: dict[str, Any]
) -> None:
    world = World(tmp_path)
    rng, rows = tea_range(world)
    bob = world.bob()
    ev = [rows[0].id]
    if poison.get("facts") == "F_SAME":
        poison = {"facts": [bob_fact(rng, ev, bob, same_as=BIG)]}
    elif poison.get("facts") == "F_CONTRA":
        poison = {"facts": [bob_fact(rng, ev, bob, contradicts=BIG)]}
    elif poison.get("gaps") == "G_SAME":
        poison = {"gaps": [{"entity": bob, "description": "book a table", "evidence": ev,
                            "same_as": BIG}]}  # fmt: skip
    turns = turns_for(world)
    # the writer's group commit: an earlier entry of the batch wrote memory, not committed yet
    with turns.memory.write():
        turns.memory.store.conn.execute(  # type: ignore[union-attr]
            "INSERT INTO profile_runs (conversation, first_id, last_id, summary, run_key, method,"
            " facts, gaps, retired, refused, note, at) VALUES ('x', 1, 1, NULL, 'earlier-entry',"
            " 'model', 0, 0, 0, 0, '', 0)"
        )
    msg = entry(rng, **poison)
    raised: BaseException | None = None
    try:
        outcome = turns.apply("0-1", msg)
    except Exception as exc:
        raised = exc
    turns.settle()
    earlier = world.conn.execute(
        "SELECT count(*) FROM profile_runs WHERE run_key = 'earlier-entry'"
    ).fetchone()[0]
    # the earlier entry's write must survive a poison entry after it in the same batch
    assert earlier == 1, f"the earlier entry's write was rolled back by {raised!r}"
    assert raised is None, f"the poison escaped: {type(raised).__name__}: {raised}"
    assert outcome.forget_entry


@pytest.mark.parametrize(
    "conf", [math.nan, math.inf, -0.1, 1.5, "0.8", None, True, [0.5], {"a": 1}]
)
def test_wrong_confidence(tmp_path: Path, conf: Any) -> None:
    world = World(tmp_path)
    rng, rows = tea_range(world)
    turns = turns_for(world)
    extra_fact = bob_fact(rng, [rows[0].id], world.bob(), confidence=conf)
    try:
        msg = entry(rng, facts=[extra_fact])
    except Exception:
        return
    turns.apply("0-1", msg)
    turns.settle()
    got = world.conn.execute("SELECT confidence FROM profile_facts").fetchall()
    for (c,) in got:
        assert isinstance(c, float) and 0.0 <= c <= 1.0, got


def test_surrogate_text_in_a_fact(tmp_path: Path) -> None:
    world = World(tmp_path)
    rng, rows = tea_range(world)
    turns = turns_for(world)
    fields_extra = bob_fact(rng, [rows[0].id], world.bob(), text="likes \ud800 tea")
    msg = entry(rng, facts=[fields_extra])
    with turns.memory.write():
        turns.memory.store.conn.execute(  # type: ignore[union-attr]
            "INSERT INTO profile_runs (conversation, first_id, last_id, summary, run_key, method,"
            " facts, gaps, retired, refused, note, at) VALUES ('x', 1, 1, NULL, 'earlier-entry',"
            " 'model', 0, 0, 0, 0, '', 0)"
        )
    raised = None
    try:
        turns.apply("0-1", msg)
    except Exception as exc:
        raised = exc
    turns.settle()
    assert raised is None, f"{type(raised).__name__}: {raised}"
    assert (
        world.conn.execute(
            "SELECT count(*) FROM profile_runs WHERE run_key = 'earlier-entry'"
        ).fetchone()[0]
        == 1
    )


def test_deeply_nested_and_huge_and_wrong_types(tmp_path: Path) -> None:
    world = World(tmp_path)
    rng, rows = tea_range(world)
    turns = turns_for(world)
    nested: Any = 1
    for _ in range(5000):
        nested = [nested]
    bad = [
        {"facts": [{"entity": nested}]},
        {"facts": {"not": "a list"}},
        {"facts": [bob_fact(rng, [rows[0].id], world.bob())] * 10_000},
        {"gaps": [{"entity": OWNER, "description": "x" * 100_000, "evidence": [rows[0].id]}]},
        {"first_id": -5},
        {"last_id": BIG},
        {"facts": [bob_fact(rng, [-1, 0, BIG * 4], world.bob())]},
        {"facts": [bob_fact(rng, list(range(1, 20_000)), world.bob())]},
    ]
    for i, over in enumerate(bad):
        try:
            msg = entry(rng, **over)
        except Exception:
            continue
        out = turns.apply(f"0-{i + 2}", msg)
        turns.settle()
        assert out.dead_reason is None or out.dead_reason
    assert world.conn.execute("SELECT count(*) FROM profile_facts").fetchone()[0] <= 1


def test_replay_is_idempotent(tmp_path: Path) -> None:
    world = World(tmp_path)
    rng, rows = tea_range(world)
    turns = turns_for(world)
    msg = entry(rng, facts=[bob_fact(rng, [rows[0].id], world.bob())],
                gaps=[{"entity": world.bob(), "description": "book a table",
                       "evidence": [rows[0].id]}])  # fmt: skip
    for _ in range(3):
        turns.apply("0-1", msg)
        turns.settle()
    assert world.conn.execute("SELECT count(*) FROM profile_facts").fetchone()[0] == 1
    assert world.conn.execute("SELECT count(*) FROM capability_gaps").fetchone()[0] == 1
    assert world.conn.execute("SELECT count, status FROM capability_gaps").fetchone() == (1, "open")
    assert world.conn.execute("SELECT count(*) FROM profile_runs").fetchone()[0] == 1


def test_a_bug_in_one_entry_undoes_its_own_writes_only_never_the_batch_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory.write(), the writer's group commit: an entry whose handling raises a bug (not a
    failure of memory) has its own writes undone in its savepoint; the entries before it in the
    batch, handed on to be acked once the transaction commits, keep theirs (they were rolled
    back with it, and acked unwritten). A failure of memory still rolls everything back."""
    world = World(tmp_path)
    rng, rows = tea_range(world)
    turns = turns_for(world)
    conn = turns.memory.store.conn  # type: ignore[union-attr]
    insert = (
        "INSERT INTO profile_runs (conversation, first_id, last_id, summary, run_key, method, "
        "facts, gaps, retired, refused, note, at) VALUES ('x', 1, 1, NULL, ?, 'model', 0, 0, 0, "
        "0, '', 0)"
    )
    with turns.memory.write():
        conn.execute(insert, ("earlier-entry",))

    def buggy(*_a: object, **_k: object) -> None:
        conn.execute(insert, ("the-buggy-entry",))
        raise RuntimeError("a bug in one entry's handling")

    monkeypatch.setattr(profile_apply, "apply_result", buggy)
    with pytest.raises(RuntimeError):
        turns.apply("0-1", entry(rng, facts=[bob_fact(rng, [rows[0].id], world.bob())]))
    turns.settle()
    keys = {r[0] for r in world.conn.execute("SELECT run_key FROM profile_runs")}
    assert keys == {"earlier-entry"}

    def failing() -> None:
        with turns.memory.write():
            conn.execute(insert, ("lost-with-memory",))
            raise MemoryUnwritable("memory failed")

    with turns.memory.write():
        conn.execute(insert, ("lost-with-memory-too",))
    with pytest.raises(MemoryUnwritable):
        failing()
    turns.settle()
    assert {r[0] for r in world.conn.execute("SELECT run_key FROM profile_runs")} == keys
