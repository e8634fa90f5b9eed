"""The Matrix gateway's inbound loop: ``/sync``, normalize, XADD, then save the token.

``/sync`` runs from the token saved in Redis (``<prefix>cursor:matrix``); each room event is
normalized by :mod:`gateways.matrix.events` and XADDed together with its event id in a "seen" set
(one MULTI, durable before it returns: :mod:`contract.durable`), and the token is saved only after
the whole batch was published. A gateway killed between the XADD and the token finds the events in
the seen set and skips them. The very first start (no token) skips the backlog and says so. A
timeline the homeserver cut short is read back with ``/messages``. Invites are accepted from the
owner and the allowlist only.

Error responses (values, not exceptions) and network errors back off (:class:`Backoff`); a lost
session is fatal. Redis going away (a restart) is waited out (``redis.unreachable``, then
``redis.reconnected``); the batch is synced again from the saved token, whose events already
published are in the seen set.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import redis
import structlog
from nio import (
    Api,
    AsyncClient,
    ErrorResponse,
    InviteMemberEvent,
    RoomContextResponse,
    RoomMessagesResponse,
    SyncResponse,
)

from contract.access import REFUSED, refusal
from contract.bus import stream_id, text
from contract.config import Config
from contract.durable import Durable, NotDurable
from contract.outage import TRANSIENT, Outage
from gateways.matrix.config import MatrixConfig
from gateways.matrix.events import (
    CHANNEL,
    DEBUG,
    WARNING,
    Policy,
    Rejected,
    RoomState,
    normalize_event,
    room_facts,
)
from gateways.matrix.keys import MatrixKeys
from gateways.matrix.login import ErrorValue, check_fatal
from gateways.runner import Backoff, FatalGatewayError, Runtime

log = structlog.get_logger(__name__)

SEEN_KEEP = 30 * 24 * 3600.0  # how long processed event ids are remembered
THREAD_KEEP = 7 * 24 * 3600
GAP_MAX = 5000  # events read back after a long outage, per room and sync
_NO_TL: dict[str, Any] = {"room": {"timeline": {"limit": 0}}, "presence": {"types": []}}


class MatrixSync:
    def __init__(
        self, cfg: Config, r: redis.Redis, rt: Runtime, client: AsyncClient, policy: Policy
    ) -> None:
        self.m, self.r, self.rt, self.keys = MatrixConfig.of(cfg), r, rt, cfg.keys
        self.client, self.policy = client, policy
        self.published = 0
        self.durable = Durable(r)
        # room id -> the room as the last event read left it (members, openness)
        self.followed: dict[str, RoomState] = {}
        self._filter: dict[str, Any] = {
            "room": {"timeline": {"limit": self.m.timeline_limit}},
            "presence": {"types": []},
        }

    async def run(self) -> None:
        client, backoff, outage = self.client, Backoff(), Outage("matrix.sync")
        token: str | None = None
        loaded = False  # the saved token was read
        while not self.rt.stopping.is_set():
            try:
                if not loaded:
                    try:
                        self.durable.check()  # before the token can move: refuse a lossy Redis
                    except NotDurable as exc:
                        raise FatalGatewayError(str(exc)) from None
                    token, loaded = optional_text(self.r.get(MatrixKeys(self.keys).cursor)), True
                if token is None:
                    token = await self._first_sync()
                    continue
                if not client.rooms:
                    # a fresh process knows no room yet: load their state, not their timelines
                    state = await client.sync(timeout=0, full_state=True, sync_filter=_NO_TL)
                    if not isinstance(state, SyncResponse):
                        raise ErrorValue(state)
                resp = await client.sync(
                    timeout=int(self.m.sync_timeout * 1000), since=token, sync_filter=self._filter
                )
                if not isinstance(resp, SyncResponse):
                    raise ErrorValue(resp)
                await self._crypto_housekeeping()
                await self._invites(resp)
                await self._publish_batch(resp, since=token)
                self.r.set(MatrixKeys(self.keys).cursor, resp.next_batch)  # after every XADD
            except TRANSIENT as exc:  # Redis away: the token was not saved, sync it again
                await self.rt.redis_away(outage, exc)
                continue
            except REFUSED:  # Redis refused the account (NOPERM): the runner stops, exit 2
                raise
            except ErrorValue as failed:  # an error response, returned as a value
                check_fatal(failed.resp)
                await self.rt.retry_after(backoff, "matrix.sync_error", error=str(failed))
                continue
            except (
                OSError,
                TimeoutError,
                aiohttp.ClientError,
                redis.RedisError,
                NotDurable,
            ) as exc:
                if refusal(exc):  # a script of ours refused by the ACL: as REFUSED
                    raise
                await self.rt.retry_after(backoff, "matrix.sync_failed", error=repr(exc))
                continue
            backoff.reset()
            outage.recovered()
            token = resp.next_batch
            self.rt.heartbeat.info = {"published": self.published, "rooms": len(client.rooms)}

    async def _first_sync(self) -> str:
        """The very first start: join what is allowed, skip the backlog, save the token."""
        resp = await self.client.sync(timeout=0, full_state=True)
        if not isinstance(resp, SyncResponse):
            raise ErrorValue(resp)
        skipped = sum(len(room.timeline.events) for room in resp.rooms.join.values())
        await self._crypto_housekeeping()
        await self._invites(resp)
        self.r.set(MatrixKeys(self.keys).cursor, resp.next_batch)
        log.info("matrix.backlog_skipped", events=skipped, detail="first start: no saved token")
        return str(resp.next_batch)

    async def _publish_batch(self, resp: SyncResponse, since: str) -> None:
        for room_id, info in resp.rooms.join.items():
            events = list(info.timeline.events)
            if info.timeline.limited and info.timeline.prev_batch:
                events = [*await self._gap(room_id, info.timeline.prev_batch, since), *events]
            sources = [
                s if isinstance(s := getattr(e, "source", None), dict) else {} for e in events
            ]
            first = next((s["event_id"] for s in sources if isinstance(s.get("event_id"), str)), "")
            room = self.followed.get(room_id)
            if room is None or info.timeline.limited:
                if not first:
                    continue  # nothing to read in this room yet
                room = self.followed[room_id] = await self._state_at(room_id, first)
            else:
                for change in info.state:  # what changed outside the timeline
                    room.apply(_source(change))
            key = MatrixKeys(self.keys).members(room_id)
            known = optional_text(self.r.get(key))
            ever = frozenset(json.loads(known) if known else ())
            names = self._names(room_id)
            for event, source in zip(events, sources, strict=True):
                ever = ever | room.members  # everyone who was a member by then
                facts = room_facts(
                    room_id, frozenset(room.members), own_user_id=self.client.user_id,
                    ever=ever, display_names=names, openness=room.openness(),
                )  # fmt: skip
                room.apply(source)  # the room as the next event finds it
                if not source:
                    continue
                if type(event).__name__ == "MegolmEvent":
                    log.warning(
                        "matrix.undecryptable",
                        room_id=room_id,
                        event_id=source.get("event_id"),
                        sender=source.get("sender"),
                    )
                    continue
                out = normalize_event(source, facts, self.policy, redacted=self._sent_reply)
                self._publish_one(out, room_id)
            self.r.set(key, json.dumps(sorted(ever | room.members)))

    async def _state_at(self, room_id: str, event_id: str) -> RoomState:
        """The room's members and openness when ``event_id`` was sent, as the homeserver has
        them (``/context``: the raw state events, not what the client library parsed of them,
        which keeps an old join rule when a new one is one it does not know, and takes a
        setting from a state event whose state key is not empty). Not the room's state now: a
        batch read late (after a restart, from a gap) is from before later changes. An error is
        retried with the batch (the token does not move)."""
        # limit=0: the state at the event itself ("at the last event returned"); nio's
        # room_context leaves a 0 out (the server's default, 10, then names a later event)
        path = Api._build_path(
            ["rooms", room_id, "context", event_id],
            {"access_token": self.client.access_token, "limit": 0},
        )
        resp = await self.client._send(RoomContextResponse, "GET", path, response_data=(room_id,))
        if not isinstance(resp, RoomContextResponse):
            raise ErrorValue(resp)
        return RoomState.of([_source(e) for e in resp.state])

    def _names(self, room_id: str) -> dict[str, str]:
        room = self.client.rooms.get(room_id)
        return {uid: u.display_name or "" for uid, u in room.users.items()} if room else {}

    async def _gap(self, room_id: str, start: str, since: str) -> list[Any]:
        """The events a limited timeline left out (more arrived than one sync returns), read
        back with /messages from the timeline's start to the saved token; oldest first."""
        cursor = start
        found: list[Any] = []
        while len(found) < GAP_MAX:
            resp = await self.client.room_messages(room_id, start=cursor, end=since, limit=100)
            if not isinstance(resp, RoomMessagesResponse):
                raise ErrorValue(resp)
            found.extend(resp.chunk)
            if not resp.chunk or not resp.end or resp.end == cursor:
                break
            cursor = resp.end
        log.info("matrix.gap_filled", room_id=room_id, events=len(found))
        return list(reversed(found))

    def _sent_reply(self, event_id: str) -> tuple[str, str] | None:
        """The reply id of an event the bot sent, and the entry it answers (None: not one of
        its own, or sent too long ago)."""
        raw = optional_text(self.r.get(MatrixKeys(self.keys).sent(event_id)))
        try:
            sent = json.loads(raw) if raw else None
        except ValueError:
            return None
        if not isinstance(sent, dict):
            return None
        reply_id, answers = sent.get("reply_id"), sent.get("answers")
        if not isinstance(reply_id, str) or not isinstance(answers, str):
            return None
        return reply_id, answers

    def _publish_one(self, out: Any, room_id: str) -> None:
        if isinstance(out, Rejected):  # state events, own events: debug; a policy's no: info
            say = {DEBUG: log.debug, WARNING: log.warning}.get(out.level, log.info)
            say("matrix.ignored", room_id=room_id, event_id=out.event_id, reason=out.reason)
            return
        seen = MatrixKeys(self.keys).seen
        if self.r.zscore(seen, out.event_id) is not None:
            # its publish may have failed waiting for the fsync: a durable write after it makes
            # it durable too (the AOF is fsynced in order), before the token passes it
            self.durable.transaction([("ZADD", seen, "XX", time.time(), out.event_id)])
            log.info("matrix.already_published", event_id=out.event_id)
            return
        now = time.time()
        fields = [x for kv in out.to_fields().items() for x in kv]
        commands: list[tuple[Any, ...]] = [
            ("XADD", self.keys.inbound_of(CHANNEL), "*", *fields),
            ("ZADD", seen, now, out.event_id),
            ("ZREMRANGEBYSCORE", seen, "-inf", now - SEEN_KEEP),
        ]
        thread = out.extra.get("thread_root")
        if isinstance(thread, str):
            commands.append(
                ("SET", MatrixKeys(self.keys).thread(out.event_id), thread, "EX", THREAD_KEEP)
            )
        sid = self.durable.transaction(commands)[0]  # durable before the token moves past it
        self.published += 1
        log.info(
            "matrix.published",
            stream_id=stream_id(CHANNEL, sid),
            session=out.session,
            event_id=out.event_id,
            privacy=out.privacy.value,
            **({"no_reply": out.extra["no_reply"]} if "no_reply" in out.extra else {}),
        )

    async def _invites(self, resp: SyncResponse) -> None:
        client = self.client
        for room_id, info in resp.rooms.invite.items():
            inviter = next(
                (
                    e.sender
                    for e in info.invite_state
                    if isinstance(e, InviteMemberEvent) and e.state_key == client.user_id
                ),
                None,
            )
            if inviter and self.policy.may_invite(inviter):
                joined = await client.join(room_id)
                log.info("matrix.invite_accepted", room_id=room_id, inviter=inviter,
                         ok=not isinstance(joined, ErrorResponse))  # fmt: skip
            else:
                await client.room_leave(room_id)
                log.info("matrix.invite_refused", room_id=room_id, inviter=inviter)  # policy

    async def _crypto_housekeeping(self) -> None:
        if not self.client.olm:
            return
        try:
            await crypto_housekeeping(self.client)
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            log.warning("matrix.crypto_failed", error=repr(exc))


async def crypto_housekeeping(client: AsyncClient) -> None:
    """What an end-to-end encrypting client does after each sync: send the to-device messages it
    owes, upload, query and claim keys as nio says it should."""
    await client.send_to_device_messages()
    if client.should_upload_keys:
        await client.keys_upload()
    if client.should_query_keys:
        await client.keys_query()
    if client.should_claim_keys:
        await client.keys_claim(client.get_users_for_key_claiming())


def _source(event: Any) -> dict[str, Any]:
    """The event's JSON as the homeserver sent it ({} when nio kept none)."""
    source = getattr(event, "source", None)
    return source if isinstance(source, dict) else {}


def optional_text(value: Any) -> str | None:
    """A Redis reply as str, None for a missing key."""
    return None if value is None else text(value)
