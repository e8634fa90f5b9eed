"""The Matrix gateway: ``relaybot gateway matrix``.

One process, one nio ``AsyncClient`` with a persistent store (device id and crypto keys under
``$RELAYBOT_HOME/matrix``), two loops:

- the sync loop: ``/sync`` from the token saved in Redis (``<prefix>cursor:matrix``), each room
  event normalized by :mod:`gateways.matrix_events` and XADDed together with its event id in a
  "seen" set (one MULTI), and the token saved only after the whole batch was published. A gateway
  killed between the XADD and the token finds the events in the seen set and skips them. The very
  first start (no token) skips the backlog and says so.
- the delivery loop: each joined room's reply queue (``reply:matrix:<room>``) delivered through
  :func:`gateways.deliver.deliver_next` as a Matrix reply, with the reply id as transaction id
  (the homeserver drops a resend after a crash: an idempotent sink), and a typing notice kept
  alive while the worker marks the session busy.

A lost session (``M_UNKNOWN_TOKEN``) stops the gateway with a clear error; anything else backs
off (capped) and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from typing import Any

import aiohttp
import redis
import structlog
from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    InviteMemberEvent,
    LoginResponse,
    MatrixRoom,
    RoomMessagesResponse,
    SyncResponse,
    WhoamiResponse,
)

from contract.config import Config, OwnerAlias
from contract.liveness import Heartbeat
from contract.messages import Reply
from gateways.deliver import ReplyQueue, deliver_next
from gateways.matrix_events import (
    GroupPolicy,
    Policy,
    Rejected,
    RoomFacts,
    normalize_event,
    room_of,
    session_of,
)
from gateways.matrix_render import reply_content

log = structlog.get_logger(__name__)

EXIT_FATAL = 2
SEEN_KEEP = 30 * 24 * 3600.0  # how long processed event ids are remembered
THREAD_KEEP = 7 * 24 * 3600
BACKOFF_START, BACKOFF_CAP = 1.0, 60.0
GAP_MAX = 5000  # events read back after a long outage, per room and sync
TYPING_MS = 30_000
TYPING_REFRESH = 20.0
_FATAL_CODES = ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN_TOKEN")


class _SyncFailed(Exception):
    def __init__(self, resp: Any) -> None:
        super().__init__(_describe(resp))
        self.resp = resp


class FatalMatrixError(RuntimeError):
    """The session is gone or the login was refused: a person has to act."""


def build_policy(cfg: Config, own_user_id: str) -> Policy:
    m = cfg.matrix
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
    localpart = own_user_id.split(":", 1)[0].lstrip("@")
    return Policy(
        own_user_id=own_user_id,
        owners=frozenset(owners),
        dm_allowlist=frozenset(m.allowlist),
        group_policy=GroupPolicy(m.group_policy),
        group_allowlist=frozenset(m.group_allowlist),
        rooms=rooms,
        own_names=tuple({localpart, cfg.worker.assistant_name, m.device_name}),
    )


class Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_START

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_CAP)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_START


class MatrixGateway:
    def __init__(self, cfg: Config, r: redis.Redis) -> None:
        if not cfg.matrix.configured:
            raise FatalMatrixError("[matrix] homeserver and user_id are not configured")
        self.cfg, self.m, self.r, self.keys = cfg, cfg.matrix, r, cfg.keys
        self.store = cfg.matrix.store_path or cfg.home / "matrix"
        self.cursor_key = self.keys.matrix_cursor
        self.seen_key = self.keys.matrix_seen
        self.client: AsyncClient | None = None
        self.policy: Policy | None = None
        self.stopping = asyncio.Event()
        self.typing: dict[str, float] = {}  # room id -> when the typing notice was (re)sent
        self.heartbeat = Heartbeat(r, self.keys, "gateway:matrix")
        self.published = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._filter: dict[str, Any] = {
            "room": {"timeline": {"limit": cfg.matrix.timeline_limit}},
            "presence": {"types": []},
        }

    # -- login -----------------------------------------------------------------------------------

    async def login(self) -> AsyncClient:
        m = self.m
        if not (m.homeserver and m.user_id):
            raise FatalMatrixError("[matrix] homeserver and user_id are not configured")
        self.store.mkdir(parents=True, exist_ok=True, mode=0o700)
        session_file = self.store / "session.json"
        saved: dict[str, str] = {}
        if session_file.exists():
            saved = json.loads(session_file.read_text(encoding="utf-8"))
            if saved.get("user_id") != m.user_id:
                saved = {}
        config = AsyncClientConfig(
            max_timeouts=1, max_limit_exceeded=3, store_sync_tokens=False, encryption_enabled=True
        )
        client = AsyncClient(
            m.homeserver,
            m.user_id,
            device_id=m.device_id,
            store_path=str(self.store),
            config=config,
        )
        token = m.access_token.get_secret_value() if m.access_token else saved.get("access_token")
        device_id = m.device_id or saved.get("device_id")
        try:
            token, device_id = await self._credentials(client, saved)
        except BaseException:
            await client.close()
            raise
        client.restore_login(m.user_id, device_id, token)
        saved = {"user_id": m.user_id, "device_id": device_id}
        if not m.access_token:  # a token we obtained ourselves: keep it (mode 600)
            saved["access_token"] = token
        tmp = session_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(saved))
        tmp.replace(session_file)
        log.info("matrix.logged_in", user_id=m.user_id, device_id=device_id)
        self.policy = build_policy(self.cfg, m.user_id)
        self.client = client
        return client

    async def _credentials(self, client: AsyncClient, saved: dict[str, str]) -> tuple[str, str]:
        """(access token, device id): configured, saved from an earlier login, or a new login."""
        m = self.m
        token = m.access_token.get_secret_value() if m.access_token else saved.get("access_token")
        device_id = m.device_id or saved.get("device_id")
        if token and not device_id:
            client.access_token = token
            who = await client.whoami()
            if not isinstance(who, WhoamiResponse) or not who.device_id:
                self._check_fatal(who)
                raise _SyncFailed(who)
            device_id = who.device_id
        if token and device_id:
            return token, device_id
        if not m.password:
            raise FatalMatrixError("[matrix] needs access_token or password")
        resp = await client.login(m.password.get_secret_value(), device_name=m.device_name)
        if not isinstance(resp, LoginResponse):
            if isinstance(resp, ErrorResponse) and resp.status_code in (
                "M_FORBIDDEN",
                "M_USER_DEACTIVATED",
            ):
                raise FatalMatrixError(f"password login refused: {_describe(resp)}")
            raise _SyncFailed(resp)
        return str(resp.access_token), str(resp.device_id)

    # -- sync --------------------------------------------------------------------------------

    async def sync_loop(self) -> None:
        client = self._client()
        backoff = Backoff()
        token = _s(self.r.get(self.cursor_key))
        while not self.stopping.is_set():
            try:
                if token is None:
                    token = await self._first_sync()
                    continue
                if not client.rooms:
                    # a fresh process knows no room yet: load their state, not their timelines
                    state = await client.sync(timeout=0, full_state=True, sync_filter=_NO_TL)
                    if not isinstance(state, SyncResponse):
                        raise _SyncFailed(state)
                resp = await client.sync(
                    timeout=int(self.m.sync_timeout * 1000), since=token, sync_filter=self._filter
                )
                if not isinstance(resp, SyncResponse):
                    raise _SyncFailed(resp)
                await self._crypto_housekeeping()
                await self._invites(resp)
                await self._publish_batch(resp, since=token)
                self.r.set(self.cursor_key, resp.next_batch)  # only after every event was XADDed
            except _SyncFailed as failed:  # an error response, returned as a value
                self._check_fatal(failed.resp)
                await self._sleep(backoff.next(), "matrix.sync_error", error=str(failed))
                continue
            except (OSError, TimeoutError, aiohttp.ClientError, redis.RedisError) as exc:
                await self._sleep(backoff.next(), "matrix.sync_failed", error=repr(exc))
                continue
            backoff.reset()
            token = resp.next_batch
            self.heartbeat.info = {"published": self.published, "rooms": len(client.rooms)}

    async def _first_sync(self) -> str:
        """The very first start: join what is allowed, skip the backlog, save the token."""
        resp = await self._client().sync(timeout=0, full_state=True)
        if not isinstance(resp, SyncResponse):
            raise _SyncFailed(resp)
        skipped = sum(len(room.timeline.events) for room in resp.rooms.join.values())
        await self._crypto_housekeeping()
        await self._invites(resp)
        self.r.set(self.cursor_key, resp.next_batch)
        log.info("matrix.backlog_skipped", events=skipped, detail="first start: no saved token")
        return str(resp.next_batch)

    async def _publish_batch(self, resp: SyncResponse, since: str) -> None:
        client, policy = self._client(), self._policy()
        for room_id, info in resp.rooms.join.items():
            room = client.rooms.get(room_id)
            facts = _facts(room_id, room)
            events = list(info.timeline.events)
            if info.timeline.limited and info.timeline.prev_batch:
                events = [*await self._gap(room_id, info.timeline.prev_batch, since), *events]
            for event in events:
                source = getattr(event, "source", None)
                if not isinstance(source, dict):
                    continue
                if type(event).__name__ == "MegolmEvent":
                    log.warning(
                        "matrix.undecryptable",
                        room_id=room_id,
                        event_id=source.get("event_id"),
                        sender=source.get("sender"),
                    )
                    continue
                self._publish_one(normalize_event(source, facts, policy), room_id)

    async def _gap(self, room_id: str, start: str, since: str) -> list[Any]:
        """The events a limited timeline left out (more arrived than one sync returns), read
        back with /messages from the timeline's start to the saved token; oldest first."""
        client, cursor = self._client(), start
        found: list[Any] = []
        while len(found) < GAP_MAX:
            resp = await client.room_messages(room_id, start=cursor, end=since, limit=100)
            if not isinstance(resp, RoomMessagesResponse):
                raise _SyncFailed(resp)
            found.extend(resp.chunk)
            if not resp.chunk or not resp.end or resp.end == cursor:
                break
            cursor = resp.end
        log.info("matrix.gap_filled", room_id=room_id, events=len(found))
        return list(reversed(found))

    def _publish_one(self, out: Any, room_id: str) -> None:
        if isinstance(out, Rejected):
            level = log.info if out.reason == "own event" else log.warning
            level("matrix.ignored", room_id=room_id, event_id=out.event_id, reason=out.reason)
            return
        if self.r.zscore(self.seen_key, out.event_id) is not None:
            log.info("matrix.already_published", event_id=out.event_id)
            return
        now = time.time()
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.keys.inbound, out.to_fields())
        pipe.zadd(self.seen_key, {out.event_id: now})
        pipe.zremrangebyscore(self.seen_key, "-inf", now - SEEN_KEEP)
        thread = out.extra.get("thread_root")
        if isinstance(thread, str):
            pipe.set(self.keys.matrix_thread(out.event_id), thread, ex=THREAD_KEEP)
        sid = pipe.execute()[0]
        self.published += 1
        log.info(
            "matrix.published",
            stream_id=_s(sid),
            session=out.session,
            event_id=out.event_id,
            privacy=out.privacy.value,
        )

    async def _invites(self, resp: SyncResponse) -> None:
        client, policy = self._client(), self._policy()
        for room_id, info in resp.rooms.invite.items():
            inviter = next(
                (
                    e.sender
                    for e in info.invite_state
                    if isinstance(e, InviteMemberEvent) and e.state_key == client.user_id
                ),
                None,
            )
            if inviter and policy.may_invite(inviter):
                joined = await client.join(room_id)
                log.info("matrix.invite_accepted", room_id=room_id, inviter=inviter,
                         ok=not isinstance(joined, ErrorResponse))  # fmt: skip
            else:
                await client.room_leave(room_id)
                log.warning("matrix.invite_refused", room_id=room_id, inviter=inviter)

    async def _crypto_housekeeping(self) -> None:
        client = self._client()
        if not client.olm:
            return
        try:
            await client.send_to_device_messages()
            if client.should_upload_keys:
                await client.keys_upload()
            if client.should_query_keys:
                await client.keys_query()
            if client.should_claim_keys:
                await client.keys_claim(client.get_users_for_key_claiming())
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            log.warning("matrix.crypto_failed", error=repr(exc))

    # -- delivery ----------------------------------------------------------------------------

    async def delivery_loop(self) -> None:
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                rooms = list(self._client().rooms)  # read on the loop that changes it
                busy = await asyncio.to_thread(self._deliver_pending, rooms)
                await self._update_typing(busy)
                backoff.reset()
            except (
                redis.RedisError,
                OSError,
                TimeoutError,
                RuntimeError,
                aiohttp.ClientError,
            ) as exc:
                await self._sleep(backoff.next(), "matrix.delivery_failed", error=repr(exc))
                continue
            await self._sleep(0.1)

    def _deliver_pending(self, rooms: list[str]) -> set[str]:
        """Deliver what is queued for these rooms; returns the rooms marked busy."""
        busy: set[str] = set()
        for room_id in rooms:
            session = session_of(room_id)
            queue = ReplyQueue(
                self.r,
                self.keys,
                session,
                max_age=self.cfg.delivery.max_age,
                gateway="gateway:matrix",
            )
            while self.r.exists(queue.queue, queue.inflight):
                deliver_next(queue, self._send_blocking, timeout=0, idempotent_sink=True)
            if self.m.typing and self.r.exists(self.keys.busy(session)):
                busy.add(room_id)
        return busy

    def _send_blocking(self, reply: Reply) -> None:
        if self._loop is None:
            raise RuntimeError("the gateway is not running")
        future = asyncio.run_coroutine_threadsafe(self._send(reply), self._loop)
        future.result(timeout=120)

    async def _send(self, reply: Reply) -> None:
        client = self._client()
        room_id = room_of(reply.session)
        thread = (
            _s(self.r.get(self.keys.matrix_thread(reply.in_reply_to)))
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
            self._check_fatal(resp)
            raise RuntimeError(f"room_send failed: {_describe(resp)}")
        log.info("matrix.sent", room_id=room_id, reply_id=reply.reply_id, event_id=resp.event_id)

    async def _update_typing(self, busy: set[str]) -> None:
        client, now = self._client(), time.monotonic()
        for room_id in busy:
            if now - self.typing.get(room_id, 0.0) > TYPING_REFRESH:
                self.typing[room_id] = now
                await client.room_typing(room_id, typing_state=True, timeout=TYPING_MS)
        for room_id in [r for r in self.typing if r not in busy]:
            self.typing.pop(room_id)
            await client.room_typing(room_id, typing_state=False)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        backoff = Backoff()
        while True:
            try:
                client = await self.login()
                break
            except FatalMatrixError as exc:
                log.error("matrix.fatal", error=str(exc))
                return EXIT_FATAL
            except (_SyncFailed, OSError, TimeoutError, aiohttp.ClientError) as exc:
                await self._sleep(backoff.next(), "matrix.login_failed", error=str(exc))
                if self.stopping.is_set():
                    return 0
        self.heartbeat.start()
        tasks = [
            asyncio.create_task(self.sync_loop(), name="matrix-sync"),
            asyncio.create_task(self.delivery_loop(), name="matrix-delivery"),
            asyncio.create_task(self.stopping.wait(), name="matrix-stop"),
        ]
        code = 0
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if isinstance(error, FatalMatrixError):
                    log.error("matrix.fatal", error=str(error))
                    code = EXIT_FATAL
                elif error is not None:
                    log.error("matrix.crashed", error=repr(error), task=task.get_name())
                    code = 1
        finally:
            self.stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.heartbeat.stop()
            await client.close()
        log.info("matrix.stopped", code=code)
        return code

    # -- helpers -----------------------------------------------------------------------------

    def _check_fatal(self, resp: Any) -> None:
        if isinstance(resp, ErrorResponse) and resp.status_code in _FATAL_CODES:
            soft = bool(getattr(resp, "soft_logout", False))
            raise FatalMatrixError(
                f"the homeserver ended this session ({resp.status_code}"
                f"{', soft logout' if soft else ''}): log in again and update [matrix] "
                "access_token (or remove the session file to log in with the password)"
            )

    async def _sleep(self, seconds: float, event: str | None = None, **info: Any) -> None:
        if event:
            log.warning(event, retry_in=seconds, **info)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    def _client(self) -> AsyncClient:
        if self.client is None:
            raise RuntimeError("not logged in")
        return self.client

    def _policy(self) -> Policy:
        if self.policy is None:
            raise RuntimeError("not logged in")
        return self.policy


_NO_TL: dict[str, Any] = {"room": {"timeline": {"limit": 0}}, "presence": {"types": []}}


def _facts(room_id: str, room: MatrixRoom | None) -> RoomFacts:
    if room is None:
        return RoomFacts(room_id, member_count=0)
    names = {uid: u.display_name or "" for uid, u in room.users.items()}
    return RoomFacts(room_id, member_count=int(room.member_count), display_names=names)


def _describe(resp: Any) -> str:
    if isinstance(resp, ErrorResponse):
        return f"{resp.status_code}: {resp.message}"
    return repr(resp)[:200]


def _s(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def run_matrix(cfg: Config, r: redis.Redis) -> int:
    """The ``relaybot gateway matrix`` command."""
    if not cfg.matrix.configured:
        # honcho stops every process when one exits: without [matrix], stay up and do nothing
        log.warning(
            "matrix.not_configured",
            detail="set [matrix] homeserver and user_id (or RELAYBOT_MATRIX_*); idling",
        )
        idle_until_signalled()
        return 0
    return asyncio.run(MatrixGateway(cfg, r).run())


def idle_until_signalled() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
