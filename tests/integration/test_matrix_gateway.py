"""The Matrix gateway against a real Synapse, a real Redis and a real worker.

The gateway runs as its own process (``relaybot gateway matrix``), as ``honcho start`` runs it;
the people in the room are plain HTTP clients of the same homeserver.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from contract.keys import Keys
from tests.integration.test_acl import PASSWORDS, acl_redis  # noqa: F401 - a fixture
from tests.support.fakemodel import FakeModelServer
from tests.support.matrix_e2e import encrypted_round, open_encrypted_dm, owner_client
from tests.support.matrix_world import World
from tests.support.procs import Procs, memory_rows, relaybot_env, wait_until
from tests.support.synapse import SynapseServer

pytestmark = pytest.mark.integration


def test_owner_dm_round_trip_as_a_reply_with_owner_privacy(world: World) -> None:
    hs, owner = world.hs, world.owner
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    asked = hs.send_text(owner, room, "hello **bot**")

    reply = world.wait_bot_messages(owner, room, 1)[0]
    content = reply["content"]
    assert content["m.relates_to"]["m.in_reply_to"]["event_id"] == asked
    assert content["body"].startswith("echo: [matrix / owner]")
    assert content["body"].endswith("hello **bot**")
    assert "<strong>bot</strong>" in content["formatted_body"]
    assert content["format"] == "org.matrix.custom.html"

    rows = memory_rows(world.db, "SELECT * FROM log WHERE channel = 'matrix' ORDER BY id")
    assert [(r["direction"], r["privacy"]) for r in rows] == [("in", "owner"), ("out", "owner")]
    assert rows[0]["event_id"] == asked
    assert rows[0]["session"] == f"matrix:{room}"
    assert world.r.hget(world.keys.heartbeats, "gateway:matrix") is not None

    # an edit is recorded as an edit of the earlier message, not answered as a new request
    edit = hs.send_event(
        owner,
        room,
        {
            "msgtype": "m.text",
            "body": "* hello **there**",
            "m.new_content": {"msgtype": "m.text", "body": "hello **there**"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": asked},
        },
    )
    wait_until(
        lambda: memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", edit),
        timeout=15,
        message="the edit recorded in memory",
    )
    (edited,) = memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", edit)
    assert asked in edited["extra"] and edited["direction"] == "in"
    after = hs.send_text(owner, room, "and now a real question")
    replies = world.wait_bot_messages(owner, room, 2)
    assert [r["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] for r in replies] == [
        asked,
        after,
    ]  # the edit got no reply of its own

    # a reply carries the spec's fallback quote of what it answers: not recorded as said now
    answer = hs.send_event(
        owner,
        room,
        {
            "msgtype": "m.text",
            "body": f"> <{owner.user_id}> my passport number is P1234567\n\nwhat was that?",
            "format": "org.matrix.custom.html",
            "formatted_body": "<mx-reply><blockquote>my passport number is P1234567</blockquote>"
            "</mx-reply>what was that?",
            "m.relates_to": {"m.in_reply_to": {"event_id": after}},
        },
    )
    wait_until(
        lambda: memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", answer),
        timeout=15,
        message="the reply recorded in memory",
    )
    (replied,) = memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", answer)
    assert replied["text"] == "what was that?" and after in replied["extra"]
    assert "P1234567" not in json.dumps(memory_rows(world.db, "SELECT * FROM log"))


def test_group_mention_policy_and_strangers(world: World, model_server: FakeModelServer) -> None:
    """A mention-only room: the bot answers when mentioned, and records the room's talk that it
    was not asked about as the room's context, so the mentioned turn knows what the room was
    talking about (issue 13); a room set to ``record = "addressed"`` keeps only what the bot
    answers. Strangers are refused."""
    hs, owner, friend, stranger = world.hs, world.owner, world.friend, world.stranger
    group = hs.create_room(owner, [world.bot.user_id, friend.user_id], name="team")
    quiet = hs.create_room(owner, [world.bot.user_id, friend.user_id], name="quiet")
    for room in (group, quiet):
        hs.join(friend, room)
    config = Path(world.env["RELAYBOT_HOME"]) / "config.toml"
    with config.open("a", encoding="utf-8") as toml:
        toml.write(f'\n[matrix.rooms."{quiet}"]\nrecord = "addressed"\n')
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    wait_until(lambda: world.joined(group) and world.joined(quiet), timeout=15,
               message="the bot to join the rooms")  # fmt: skip

    talk = hs.send_text(
        friend, group, "talking among ourselves: the demo moves to 3pm", mentions=[]
    )
    hs.send_text(friend, quiet, "off the record", mentions=[])
    notice = hs.send_event(friend, group, {"msgtype": "m.notice", "body": "CI: the build is red"})
    wait_until(
        lambda: memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", notice),
        timeout=15,
        message="the room's talk recorded in memory",
    )
    calls = model_server.calls
    asked = hs.send_text(friend, group, "bot, what is up?", mentions=[world.bot.user_id])
    reply = world.wait_bot_messages(friend, group, 1)[0]
    assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == asked
    assert "what is up" in reply["content"]["body"]
    assert model_server.calls == calls + 1  # the talk was recorded, never a model call
    context = json.dumps(model_server.requests[-1]["messages"])
    assert "the demo moves to 3pm" in context  # the mentioned turn knows what was said
    assert "CI: the build is red" in context  # a bot's notice too (never answered)

    asked_quiet = hs.send_text(friend, quiet, "bot, and here?", mentions=[world.bot.user_id])
    world.wait_bot_messages(friend, quiet, 1)
    assert "off the record" not in json.dumps(model_server.requests[-1]["messages"])

    # a stranger's invite is refused, and a stranger in an existing DM-sized room is ignored
    lone = hs.create_room(stranger, [world.bot.user_id], direct=True)
    wait_until(
        lambda: hs.members(stranger, lone).get(world.bot.user_id) == "leave",
        timeout=15, message="the bot to refuse the stranger's invite",
    )  # fmt: skip
    dm = hs.create_room(owner, [world.bot.user_id, stranger.user_id], direct=True)
    wait_until(lambda: world.joined(dm), timeout=15, message="the bot to join")
    hs.join(stranger, dm)
    hs.send_text(owner, dm, "@stranger is here, bot: say hi", mentions=[world.bot.user_id])
    world.wait_bot_messages(owner, dm, 1)  # three people: a group, the owner mentioned the bot

    # the room's talk reached the stream marked not to be answered; the quiet room's did not
    entries: Any = world.r.xrange(world.keys.inbound_of("matrix"), "-", "+")
    fields = [f for _, f in entries if f[b"channel"] == b"matrix"]
    texts = [f[b"text"].decode() for f in fields]
    assert texts == [
        "talking among ourselves: the demo moves to 3pm",
        "CI: the build is red",
        "bot, what is up?",
        "bot, and here?",
        "@stranger is here, bot: say hi",
    ]
    assert [json.loads(f[b"extra"]).get("no_reply") for f in fields] == [
        "not mentioned in a mention-only room",
        "m.notice (bots talk in notices; not answered)",
        None,
        None,
        None,
    ]
    assert {f[b"privacy"] for f in fields} == {b"group"}
    assert len(world.bot_messages(friend, group)) == 1  # the talk got no reply
    (row,) = memory_rows(world.db, "SELECT * FROM log WHERE event_id = ?", talk)
    assert row["privacy"] == "group" and row["conversation"] == f"matrix:{group}"
    assert not memory_rows(world.db, "SELECT * FROM log WHERE text = 'off the record'")
    assert asked_quiet
    # state events (joins, names, topics) are not warnings: nothing in this room is wrong
    warnings = [r for r in gateway.records() if r.get("level") in ("warning", "error")]
    assert not warnings, gateway.log_text()


def test_gateway_killed_each_message_answered_exactly_once(world: World) -> None:
    hs, owner = world.hs, world.owner
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")

    sent = [hs.send_text(owner, room, f"m{i}") for i in range(5)]
    gateway.signal(signal.SIGKILL)  # while the messages arrive
    gateway.wait()
    sent += [hs.send_text(owner, room, f"m{i}") for i in range(5, 10)]  # while it is down

    restarted = world.gateway()
    # each message answered exactly once: by its own reply, or by a collected one (messages
    # that piled up while their session's turn ran: memory's reply_covers names them)
    db = world.db

    def all_answered() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        ins = memory_rows(db, "SELECT stream_id, event_id FROM log WHERE direction = 'in'")
        outs = memory_rows(db, "SELECT stream_id FROM log WHERE direction = 'out'")
        covered = memory_rows(db, "SELECT stream_id FROM reply_covers")
        keys = [o["stream_id"] for o in outs] + [c["stream_id"] for c in covered]
        if len(ins) < len(sent) or sorted(keys) != sorted(i["stream_id"] for i in ins):
            return None
        if len(world.bot_messages(owner, room)) < len(outs):
            return None
        return ins, outs

    ins, outs = wait_until(all_answered, timeout=30, message="every message answered")
    wait_until(lambda: world.r.llen(world.keys.reply(f"matrix:{room}")) == 0, timeout=10)
    time.sleep(0.5)  # a second copy of a reply would show now
    replies = world.bot_messages(owner, room)
    assert len(replies) == len(outs)  # one message per recorded reply, none twice
    event_of = {i["stream_id"]: i["event_id"] for i in ins}
    answered = [e["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] for e in replies]
    assert sorted(answered) == sorted(event_of[o["stream_id"]] for o in outs)
    assert not restarted.events("matrix.backlog_skipped")  # caught up from the token
    assert restarted.events("matrix.gap_filled")  # more than one sync's timeline was missed
    rows = memory_rows(world.db, "SELECT event_id FROM log WHERE direction = 'in'")
    assert sorted(r["event_id"] for r in rows) == sorted(sent)


def test_a_crash_between_xadd_and_token_publishes_nothing_twice(world: World) -> None:
    """The saved token is set back, as if the gateway died after its XADDs: the seen set holds."""
    hs, owner = world.hs, world.owner
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    cursor = f"{world.keys.prefix}cursor:matrix"
    early = world.r.get(cursor)
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    for i in range(3):  # one at a time: messages that pile up would be answered together
        hs.send_text(owner, room, f"q{i}")
        world.wait_bot_messages(owner, room, i + 1)
    assert gateway.stop() == 0
    assert world.r.get(cursor) != early
    world.r.set(cursor, early or b"")

    again = world.gateway()
    wait_until(
        lambda: len(again.events("matrix.already_published")) >= 3,
        timeout=15, message="the replayed events to be recognised",
    )  # fmt: skip
    entries: Any = world.r.xrange(world.keys.inbound_of("matrix"), "-", "+")
    assert len([1 for _, f in entries if f[b"channel"] == b"matrix"]) == 3
    assert len(world.bot_messages(owner, room)) == 3


def test_typing_while_the_worker_is_on_a_slow_turn(world: World) -> None:
    hs, owner = world.hs, world.owner
    world.gateway().wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    since = hs.sync(owner)["next_batch"]
    hs.send_text(owner, room, "[[delay:2]] take your time")

    seen: list[list[str]] = []

    def typing_update() -> list[str] | None:
        nonlocal since
        out = hs.sync(owner, since)
        since = out["next_batch"]
        ephemeral = out.get("rooms", {}).get("join", {}).get(room, {}).get("ephemeral", {})
        for event in ephemeral.get("events", []):
            if event["type"] == "m.typing":
                seen.append(event["content"]["user_ids"])
        return seen[-1] if seen else None

    wait_until(
        lambda: world.bot.user_id in (typing_update() or []),
        timeout=10, interval=0.1, message="the bot to be seen typing",
    )  # fmt: skip
    assert not world.bot_messages(owner, room)  # typing came before the answer
    world.wait_bot_messages(owner, room, 1)
    wait_until(
        lambda: (now := typing_update()) is not None and world.bot.user_id not in now,
        timeout=10, interval=0.1, message="the typing notice to stop",
    )  # fmt: skip


def test_encrypted_dm_both_ways(world: World, tmp_path: Path) -> None:
    """The owner's encrypting client (nio + vodozemac) sends; the bot decrypts and answers
    encrypted; the owner's client decrypts the answer."""
    hs, owner = world.hs, world.owner
    gateways = [world.gateway()]
    gateways[0].wait_for_log("matrix.backlog_skipped")

    def restart() -> None:  # the crypto store and device id survive a restart
        assert gateways[-1].stop() == 0
        gateways.append(world.gateway())

    answers = asyncio.run(_owner_encrypted_exchange(world, tmp_path / "owner-store", restart))
    for answer, said in zip(answers, ("a secret for the bot", "after the restart"), strict=True):
        assert answer["content"]["body"].startswith("echo: [matrix / owner]")
        assert answer["content"]["body"].endswith(said)
    assert (
        gateways[1].wait_for_log("matrix.logged_in")["device_id"]
        == (gateways[0].wait_for_log("matrix.logged_in")["device_id"])
    )
    rows = memory_rows(world.db, "SELECT * FROM log WHERE channel = 'matrix' ORDER BY id")
    assert [(r["direction"], r["privacy"]) for r in rows] == [("in", "owner"), ("out", "owner")] * 2
    assert rows[0]["text"] == "a secret for the bot"
    answer = answers[0]
    # on the server the messages exist only as ciphertext
    raw = hs.request(
        "GET",
        f"/_matrix/client/v3/rooms/{quote(answer['room_id'])}/messages?dir=b&limit=50",
        token=owner.access_token,
    )["chunk"]
    bot_events = {e["type"] for e in raw if e["sender"] == world.bot.user_id}
    assert bot_events - {"m.room.member"} == {"m.room.encrypted"}


