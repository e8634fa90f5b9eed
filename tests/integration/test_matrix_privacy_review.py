"""Issue 24: what the adversarial review of round 3 found on the Matrix side, against a real
Synapse (each failed before its fix):

- the room's openness was taken from what the client library parsed of its state, which keeps
  the old join rule when a new one is one it does not know, and takes a setting from a state
  event whose state key is not empty (a decoy): the owner's public room was her own again;
- a group re-answer (the owner's room opened while its answer was written) saw, in its history,
  the withheld owner-context reply and what was said while the room was hers;
- a group room made encrypted while a turn ran lost its answer.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest

from contract.bus import publish
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.matrix_world import World
from tests.support.procs import memory_rows, wait_until

pytestmark = pytest.mark.integration

PIN = "7-7-0-1"


def tell_the_terminal(world: World, model_server: FakeModelServer) -> None:
    msg = InboundMessage(
        channel="cli", session="cli:terminal", conversation="cli:terminal", sender="olivia",
        privacy=Privacy.OWNER, text=f"remember: my bank PIN {PIN}", ts=time.time(),
        event_id=f"cli-{time.time_ns()}",
    )  # fmt: skip
    publish(world.r, world.keys, msg)
    wait_until(
        lambda: any(PIN in json.dumps(b["messages"]) for b in model_server.requests) or None,
        timeout=20,
        message="the terminal's turn",
    )


def turns_on(server: FakeModelServer, marker: str) -> list[str]:
    """The model input of every turn started on ``marker`` (its last message the user's)."""
    return [
        json.dumps(b["messages"], ensure_ascii=False)
        for b in server.requests
        if b["messages"][-1].get("role") == "user" and marker in str(b["messages"][-1]["content"])
    ]


def privacy_of(world: World, marker: str) -> set[str]:
    rows = memory_rows(world.db, "SELECT direction, privacy, text FROM log")
    return {r["privacy"] for r in rows if r["direction"] == "in" and marker in r["text"]}


def test_a_join_rule_relaybot_does_not_know_opens_the_room(
    world: World, model_server: FakeModelServer
) -> None:
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join")
    hs.set_state(owner, room, "m.room.join_rules", {"join_rule": "xyz.future_rule"})
    hs.send_text(owner, room, "still mine?")
    wait_until(lambda: privacy_of(world, "still mine?") or None, timeout=20, message="recorded")
    assert privacy_of(world, "still mine?") == {"group"}  # a group's talk, not the owner's room


@pytest.mark.parametrize(
    ("kind", "opened", "decoy"),
    [
        ("m.room.join_rules", {"join_rule": "public"}, {"join_rule": "invite"}),
        ("m.room.history_visibility", {"history_visibility": "world_readable"},
         {"history_visibility": "joined"}),
    ],
)  # fmt: skip
def test_a_state_event_with_another_state_key_is_not_the_rooms_setting(
    world: World,
    model_server: FakeModelServer,
    kind: str,
    opened: dict[str, str],
    decoy: dict[str, str],
) -> None:
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    tell_the_terminal(world, model_server)
    room = hs.create_room(owner, [world.bot.user_id], name="open", state={kind: opened})
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join")
    path = f"/_matrix/client/v3/rooms/{quote(room)}/state/{kind}/x"
    hs.request("PUT", path, decoy, owner.access_token)  # state key "x": not the room's setting
    hs.send_text(owner, room, "[[tool:search_history:{\"query\": \"PIN\"}]] bot, my PIN?",
                 mentions=[world.bot.user_id])  # fmt: skip
    seen = wait_until(
        lambda: "\n".join(t) if len(t := turns_on(model_server, "bot, my PIN?")) else None,
        timeout=30,
        message="the turn",
    )
    assert PIN not in seen
    assert privacy_of(world, "bot, my PIN?") == {"group"}


def test_a_reanswer_for_the_opened_room_sees_nothing_said_while_it_was_the_owners(
    world: World, model_server: FakeModelServer
) -> None:
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    tell_the_terminal(world, model_server)
    room = hs.create_room(owner, [world.bot.user_id], direct=True, history_visibility="joined")
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join")
    hs.send_text(owner, room, "my locker code is LK-5566")
    world.wait_bot_messages(owner, room, 1)
    hs.send_text(owner, room, '[[delay:3]] [[tool:search_history:{"query": "PIN"}]] my PIN?')
    wait_until(lambda: turns_on(model_server, "my PIN?") or None, timeout=20, message="a turn")
    hs.set_state(owner, room, "m.room.join_rules", {"join_rule": "public"})  # same members
    turns = wait_until(
        lambda: t if len(t := turns_on(model_server, "my PIN?")) >= 2 else None,
        timeout=40,
        message="the answer again, for the room as it is now",
    )
    again = turns[1]
    assert "my PIN?" in again  # the question, answered again for a group
    assert PIN not in again  # not the terminal
    assert "LK-5566" not in again  # nor what was said while the room was the owner's alone
    statuses = memory_rows(world.db, "SELECT status FROM reply_status")
    assert {"status": "withheld"} in statuses


def test_a_group_room_made_encrypted_during_a_turn_still_gets_its_answer(
    world: World, model_server: FakeModelServer
) -> None:
    hs, friend, owner, bot = world.hs, world.friend, world.owner, world.bot.user_id
    world.gateway().wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(friend, [bot, owner.user_id], name="team")
    wait_until(lambda: hs.members(friend, room).get(bot) == "join", timeout=15, message="joined")
    hs.join(owner, room)
    hs.send_text(friend, room, "[[delay:3]] bot, encrypted soon?", mentions=[bot])
    wait_until(
        lambda: turns_on(model_server, "encrypted soon") or None, timeout=20, message="a turn"
    )
    hs.set_state(friend, room, "m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"})

    def from_bot() -> list[dict[str, Any]] | None:
        path = f"/_matrix/client/v3/rooms/{quote(room)}/messages?dir=b&limit=50"
        chunk = hs.request("GET", path, token=friend.access_token)["chunk"]
        found = [e for e in chunk if e["sender"] == bot and e["type"] != "m.room.member"]
        return found or None

    assert wait_until(from_bot, timeout=40, message="the bot's answer (encrypted)")
    assert memory_rows(world.db, "SELECT status FROM reply_status WHERE status = 'withheld'") == []


