"""Issue 24 (privacy, round 3), items 2-4 and 10, through the real Matrix gateway and worker
against a real Synapse, with the fake model (its logged input is what each turn showed it):

- a room anyone may join (``public``, guests too), ask to join (``knock``) or enter from
  another room (``restricted``) is a group, even with only the owner and the bot in it:
  the owner's terminal secret never reaches its turns, and mallory, who joins uninvited, never
  reads it there;
- in an encrypted room a newcomer's audience starts at their join: the owner's encrypted DM
  said something before the friend was invited, and the friend's turn neither sees nor finds it;
- the audience is checked again when the reply is posted: the owner asks in her own room, then
  invites mallory before the answer is ready; the answer is not posted, and the owner is told
  privately (in her terminal) why not.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from contract.bus import publish
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from tests.support.fakemodel import FakeModelServer
from tests.support.matrix_e2e import encrypted_round, open_encrypted_dm, owner_client
from tests.support.matrix_world import World
from tests.support.procs import memory_rows, wait_until

pytestmark = pytest.mark.integration

PIN = "PIN 7-7-0-1"
TERMINAL = "cli:owner-terminal"


def tell_the_terminal(world: World, text: str) -> None:
    """The owner's words in her terminal (the cli gateway's entry, as it writes it)."""
    msg = InboundMessage(
        channel="cli", session=TERMINAL, conversation=TERMINAL, sender="olivia",
        privacy=Privacy.OWNER, text=text, ts=time.time(), event_id=f"cli-{time.time_ns()}",
    )  # fmt: skip
    publish(world.r, world.keys, msg)


def inputs_with(server: FakeModelServer, marker: str, *, at_least: int = 1) -> str:
    """Every model request whose messages mention ``marker`` (a turn and its tool rounds)."""

    def find() -> str | None:
        found = [
            json.dumps(body["messages"], ensure_ascii=False)
            for body in server.requests
            if marker in json.dumps(body["messages"][-2:], ensure_ascii=False)
        ]
        return "\n".join(found) if len(found) >= at_least else None

    return wait_until(find, timeout=30, message=f"model requests for {marker!r}")


def bot_texts(world: World, who: Any, room: str) -> list[str]:
    return [str(e["content"].get("body", "")) for e in world.bot_messages(who, room)]


def search_for(words: str) -> str:
    return f'[[tool:search_history:{{"query": "{words}"}}]]'


OPEN_ROOMS = {
    "public": {"m.room.join_rules": {"join_rule": "public"}},
    "knock": {"m.room.join_rules": {"join_rule": "knock"}},
    "public, with guests": {
        "m.room.join_rules": {"join_rule": "public"},
        "m.room.guest_access": {"guest_access": "can_join"},
    },
}


@pytest.mark.parametrize("kind", [*OPEN_ROOMS, "restricted"])
def test_a_room_anyone_may_join_is_a_group_even_with_only_the_owner_in_it(
    world: World, model_server: FakeModelServer, kind: str
) -> None:
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    tell_the_terminal(world, f"remember: my bank {PIN}")
    inputs_with(model_server, "my bank PIN")
    state = OPEN_ROOMS.get(kind)
    if state is None:  # members of another room may walk in: a space's, say
        space = hs.create_room(owner, [], name="a space")
        allow = [{"type": "m.room_membership", "room_id": space}]
        state = {"m.room.join_rules": {"join_rule": "restricted", "allow": allow}}
    room = hs.create_room(owner, [world.bot.user_id], name=f"my {kind} room", state=state)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join")
    ask = f"{search_for('PIN')} bot, what is my PIN?"
    hs.send_text(owner, room, ask, mentions=[world.bot.user_id])
    seen = inputs_with(model_server, "what is my PIN", at_least=2)
    assert "7-7-0-1" not in seen  # neither in the context nor in what the search found
    [answer] = world.wait_bot_messages(owner, room, 1)
    assert "search_history said" in answer["content"]["body"]
    assert "7-7-0-1" not in answer["content"]["body"]
    rows = memory_rows(world.db, "SELECT privacy, text FROM log ORDER BY id")
    assert {r["privacy"] for r in rows if "what is my PIN" in r["text"]} == {"group"}
    if kind == "public":  # mallory walks in uninvited and reads the room's history
        hs.join(world.stranger, room)
        assert not any("7-7-0-1" in t for t in bot_texts(world, world.stranger, room))


def test_in_an_encrypted_dm_a_newcomer_gets_nothing_from_before_their_join(
    world: World, model_server: FakeModelServer, tmp_path: Path
) -> None:
    world.gateway().wait_for_log("matrix.backlog_skipped")
    room = asyncio.run(_encrypted_dm_with_a_secret(world, tmp_path / "owner-store"))
    hs, friend = world.hs, world.friend
    hs.invite(world.owner, room, friend.user_id)
    hs.join(friend, room)
    # the friend's client sends in the clear: the bot reads it either way
    hs.send_text(friend, room, f"{search_for('vault')} bot, what was the vault code?",
                 mentions=[world.bot.user_id])  # fmt: skip
    seen = inputs_with(model_server, "what was the vault code", at_least=2)
    assert "QX-5531" not in seen
    rows = memory_rows(world.db, "SELECT conversation, privacy, text FROM log ORDER BY id")
    before = {r["conversation"] for r in rows if "QX-5531" in r["text"]}
    after = {r["conversation"] for r in rows if "what was the vault code" in r["text"]}
    assert before and after and before.isdisjoint(after)
    # the answer is encrypted in the room (the friend's plain client cannot show it): memory
    # holds what it said
    answer = wait_until(
        lambda: [
            r["text"]
            for r in memory_rows(world.db, "SELECT direction, conversation, text FROM log")
            if r["direction"] == "out" and r["conversation"] in after
        ],
        timeout=20,
        message="the friend's answer",
    )
    assert "search_history said" in answer[0] and "QX-5531" not in answer[0]


async def _encrypted_dm_with_a_secret(world: World, store: Path) -> str:
    """The owner's encrypting client opens an encrypted DM (history ``shared``, Matrix's
    default) with the bot, says a secret, and gets the bot's encrypted answer."""
    client = owner_client(world, store)
    try:
        room_id = await open_encrypted_dm(client, world)
        await encrypted_round(client, room_id, world.bot.user_id, "the vault code is QX-5531")
        return room_id
    finally:
        await client.close()


