"""The e-mail gateway's inbound loop: IMAP (aioimaplib) into the stream.

IDLE, re-issued every ``idle_renew`` seconds (servers drop an IDLE after about 30 minutes), or
polling every ``poll_interval`` seconds when the server has no IDLE. Each new message is fetched
with ``BODY.PEEK[]`` (fetching does not mark it read), normalized by ``email_parse`` and XADDed
durably (:mod:`contract.durable`: fsynced, so a power cut of the Redis host cannot lose it behind
the cursor); only then is it flagged ``\\Seen`` and the cursor (UIDVALIDITY, last UID) advanced.
Mail that is not answered (loop guard, allowlist, rate cap) is logged and left unread; mail that
cannot be parsed at all goes to the dead-letter stream. Mail that answers one of relaybot's
replies, from one of that reply's recipients, less than ``[email] reply_window`` seconds after it
was sent, is recorded, not answered: an auto-responder that sets no header the loop guard knows
still gets one reply per storm. The list addresses a mail's ``List-Post``/``List-Id`` name are
learned (ignored list mail included), and an audience holding one is a group. Mail from one of
the owner's addresses that is not authenticated is logged (``email.owner_unauthenticated``, once
an hour per reason, with the authserv-ids seen and the fix) and kept for ``relaybot doctor``.
Network errors reconnect with the runner's capped backoff; a refused login is fatal. Redis going
away (a restart) is waited out the same way (``redis.unreachable``, then ``redis.reconnected``): a
message whose XADD failed has not moved the cursor, so it is fetched and published again (its
Message-ID in ``email:seen``, written in the XADD's MULTI, keeps a publish whose reply was lost
from happening twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import aioimaplib
import redis
import structlog

from contract.access import REFUSED, refusal
from contract.durable import NotDurable
from contract.outage import TRANSIENT, Outage
from gateways.email.audience import handle_address
from gateways.email.auth import owner_refusal_hint
from gateways.email.config import EmailConfig
from gateways.email.loop import SENT_ID_PREFIX
from gateways.email.parse import (
    UNVERIFIED,
    Accepted,
    Addresses,
    parse_email,
    quoted_mail,
    show_quote,
    with_lists,
)
from gateways.email.smtp import FatalMailError, check_plain, port_of, tls_context
from gateways.email.state import MailState
from gateways.runner import Backoff, Runtime

log = structlog.get_logger(__name__)

_UID = re.compile(rb"UID (\d+)")
_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)")
_NETWORK_ERRORS = (OSError, asyncio.TimeoutError, aioimaplib.AioImapException, ConnectionError)
REFUSAL_LOG_EVERY = 3600.0  # seconds between two log lines of the owner's mail refused, per reason


class ImapLost(ConnectionError):
    pass


class ImapReader:
    def __init__(self, ecfg: EmailConfig, addrs: Addresses, state: MailState, rt: Runtime) -> None:
        self.ecfg, self.addrs, self.state, self.rt = ecfg, addrs, state, rt
        self.host = ecfg.imap_host or ""
        check_plain(ecfg.imap_tls, self.host, "imap")
        self.port = port_of(ecfg, "imap")
        self._lost = asyncio.Event()
        self._redis = Outage("email.imap")
        self._refusals_logged: dict[str, float] = {}  # reason -> when last logged (monotonic)

    async def run(self) -> None:
        backoff = Backoff()
        while not self.rt.stopping.is_set():
            try:
                await self._session()
                backoff.reset()
            except FatalMailError:
                raise
            except REFUSED:  # Redis refused the account: the process stops (exit 2)
                raise
            except TRANSIENT as exc:  # Redis away: nothing unpublished was passed by the cursor
                self.rt.heartbeat.info = {"state": "redis unreachable"}
                await self.rt.redis_away(self._redis, exc)
            except Exception as exc:  # network, Redis, or a bug: back off, never a dead loop
                if refusal(exc):  # a script of ours refused by the ACL: as REFUSED
                    raise
                self.rt.heartbeat.info = {"state": "reconnecting", "error": repr(exc)[:200]}
                await self.rt.retry_after(backoff, "email.imap_error", error=repr(exc))

    async def _connect(self) -> aioimaplib.IMAP4:
        self._lost.clear()
        mode = self.ecfg.imap_tls
        ctx = tls_context(self.ecfg.ca_file) if mode == "tls" else None
        client = aioimaplib.IMAP4(
            self.host,
            self.port,
            timeout=30,
            conn_lost_cb=lambda _exc: self._lost.set(),
            ssl_context=ctx,
        )
        await client.wait_hello_from_server()
        if mode == "starttls":
            await self._starttls(client)
        password = self.ecfg.imap_password.get_secret_value() if self.ecfg.imap_password else ""
        resp = await client.login(self.ecfg.imap_user or "", password)
        if resp.result != "OK":
            raise FatalMailError(f"IMAP login refused for {self.ecfg.imap_user!r}: {resp.lines}")
        return client

    async def _starttls(self, client: aioimaplib.IMAP4) -> None:
        proto = client.protocol
        resp = await asyncio.wait_for(
            proto.execute(aioimaplib.Command("STARTTLS", proto.new_tag())), 30
        )
        if resp.result != "OK":
            raise FatalMailError(f"IMAP server refused STARTTLS: {resp.lines}")
        loop = asyncio.get_running_loop()
        proto.transport = await loop.start_tls(
            proto.transport,
            proto,
            tls_context(self.ecfg.ca_file),
            server_hostname=self.host,
        )
        await asyncio.wait_for(proto.capability(), 30)

    async def _session(self) -> None:
        client = await self._connect()
        try:
            resp = await client.select(self.ecfg.folder)
            if resp.result != "OK":
                raise FatalMailError(f"cannot select folder {self.ecfg.folder!r}: {resp.lines}")
            uidvalidity = _uidvalidity(resp.lines)
            try:
                self.state.durable.check()  # before the cursor can move: refuse a lossy Redis
            except NotDurable as exc:
                raise FatalMailError(str(exc)) from None
            idle = self.ecfg.idle and client.has_capability("IDLE")
            await self._start_cursor(client, uidvalidity)
            self._redis.recovered()
            self.rt.heartbeat.info = {"state": "idle" if idle else "polling"}
            log.info("email.ready", folder=self.ecfg.folder, idle=idle, uidvalidity=uidvalidity)
            while not self.rt.stopping.is_set():
                await self._process_new(client, uidvalidity)
                if idle:
                    await self._idle(client)
                else:
                    await self.rt.sleep(self.ecfg.poll_interval)
                    await client.noop()
                if self._lost.is_set():
                    raise ImapLost("the IMAP connection was closed")
        finally:
            structlog.contextvars.clear_contextvars()
            if not self._lost.is_set():
                with contextlib.suppress(*_NETWORK_ERRORS):
                    await asyncio.wait_for(client.logout(), 5)

    async def _start_cursor(self, client: aioimaplib.IMAP4, uidvalidity: int) -> None:
        cursor = self.state.cursor()
        if cursor is not None and cursor.uidvalidity == uidvalidity:
            return
        if cursor is None:
            # a first start answers only what arrives from now on, not the whole mailbox
            uids = await self._uids(client, 1)
            last = max(uids, default=0)
            log.info("email.first_start", existing=len(uids), left_alone_up_to_uid=last)
        else:
            # UIDs were renumbered: look at everything again; Message-IDs already published
            # are skipped (email:seen), so nothing is answered twice and nothing is lost
            log.warning("email.uidvalidity_changed", old=cursor.uidvalidity, new=uidvalidity)
            last = 0
        self.state.advance(uidvalidity, last)

    async def _uids(self, client: aioimaplib.IMAP4, start: int) -> list[int]:
        resp = await client.uid("fetch", f"{start}:*", "(UID)")
        if resp.result != "OK":
            raise ImapLost(f"UID FETCH failed: {resp.lines}")
        uids = {int(m.group(1)) for line in resp.lines if (m := _UID.search(bytes(line)))}
        return sorted(u for u in uids if u >= start)

    async def _process_new(self, client: aioimaplib.IMAP4, uidvalidity: int) -> None:
        cursor = self.state.cursor()
        last = cursor.last_uid if cursor else 0
        for uid in await self._uids(client, last + 1):
            if self.rt.stopping.is_set():
                return
            resp = await client.uid("fetch", str(uid), "(UID BODY.PEEK[])")
            if resp.result != "OK":
                raise ImapLost(f"UID FETCH {uid} failed: {resp.lines}")
            raw = _body(resp.lines)
            if raw is None:
                log.warning("email.vanished", uid=uid)  # expunged meanwhile
            elif self._handle(uid, raw):
                await client.uid("store", str(uid), "+FLAGS.SILENT (\\Seen)")
            self.state.advance(uidvalidity, uid)
            structlog.contextvars.clear_contextvars()

    def _handle(self, uid: int, raw: bytes) -> bool:
        """Publish one message if it is to be answered; True when it was (or had been)."""
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(channel="email", uid=uid)
        source = f"imap:{self.ecfg.folder}:{uid}"
        try:
            result = parse_email(raw, self.addrs, time.time())
            if result.lists_seen:
                self.state.learn_lists(result.lists_seen)
            if not isinstance(result, Accepted):
                if result.dead:
                    self.state.dead(raw, result.reason, source)
                    log.error("email.dead_letter", reason=result.reason)
                else:
                    log.info(
                        "email.ignored",
                        reason=result.reason,
                        sender=result.sender,
                        message_id=result.message_id,
                    )
                return False
            result = self._audience(result)
            if result.message.extra.get("quoted") and not self._received(quoted_mail(result)):
                result = show_quote(result)  # the quoted mail never reached relaybot
            msg = result.message
            structlog.contextvars.bind_contextvars(message_id=msg.event_id)
            if self.state.already_published(msg.event_id):
                self.state.confirm(msg.event_id)  # durable before the cursor passes it
                log.info("email.duplicate", session=msg.session)
                return True
            result = self._reply_window(result)
            msg = result.message
            capped = self.state.over_rate(
                msg.session,
                msg.sender,
                window=self.ecfg.rate_window,
                per_thread=self.ecfg.rate_per_thread,
                per_sender=self.ecfg.rate_per_sender,
                event_id=msg.event_id,
            )
            if capped:
                log.warning("email.rate_capped", reason=capped, sender=msg.sender)
                return False
            sid = self.state.publish(result)
            log.info("email.published", stream_id=sid, session=msg.session, privacy=msg.privacy)
            if msg.extra.get("no_reply"):  # recorded in memory, not answered: left unread
                log.info("email.recorded_only", reason=msg.extra["no_reply"], sender=msg.sender)
                return False
            return True
        except (redis.RedisError, NotDurable):
            raise  # the cursor stays: this mail is read again after the backoff
        except Exception as exc:  # a bug on one message must not stop the mailbox
            log.exception("email.handle_failed")
            self.state.dead(raw, f"gateway error: {type(exc).__name__}: {exc}", source)
            return False

    def _audience(self, accepted: Accepted) -> Accepted:
        """The mail with what Redis knows: list addresses learned from earlier mail make its
        audience a group; the owner's mail refused as unauthenticated is noted for doctor."""
        msg = accepted.message
        audience = [handle_address(a) for a in msg.extra.get("audience", [])]
        learned = self.state.known_lists(audience)
        if learned:
            accepted = with_lists(accepted, learned)
        if accepted.owner_refused:
            self._owner_refused(accepted)
        elif msg.extra.get("authenticated") and msg.sender in self.addrs.owner:
            self.state.clear_owner_refused()
        return accepted

    def _owner_refused(self, accepted: Accepted) -> None:
        verdict, msg = accepted.verdict, accepted.message
        sender = handle_address(msg.sender)
        hint = owner_refusal_hint(verdict, sorted(self.addrs.trusted_ids))
        self.state.note_owner_refused(
            {
                "at": time.time(),
                "sender": sender,
                "message_id": msg.event_id[:300],
                "reason": verdict.reason,
                "detail": verdict.detail[:500],
                "seen": list(verdict.seen),
                "trusted": sorted(self.addrs.trusted_ids),
                "hint": hint,
            }
        )
        now = time.monotonic()
        last = self._refusals_logged.get(verdict.reason)
        if last is not None and now - last < REFUSAL_LOG_EVERY:
            return
        self._refusals_logged[verdict.reason] = now
        log.warning(
            "email.owner_unauthenticated",
            sender=sender,
            authserv_ids=list(verdict.seen),
            reason=verdict.reason,
            detail=verdict.detail,
            hint=hint,
        )

    def _received(self, message_id: str) -> bool:
        """Whether relaybot has this mail: one it sent, or one it published."""
        if not message_id:
            return False
        if message_id.strip("<>").startswith(SENT_ID_PREFIX):
            return True
        return self.state.already_published(message_id)

    def _reply_window(self, accepted: Accepted) -> Accepted:
        """The mail as to be recorded only, when it answers a reply relaybot sent its sender
        less than ``reply_window`` seconds ago (the authenticated owner aside: the owner's chat)."""
        msg = accepted.message
        if msg.extra.get("no_reply") or self.ecfg.reply_window <= 0:
            return accepted
        sender = msg.sender.removesuffix(f" {UNVERIFIED}")
        if msg.extra.get("authenticated") and sender in self.addrs.owner:
            return accepted
        threads = [str(msg.extra.get("thread", "")), *accepted.headers.references]
        if not self.state.recently_answered({sender, accepted.headers.sender}, threads):
            return accepted
        reason = (
            f"it answers relaybot's reply of less than {self.ecfg.reply_window:.0f} s ago "
            "(an auto-responder storm gets one reply)"
        )
        log.warning("email.reply_window", sender=sender, thread=msg.extra.get("thread"))
        extra = {**msg.extra, "no_reply": reason}
        return Accepted(msg.model_copy(update={"extra": extra}), accepted.headers)

    async def _idle(self, client: aioimaplib.IMAP4) -> None:
        idle = await client.idle_start(timeout=self.ecfg.idle_renew)
        try:
            while not self.rt.stopping.is_set() and not self._lost.is_set():
                try:
                    push = await client.wait_server_push(timeout=1.0)
                except TimeoutError:
                    continue
                if push == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    log.info("email.idle_renewed")  # ended by us, before the server drops it
                else:
                    log.debug("email.push", lines=push)
                if any(b"BYE" in bytes(line) for line in push if isinstance(line, bytes)):
                    self._lost.set()
                break
        finally:
            if client.has_pending_idle() and not self._lost.is_set():
                client.idle_done()
                with contextlib.suppress(*_NETWORK_ERRORS):
                    await asyncio.wait_for(idle, 10)
            else:
                idle.cancel()


def _uidvalidity(lines: list[bytes]) -> int:
    for line in lines:
        m = _UIDVALIDITY.search(bytes(line))
        if m:
            return int(m.group(1))
    raise ImapLost("the server did not report UIDVALIDITY")


def _body(lines: list[bytes]) -> bytes | None:
    for i, line in enumerate(lines):
        if isinstance(line, bytearray) and i > 0:
            return bytes(line)
    return None