@pytest.mark.parametrize("change", ["invite", "world_readable"])
def test_a_message_read_late_gets_the_audience_it_was_said_to(
    world: World, model_server: FakeModelServer, change: str
) -> None:
    """Found by the second round: the gateway, down while the owner said something in her own
    room and then changed the room (invited the friend, made it world-readable), read the
    message back after its restart with the room's later audience: the friend's turn (or one
    anyone reads) found it."""
    hs, owner, friend, bot = world.hs, world.owner, world.friend, world.bot.user_id
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    visibility = "shared" if change == "world_readable" else "joined"
    room = hs.create_room(owner, [bot], direct=True, history_visibility=visibility)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join")
    hs.send_text(owner, room, "hello bot")
    world.wait_bot_messages(owner, room, 1)
    assert gateway.stop() == 0
    hs.send_text(owner, room, "my locker code is LK-5566")  # while the gateway is down
    if change == "world_readable":
        hs.set_state(owner, room, "m.room.history_visibility",
                     {"history_visibility": "world_readable"})  # fmt: skip
        asker = owner
    else:
        hs.invite(owner, room, friend.user_id)
        hs.join(friend, room)
        asker = friend
    world.gateway()  # reads the gap back
    wait_until(lambda: privacy_of(world, "LK-5566") or None, timeout=30, message="read back")
    assert privacy_of(world, "LK-5566") == {"owner"}  # said to the owner alone
    hs.send_text(asker, room, '[[tool:search_history:{"query": "locker"}]] bot, late probe',
                 mentions=[bot])  # fmt: skip
    seen = wait_until(
        lambda: "\n".join(t) if len(t := turns_on(model_server, "late probe")) else None,
        timeout=30,
        message="the turn after",
    )
    assert "LK-5566" not in seen