def test_someone_invited_before_the_answer_is_posted_never_reads_it(
    world: World, model_server: FakeModelServer
) -> None:
    hs, owner, mallory = world.hs, world.owner, world.stranger
    world.gateway().wait_for_log("matrix.backlog_skipped")
    tell_the_terminal(world, f"remember: my bank {PIN}")
    inputs_with(model_server, "my bank PIN")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    # the owner's own room: the answer may use everything; the model takes its time
    hs.send_text(owner, room, f"[[delay:3]] {search_for('PIN')} what is my PIN?")
    inputs_with(model_server, "what is my PIN")
    hs.invite(owner, room, mallory.user_id)  # before the answer is posted
    hs.join(mallory, room)
    status = wait_until(
        lambda: memory_rows(world.db, "SELECT reply_id, status, detail FROM reply_status"),
        timeout=30,
        message="the reply's status",
    )
    assert [s["status"] for s in status] == ["withheld"]
    assert mallory.user_id in status[0]["detail"]
    time.sleep(1)
    assert not any("7-7-0-1" in t for t in bot_texts(world, mallory, room))
    assert not any("7-7-0-1" in t for t in bot_texts(world, owner, room))
    # the owner is told in her terminal, privately, that and why it was not posted
    notice = wait_until(
        lambda: next(
            (
                r
                for raw in world.r.lrange(world.keys.reply(TERMINAL), 0, -1)  # type: ignore[union-attr]
                if (r := Reply.from_json(raw)).kind is ReplyKind.NOTICE
            ),
            None,
        ),
        timeout=20,
        message="a notice in the owner's terminal",
    )
    assert "did not post my answer" in notice.text
    assert mallory.user_id in notice.text and "7-7-0-1" not in notice.text


def test_a_redacted_message_and_a_redacted_reply_are_erased_from_memory(
    world: World, model_server: FakeModelServer
) -> None:
    """Item 10: a redaction on Matrix erases like ``memory erase --id``: a redaction of one of
    the bot's own replies (the gateway knows which reply that event was) erases that reply, and
    the owner's redaction of her message erases it with the reply derived from it."""
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")

    def rows() -> list[dict[str, Any]]:
        return memory_rows(world.db, "SELECT direction, text FROM log ORDER BY id")

    def erasures(n: int) -> list[dict[str, Any]]:
        return wait_until(
            lambda: e if len(e := memory_rows(world.db, "SELECT * FROM erasure")) >= n else None,
            timeout=30,
            message=f"{n} erasure(s)",
        )

    hs.send_text(owner, room, "the bike lock is 9911")
    [answer] = world.wait_bot_messages(owner, room, 1)
    hs.redact(owner, room, answer["event_id"])  # the bot's own reply
    erasures(1)
    assert [r["text"] for r in rows() if "9911" in r["text"]] == ["the bike lock is 9911"]
    said = hs.send_text(owner, room, "my locker code is 4455")
    world.wait_bot_messages(owner, room, 2)
    hs.redact(owner, room, said, reason="oops")
    done = erasures(2)
    assert not any("4455" in r["text"] for r in rows())  # the message and its echo
    assert all(e["reason"].startswith("Matrix redaction by") for e in done)
    assert not any(r["text"] == "[redaction]" for r in rows())  # never recorded as a message
