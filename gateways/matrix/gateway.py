"""The Matrix gateway: ``relaybot gateway matrix``, a :class:`~gateways.runner.Channel`.

One nio ``AsyncClient`` with a persistent store (device id and crypto keys under
``$RELAYBOT_HOME/matrix``), logged in by :mod:`gateways.matrix.login`; its inbound loop is
:mod:`gateways.matrix.sync`. Replies are delivered by the runner from the reply queues of the
joined rooms (``reply:matrix:<room>``; the rooms are known, so nothing is SCANned) as Matrix
replies, with the reply id as transaction id: the homeserver drops a resend after a crash (an
idempotent sink). A typing notice is kept alive while the worker marks the session busy.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
import redis
import structlog
from nio import AsyncClient, ErrorResponse, RoomGetStateResponse

from contract.config import Config, OwnerAlias
from contract.messages import Reply
from gateways.deliver import Withheld
from gateways.matrix import channel as spec
from gateways.matrix.config import MatrixConfig
from gateways.matrix.events import (
    CHANNEL,
    GroupPolicy,
    Policy,
    RoomState,
    room_facts,
    room_of,
    session_of,
)
from gateways.matrix.keys import MatrixKeys
from gateways.matrix.login import ErrorValue, FatalMatrixError, check_fatal, describe, login
from gateways.matrix.recheck import recheck
from gateways.matrix.render import reply_content
from gateways.matrix.sync import MatrixSync, optional_text
from gateways.runner import Backoff, Runtime, TypingHook, run_gateway

__all__ = ["FatalMatrixError", "MatrixGateway", "build_policy", "run_matrix"]

log = structlog.get_logger(__name__)

HINT = spec.CHANNEL.hint  # what the log says when the section is not configured

TYPING_MS = 30_000
SENT_KEEP = 30 * 24 * 3600  # how long a sent event's reply id is kept (for its redaction)
TYPING_REFRESH = 20.0


def build_policy(cfg: Config, own_user_id: str) -> Policy:
    m = MatrixConfig.of(cfg)
    owners = set(m.owners)
    for alias in cfg.owner.aliases:
        address = alias.address if isinstance(alias, OwnerAlias) else alias
        scoped = alias.channel if isinstance(alias, OwnerAlias) else None
        if address.startswith("@") and ":" in address and scoped in (None, "matrix"):
            owners.add(address)
    rooms = {
        room_id: (GroupPolicy(room.policy), frozenset(room.allowlist))
        for room_id, room in m.rooms.items()
    }
    record = {room_id: room.record == "all" for room_id, room in m.rooms.items() if room.record}
    localpart = own_user_id.split(":", 1)[0].lstrip("@")
    return Policy(
        own_user_id=own_user_id,
        owners=frozenset(owners),
        dm_allowlist=frozenset(m.allowlist),
        group_policy=GroupPolicy(m.group_policy),
        group_allowlist=frozenset(m.group_allowlist),
        rooms=rooms,
        own_names=tuple({localpart, cfg.worker.assistant_name, m.device_name}),
        record_all=m.record == "all",
        room_record=record,
    )


class MatrixGateway:
    name = CHANNEL
    idempotent_sink = True  # the reply id is the transaction id
    tick = 0.1

    def __init__(self, cfg: Config, r: redis.Redis, rt: Runtime) -> None:
        self.cfg, self.m, self.r, self.keys, self.rt = cfg, MatrixConfig.of(cfg), r, cfg.keys, rt
        self.store = self.m.store_path or cfg.home / "matrix"
        self.client: AsyncClient | None = None
        self.sync: MatrixSync | None = None
        self.typing: dict[str, float] = {}  # room id -> when the typing notice was (re)sent
        self.show_typing: TypingHook | None = self._update_typing if self.m.typing else None

    async def start(self) -> None:
        backoff = Backoff()
        while not self.rt.stopping.is_set():
            try:
                self.client = await login(self.m, self.store)
                return
            except (ErrorValue, OSError, TimeoutError, aiohttp.ClientError) as exc:
                await self.rt.retry_after(backoff, "matrix.login_failed", error=str(exc))

    def inbound(self) -> dict[str, Coroutine[Any, Any, None]]:
        client = self._client()
        sync = MatrixSync(self.cfg, self.r, self.rt, client, build_policy(self.cfg, client.user_id))
        self.sync = sync
        return {"sync": sync.run()}

    def reconfigure(self, cfg: Config) -> None:
        """config.toml changed (gateways/runner.py): the owners, allowlists and room policies
        apply from the next event on."""
        self.cfg = cfg
        if self.sync is not None and self.client is not None:
            self.sync.policy = build_policy(cfg, self.client.user_id)

    async def sessions(self) -> list[str]:
        return [session_of(room_id) for room_id in self._client().rooms]

    async def send(self, reply: Reply) -> None:
        client = self._client()
        room_id = room_of(reply.session)
        await self._recheck(reply, room_id)
        thread = (
            optional_text(self.r.get(MatrixKeys(self.keys).thread(reply.in_reply_to)))
            if reply.in_reply_to
            else None
        )
        content = reply_content(reply.text, reply.in_reply_to or None, thread, notice=False)
        if room_id in self.typing:
            self.typing.pop(room_id)
            await client.room_typing(room_id, typing_state=False)
        resp = await client.room_send(
            room_id, "m.room.message", content, tx_id=reply.reply_id,
            ignore_unverified_devices=True,
        )  # fmt: skip
        if isinstance(resp, ErrorResponse):
            check_fatal(resp)
            raise RuntimeError(f"room_send failed: {describe(resp)}")
        log.info("matrix.sent", room_id=room_id, reply_id=reply.reply_id, event_id=resp.event_id)
        # a redaction of it names the event: memory knows the reply by its id and its entry
        sent = json.dumps({"reply_id": reply.reply_id, "answers": reply.answers})
        self.r.set(MatrixKeys(self.keys).sent(resp.event_id), sent, ex=SENT_KEEP)

    async def _recheck(self, reply: Reply, room_id: str) -> None:
        """The room as the homeserver has it now (not as the last sync left it: someone may
        have been invited since), classified again: :class:`Withheld` when the reply would
        reach people it was not written for (gateways/matrix/recheck.py)."""
        client = self._client()
        resp = await client.room_get_state(room_id)
        if not isinstance(resp, RoomGetStateResponse):
            check_fatal(resp)
            raise RuntimeError(f"the room's state could not be read: {describe(resp)}")
        room = RoomState.of([e for e in resp.events if isinstance(e, dict)])
        members = frozenset(room.members)
        known = optional_text(self.r.get(MatrixKeys(self.keys).members(room_id)))
        ever = frozenset(json.loads(known) if known else ()) | members
        now = room_facts(
            room_id, members, own_user_id=client.user_id, ever=ever, display_names={},
            openness=room.openness(),
        )  # fmt: skip
        policy = (
            self.sync.policy if self.sync is not None else build_policy(self.cfg, client.user_id)
        )
        verdict = recheck(reply, now, policy)
        if verdict is not None:
            raise Withheld(verdict.reason, verdict.report)

    async def _update_typing(self, busy: frozenset[str]) -> None:
        client, now = self._client(), time.monotonic()
        rooms = {room_of(session) for session in busy}
        for room_id in rooms:
            if now - self.typing.get(room_id, 0.0) > TYPING_REFRESH:
                self.typing[room_id] = now
                await client.room_typing(room_id, typing_state=True, timeout=TYPING_MS)
        for room_id in [r for r in self.typing if r not in rooms]:
            self.typing.pop(room_id)
            await client.room_typing(room_id, typing_state=False)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    def _client(self) -> AsyncClient:
        if self.client is None:
            raise RuntimeError("not logged in")
        return self.client


def run_matrix(cfg: Config, r: redis.Redis) -> int:
    """The ``relaybot gateway matrix`` command: 0 when stopped, 2 when a person has to act."""
    make = functools.partial(MatrixGateway, cfg, r)
    return run_gateway(
        CHANNEL, cfg, r, configured=MatrixConfig.of(cfg).configured, hint=HINT, make=make
    )
