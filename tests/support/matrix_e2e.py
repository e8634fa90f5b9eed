"""The owner's end-to-end encrypting Matrix client (nio + vodozemac) for the integration tests:
an encrypted DM with the bot, and one encrypted exchange in it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nio import (
    AsyncClient,
    AsyncClientConfig,
    MegolmEvent,
    RoomCreateResponse,
    RoomMessageText,
    RoomSendResponse,
    SyncResponse,
)

from gateways.matrix.sync import crypto_housekeeping
from tests.support.matrix_world import World


def owner_client(world: World, store: Path) -> AsyncClient:
    """The owner's client, logged in with her test device, its crypto store in ``store``."""
    owner = world.owner
    store.mkdir()
    client = AsyncClient(
        world.hs.url, owner.user_id, device_id=owner.device_id, store_path=str(store),
        config=AsyncClientConfig(encryption_enabled=True, store_sync_tokens=False),
    )  # fmt: skip
    client.restore_login(owner.user_id, owner.device_id, owner.access_token)
    return client


async def sync_step(client: AsyncClient, timeout_ms: int = 300) -> SyncResponse:
    resp = await client.sync(timeout=timeout_ms)
    assert isinstance(resp, SyncResponse), resp
    await crypto_housekeeping(client)
    return resp


async def open_encrypted_dm(client: AsyncClient, world: World) -> str:
    """An encrypted DM with the bot (history ``shared``, Matrix's default), once the bot joined
    and its device keys are known; its room id."""
    bot = world.bot
    await sync_step(client, 0)
    created = await client.room_create(
        is_direct=True,
        invite=[bot.user_id],
        initial_state=[
            {
                "type": "m.room.encryption",
                "state_key": "",
                "content": {"algorithm": "m.megolm.v1.aes-sha2"},
            }
        ],
    )
    assert isinstance(created, RoomCreateResponse), created
    room_id = created.room_id
    deadline = time.monotonic() + 20
    while not (room_id in client.rooms and bot.user_id in client.rooms[room_id].users):
        assert time.monotonic() < deadline, "the bot did not join the encrypted DM"
        await sync_step(client)
    await sync_step(client)  # the bot's device keys
    return room_id


async def encrypted_round(
    client: AsyncClient, room_id: str, bot_id: str, text: str
) -> dict[str, Any]:
    """Send ``text`` encrypted; the bot's decrypted answer to it."""
    sent = await client.room_send(
        room_id,
        "m.room.message",
        {"msgtype": "m.text", "body": text},
        ignore_unverified_devices=True,
    )
    assert isinstance(sent, RoomSendResponse), sent
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, "no decrypted answer from the bot"
        resp = await sync_step(client)
        room = resp.rooms.join.get(room_id)
        for event in room.timeline.events if room else []:
            if isinstance(event, MegolmEvent):
                raise AssertionError(f"the owner could not decrypt {event.event_id}")
            if isinstance(event, RoomMessageText) and event.sender == bot_id:
                assert event.decrypted
                relates = event.source["content"].get("m.relates_to", {})
                assert relates["m.in_reply_to"]["event_id"] == sent.event_id
                return {**event.source, "room_id": room_id}
