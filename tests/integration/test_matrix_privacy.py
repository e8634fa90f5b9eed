"""Issue 10, case 4, through the real Matrix gateway and worker against a real Synapse: a room's
audience is who can read it there and then. A DM that hides its history from newcomers becomes a
new conversation when someone is invited (they see nothing of it), and a room that shows its
history to everyone stays a group when it shrinks (nobody's private words come in while the
others can rejoin and read)."""

from __future__ import annotations

import json
import time

import pytest

from contract.bus import publish
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.matrix_world import World
from tests.support.procs import memory_rows, wait_until

pytestmark = pytest.mark.integration


def model_input(server: FakeModelServer, marker: str) -> str:
    def find() -> str | None:
        for body in server.requests:
            if marker in body["messages"][-1]["content"]:
                return json.dumps(body["messages"], ensure_ascii=False)
        return None

    return wait_until(find, timeout=30, message=f"a model request for {marker!r}")


def test_someone_invited_into_a_dm_that_hides_history_sees_none_of_it(
    world: World,
    model_server: FakeModelServer,
) -> None:
    hs, owner, friend = world.hs, world.owner, world.friend
    world.gateway().wait_for_log("matrix.backlog_skipped")
    dm = hs.create_room(owner, [world.bot.user_id], direct=True, history_visibility="joined")
    wait_until(lambda: world.joined(dm), timeout=15, message="the bot to join the DM")
    hs.send_text(owner, dm, "just us: the vault code is QX-5531")
    assert "QX-5531" in model_input(model_server, "the vault code is")
    world.wait_bot_messages(owner, dm, 1)

    hs.invite(owner, dm, friend.user_id)
    hs.join(friend, dm)
    hs.send_text(friend, dm, "bot, anything I should know?", mentions=[world.bot.user_id])
    seen = model_input(model_server, "anything I should know")
    assert "QX-5531" not in seen
    world.wait_bot_messages(owner, dm, 2)  # the turn is recorded
    rows = memory_rows(world.db, "SELECT conversation, privacy, text FROM log ORDER BY id")
    before = {r["conversation"] for r in rows if "vault" in r["text"]}
    after = {r["conversation"] for r in rows if "anything I should" in r["text"]}
    assert before and after and before.isdisjoint(after)  # two audiences, two conversations
    assert {r["privacy"] for r in rows if "anything I should" in r["text"]} != {"owner"}


def test_a_room_that_shows_its_history_stays_a_group_when_it_shrinks(
    world: World,
    model_server: FakeModelServer,
) -> None:
    hs, owner, friend = world.hs, world.owner, world.friend
    world.gateway().wait_for_log("matrix.backlog_skipped")
    # the friend's private words, in the friend's own DM with the assistant
    dm = "matrix:!friend-dm:elsewhere"
    private = InboundMessage(
        channel="matrix", session=dm, conversation=dm, sender=friend.user_id,
        privacy=Privacy.DIRECT, text="between us: my salary is 80k", ts=time.time(),
        event_id="$private-1",
    )  # fmt: skip
    publish(world.r, world.keys, private)
    model_input(model_server, "my salary is 80k")

    room = hs.create_room(friend, [world.bot.user_id, owner.user_id], name="three of us")
    hs.join(owner, room)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the room")
    hs.send_text(owner, room, "hello both", mentions=[world.bot.user_id])
    model_input(model_server, "hello both")
    hs.leave(owner, room)  # two left: the friend and the assistant (and the owner may rejoin)
    hs.send_text(friend, room, "bot, what do you know about me?", mentions=[world.bot.user_id])
    seen = model_input(model_server, "what do you know about me")
    assert "80k" not in seen
    rows = wait_until(
        lambda: [
            r
            for r in memory_rows(world.db, "SELECT privacy, text FROM log ORDER BY id")
            if "know about me" in r["text"]
        ],
        timeout=20,
        message="the turn recorded",
    )
    assert {r["privacy"] for r in rows} == {"group"}
