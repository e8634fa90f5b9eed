"""An MCP tool's results, recorded as log rows with their turn's reply (worker/ledger.py), go with
that turn when anything it answered or drew on is erased (memory/erasure_plan.py): the question,
the conversation, the person who asked, the reply itself; and erasing a result takes the reply
it informed. Nothing of the result's text is left in the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.messages import Privacy
from memory.erasure import erase, plan_erasure
from tests.unit.test_mcp_tools import ROOM, FakeHub, World, message, servers

SECRET = "kumquat-7731"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    hub = FakeHub(servers())
    hub.answer = lambda s, t, a: f"the vault code is {SECRET}"
    w = World(tmp_path, hub)
    yield w
    w.store.close()


def a_turn_with_a_tool(world: World, conversation: str = ROOM[0]) -> str:
    m = message("what is the code?", conversation, Privacy.GROUP, sender="@eve:x.org")
    key = world.ask(m, [("pub_echo", {"text": "code"}), ("pub_echo", {"text": "again"})],
                    f"it is {SECRET}")  # fmt: skip
    world.turns.settle()
    return key


def ids(world: World, where: str, *params: object) -> list[int]:
    rows = world.store.conn.execute(f"SELECT id FROM log WHERE {where} ORDER BY id", params)
    return [int(r[0]) for r in rows]


def run(world: World, kind: str, target: str) -> None:
    erase(world.store, kind=kind, target=target, reason="test", requested_by="owner",
          stream_id=f"erase-{kind}-{target}")  # fmt: skip


def left(world: World) -> str:
    rows = world.store.conn.execute("SELECT text FROM log").fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_erasing_the_question_takes_its_tool_results(world: World) -> None:
    key = a_turn_with_a_tool(world)
    tools = ids(world, "kind = 'tool'")
    assert len(tools) == 2 and SECRET in left(world)
    [question] = ids(world, "direction = 'in' AND stream_id = ?", key)
    plan = plan_erasure(world.store.conn, "id", str(question))
    assert set(tools) <= set(plan.log_ids)
    assert plan.tool_rows == dict.fromkeys(tools, 1)
    assert plan.own_rows == 1  # the question; the reply and the results are derived
    run(world, "id", str(question))
    assert SECRET not in left(world)


def test_erasing_the_conversation_takes_them(world: World) -> None:
    a_turn_with_a_tool(world)
    other = a_turn_with_a_tool(world, "matrix:!elsewhere")
    run(world, "conversation", ROOM[0])
    kept = ids(world, "kind = 'tool' AND text != ''")
    assert kept == ids(world, "stream_id LIKE ?", f"{other}/tool/%")
    assert len(kept) == 2  # the other conversation's turn keeps its own


def test_erasing_the_reply_takes_its_results(world: World) -> None:
    key = a_turn_with_a_tool(world)
    [reply] = ids(world, "direction = 'out' AND stream_id = ?", key)
    run(world, "id", str(reply))
    assert SECRET not in left(world)
    assert ids(world, "kind = 'tool' AND text != ''") == []


def test_erasing_a_result_takes_the_reply_it_informed(world: World) -> None:
    key = a_turn_with_a_tool(world)
    first = ids(world, "kind = 'tool'")[0]
    plan = plan_erasure(world.store.conn, "id", str(first))
    [reply] = ids(world, "direction = 'out' AND stream_id = ?", key)
    assert reply in plan.log_ids and reply in plan.derived_ids
    run(world, "id", str(first))
    assert SECRET not in left(world)  # the reply and the turn's other result went with it


def test_erasing_the_person_who_asked_takes_their_turns_results(world: World) -> None:
    key = a_turn_with_a_tool(world)
    entity = world.store.conn.execute(
        "SELECT entity FROM log WHERE direction = 'in' AND stream_id = ?", (key,)
    ).fetchone()[0]
    run(world, "entity", str(entity))
    assert SECRET not in left(world)


def test_a_later_reply_that_held_a_result_goes_at_the_next_hop(world: World) -> None:
    key = a_turn_with_a_tool(world)
    world.ask(message("say it again", *ROOM, sender="@bob:x.org"), "sure")
    world.turns.settle()
    later = ids(world, "direction = 'out'")[-1]
    [question] = ids(world, "direction = 'in' AND stream_id = ?", key)
    plan = plan_erasure(world.store.conn, "id", str(question))
    assert later in plan.log_ids