async def _owner_encrypted_exchange(
    world: World, store: Path, restart: Callable[[], None]
) -> list[dict[str, Any]]:
    client = owner_client(world, store)
    try:
        room_id = await open_encrypted_dm(client, world)
        first = await encrypted_round(client, room_id, world.bot.user_id, "a secret for the bot")
        await asyncio.to_thread(restart)
        second = await encrypted_round(client, room_id, world.bot.user_id, "after the restart")
        return [first, second]
    finally:
        await client.close()


def test_the_gateway_runs_as_its_own_redis_acl_user(
    tmp_path: Path,
    acl_redis: int,  # noqa: F811 - the fixture imported from test_acl
    synapse_server: SynapseServer,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """deploy/redis/users.acl: ``relaybot-matrix`` may do everything the gateway does."""

    def url(user: str) -> str:
        return f"redis://relaybot-{user}:{PASSWORDS[user]}@127.0.0.1:{acl_redis}/0"

    env = relaybot_env(
        tmp_path / "home", redis_url=url("worker"), prefix="relaybot:",
        model_url=model_server.base_url,
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the count is the check
    )  # fmt: skip
    admin = redis.Redis.from_url(url("worker"))
    world = World(synapse_server, env, admin, Keys("relaybot:"), procs)
    procs.worker(env, r=admin, keys=world.keys)
    world.env = {**world.env, "REDIS_URL": url("matrix")}
    gateway = world.gateway()
    gateway.wait_for_log("matrix.backlog_skipped")
    room = world.hs.create_room(world.owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    world.hs.send_text(world.owner, room, "[[delay:0.5]] through the ACL")
    reply = world.wait_bot_messages(world.owner, room, 1)[0]
    assert reply["content"]["body"].endswith("through the ACL")
    assert not [r for r in gateway.records() if "NOPERM" in str(r)]


def test_verbose_logs_hold_no_token_and_no_message_text(world: World) -> None:
    """``relaybot -v gateway matrix``: nio's debug lines (a login's access token, a sync's
    message bodies) never reach the log, and our own debug lines hold no message text."""
    hs, owner = world.hs, world.owner
    gateway = world.gateway(verbose=True)
    gateway.wait_for_log("matrix.backlog_skipped")
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    hs.send_text(owner, room, "my passport number is QX7781234")
    world.wait_bot_messages(owner, room, 1)
    text = gateway.log_text() + gateway.out_path.read_text(encoding="utf-8", errors="replace")
    assert '"level": "debug"' in text or "[debug" in text  # -v did turn debug on
    assert "QX7781234" not in text, "a log line holds message text"
    assert "syt_" not in text and world.bot.access_token not in text, "a token in the log"
    assert "Validating response schema" not in text
