"""The e-mail gateway: ``relaybot gateway email``.

IMAP in (aioimaplib): IDLE, re-issued every ``idle_renew`` seconds (servers drop an IDLE after
about 30 minutes), or polling every ``poll_interval`` seconds when the server has no IDLE.
Each new message is fetched with ``BODY.PEEK[]`` (fetching does not mark it read), normalized
by ``email_parse`` and XADDed; only then is it flagged ``\\Seen`` and the cursor (UIDVALIDITY,
last UID) advanced. Mail that is not answered (loop guard, allowlist, rate cap) is logged and
left unread; mail that cannot be parsed at all goes to the dead-letter stream. Network errors
reconnect with a capped backoff; a refused login stops the gateway with a clear message.

SMTP out (aiosmtplib, ``email_smtp``): replies from the ``email:*`` sessions' reply queues,
delivered once through ``gateways.deliver``. Without ``[email] imap_host`` the process idles.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time

import aioimaplib
import redis
import structlog

from contract.bus import text
from contract.config import Config, OwnerAlias
from contract.liveness import Heartbeat
from contract.messages import Reply
from gateways.deliver import ReplyQueue, deliver_next
from gateways.email_parse import CHANNEL, Accepted, Addresses, parse_email
from gateways.email_smtp import (
    FatalMailError,
    NotSent,
    SmtpSender,
    check_plain,
    port_of,
    tls_context,
)
from gateways.email_state import MailState

log = structlog.get_logger(__name__)

BACKOFF_START, BACKOFF_CAP = 1.0, 60.0
DELIVERY_TICK = 0.3
_UID = re.compile(rb"UID (\d+)")
_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)")
_NETWORK_ERRORS = (OSError, asyncio.TimeoutError, aioimaplib.AioImapException, ConnectionError)


def owner_addresses(cfg: Config) -> frozenset[str]:
    out = set()
    for alias in cfg.owner.aliases:
        if isinstance(alias, OwnerAlias):
            if alias.channel in (None, "email") and "@" in alias.address:
                out.add(alias.address.lower())
        elif "@" in alias and ":" not in alias and not alias.startswith("@"):
            out.add(alias.lower())
    return frozenset(out)


def addresses_of(cfg: Config) -> Addresses:
    allow = {a.lower() for a in cfg.email.allowlist}
    return Addresses(
        own=frozenset(a.lower() for a in cfg.email.addresses),
        owner=owner_addresses(cfg),
        allow=frozenset(allow - {"*"}),
        allow_all="*" in allow,
    )


class ImapLost(ConnectionError):
    pass


class EmailGateway:
    def __init__(self, cfg: Config, r: redis.Redis) -> None:
        self.cfg, self.ecfg, self.r = cfg, cfg.email, r
        self.keys = cfg.keys
        self.addrs = addresses_of(cfg)
        self.host = self.ecfg.imap_host or ""
        check_plain(self.ecfg.imap_tls, self.host, "imap")
        self.port = port_of(self.ecfg, "imap")
        self.state = MailState(r, self.keys, self.ecfg.folder)
        self.smtp = SmtpSender(self.ecfg)
        self.heartbeat = Heartbeat(r, self.keys, "gateway:email")
        self.stopping = asyncio.Event()
        self._lost = asyncio.Event()
        self._failed_sessions: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        self.heartbeat.info = {"state": "starting"}
        self.heartbeat.start()
        tasks = {
            asyncio.create_task(self._imap_forever(), name="imap"),
            asyncio.create_task(self._deliver_forever(), name="smtp"),
        }
        stop = asyncio.create_task(self.stopping.wait(), name="stop")
        try:
            done, _ = await asyncio.wait({*tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stop}:
                exc = task.exception()
                if isinstance(exc, FatalMailError):
                    log.error("email.fatal", error=str(exc))
                    return 2
                if exc is not None:
                    log.error("email.crashed", task=task.get_name(), error=repr(exc))
                    return 1
            return 0
        finally:
            for task in [*tasks, stop]:
                task.cancel()
            await asyncio.gather(*tasks, stop, return_exceptions=True)
            self.heartbeat.stop()
            log.info("email.stopped")

    # -- IMAP --------------------------------------------------------------------------------

    async def _imap_forever(self) -> None:
        delay = BACKOFF_START
        while not self.stopping.is_set():
            try:
                await self._imap_session()
                delay = BACKOFF_START
            except FatalMailError:
                raise
            except Exception as exc:  # network, Redis, or a bug: back off, never a dead loop
                log.warning("email.imap_error", error=repr(exc), retry_in=delay)
                self.heartbeat.info = {"state": "reconnecting", "error": repr(exc)[:200]}
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), delay)
                delay = min(delay * 2, BACKOFF_CAP)

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

    async def _imap_session(self) -> None:
        client = await self._connect()
        try:
            resp = await client.select(self.ecfg.folder)
            if resp.result != "OK":
                raise FatalMailError(f"cannot select folder {self.ecfg.folder!r}: {resp.lines}")
            uidvalidity = _uidvalidity(resp.lines)
            idle = self.ecfg.idle and client.has_capability("IDLE")
            await self._start_cursor(client, uidvalidity)
            self.heartbeat.info = {"state": "idle" if idle else "polling"}
            log.info("email.ready", folder=self.ecfg.folder, idle=idle, uidvalidity=uidvalidity)
            while not self.stopping.is_set():
                await self._process_new(client, uidvalidity)
                if idle:
                    await self._idle(client)
                else:
                    await self._sleep(self.ecfg.poll_interval)
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
            if self.stopping.is_set():
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
            msg = result.message
            structlog.contextvars.bind_contextvars(message_id=msg.event_id)
            if self.state.already_published(msg.event_id):
                log.info("email.duplicate", session=msg.session)
                return True
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
        except redis.RedisError:
            raise
        except Exception as exc:  # a bug on one message must not stop the mailbox
            log.exception("email.handle_failed")
            self.state.dead(raw, f"gateway error: {type(exc).__name__}: {exc}", source)
            return False

    async def _idle(self, client: aioimaplib.IMAP4) -> None:
        idle = await client.idle_start(timeout=self.ecfg.idle_renew)
        try:
            while not self.stopping.is_set() and not self._lost.is_set():
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

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # -- SMTP --------------------------------------------------------------------------------

    async def _deliver_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            try:
                sessions = await asyncio.to_thread(self._sessions)
                for session in sessions:
                    if self._failed_sessions.get(session, 0) > time.monotonic():
                        continue
                    await asyncio.to_thread(self._deliver_session, session, loop)
            except FatalMailError:
                raise
            except Exception as exc:  # Redis down, or a bug: log, wait, go on
                log.warning("email.delivery_error", error=repr(exc))
                await self._sleep(5)
            await self._sleep(DELIVERY_TICK)

    def _sessions(self) -> list[str]:
        """The e-mail sessions with a reply queued or in flight."""
        keys = self.keys
        found = {
            keys.session_of_reply_key(text(key))
            for key in self.r.scan_iter(match=keys.reply_pattern(CHANNEL), count=500)
        }
        found.update(
            keys.session_of_inflight_key(text(key))
            for key in self.r.scan_iter(match=keys.inflight_pattern(CHANNEL), count=500)
        )
        return sorted(found)

    def _deliver_session(self, session: str, loop: asyncio.AbstractEventLoop) -> None:
        queue = ReplyQueue(
            self.r, self.keys, session, max_age=self.cfg.delivery.max_age, gateway="gateway:email"
        )

        def send(reply: Reply) -> None:
            future = asyncio.run_coroutine_threadsafe(self._send(reply), loop)
            try:
                future.result(timeout=180)
            except (NotSent, FatalMailError):
                self.r.zrem(queue.delivered, reply.reply_id)  # certainly not sent: retry later
                raise

        while self.r.exists(queue.queue, queue.inflight) and not self.stopping.is_set():
            try:
                deliver_next(queue, send, timeout=0)
            except NotSent as exc:
                log.warning("email.send_failed", session=session, error=str(exc), retry_in=5)
                self._failed_sessions[session] = time.monotonic() + 5
                return

    async def _send(self, reply: Reply) -> None:
        original = await asyncio.to_thread(self.state.headers_for, reply.in_reply_to)
        if original is None:
            log.error(
                "email.reply_unroutable",
                reply_id=reply.reply_id,
                detail="the message it answers is unknown (or older than 14 days); not sent",
            )
            return
        await self.smtp.send(reply, original)


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


def run_email(cfg: Config, r: redis.Redis) -> int:
    """The gateway process until SIGTERM/SIGINT; exit 2 on a fatal configuration error."""
    return asyncio.run(_main(cfg, r))


async def _main(cfg: Config, r: redis.Redis) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if not cfg.email.configured:
        log.warning(
            "email.not_configured",
            detail="set [email] imap_host (or RELAYBOT_EMAIL_IMAP_HOST); idling until stopped",
        )
        beat = Heartbeat(r, cfg.keys, "gateway:email")
        beat.info = {"state": "not configured"}
        beat.start()
        try:
            await stopping.wait()
        finally:
            beat.stop()
        return 0
    try:
        gateway = EmailGateway(cfg, r)
    except FatalMailError as exc:
        log.error("email.fatal", error=str(exc))
        return 2
    gateway.stopping = stopping
    return await gateway.run()
