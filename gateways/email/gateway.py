"""The e-mail gateway: ``relaybot gateway email``, a :class:`~gateways.runner.Channel`.

IMAP in (:mod:`gateways.email.imap`), SMTP out (:mod:`gateways.email.smtp`): the runner delivers
the replies of the ``email:*`` sessions that have a reply queued or in flight (found with SCAN).
A send that may have been interrupted (a crash between the delivery mark and the server's answer,
a connection lost mid-DATA) is sent again with the same Message-ID, derived from the reply id, so
the resend is recognisably the same mail: a reply is retried rather than dropped. Right before
SMTP, the reply's recipients are checked against the audience it was written for
(:mod:`gateways.email.audience`): a recipient outside it, and the reply is withheld, not sent.
Every reply's final status (delivered, failed, withheld, expired) is reported to the worker, which
records it in memory. Without ``[email] imap_host`` the process idles.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

import redis
import structlog

from contract.bus import text
from contract.config import Config, OwnerAlias
from contract.messages import Reply
from gateways.deliver import Undeliverable, Withheld
from gateways.email import channel as spec
from gateways.email.audience import stored_audience, withheld, written_for
from gateways.email.compose import envelope
from gateways.email.config import EmailConfig
from gateways.email.imap import ImapReader
from gateways.email.parse import CHANNEL, Addresses, Headers
from gateways.email.smtp import SmtpSender
from gateways.email.state import MailState
from gateways.runner import Runtime, TypingHook, run_gateway

log = structlog.get_logger(__name__)

# what the log says when the section is not configured
HINT = spec.CHANNEL.hint  # what the log says when the section is not configured


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
    e = EmailConfig.of(cfg)
    allow = {a.lower() for a in e.allowlist}
    return Addresses(
        own=frozenset(a.lower() for a in e.addresses),
        owner=owner_addresses(cfg),
        allow=frozenset(allow - {"*"}),
        allow_all="*" in allow,
        trusted_ids=frozenset(a.strip().lower() for a in e.trusted_authserv_ids),
        trust_mailbox=e.trust_unauthenticated,
        lists=frozenset(a.strip().lower() for a in e.lists),
    )


class EmailGateway:
    name = CHANNEL
    idempotent_sink = True  # a resend carries the same Message-ID (derived from the reply id)
    report_delivered = True  # memory records each reply's final status
    tick = 0.3

    def __init__(self, cfg: Config, r: redis.Redis, rt: Runtime) -> None:
        self.r, self.keys, e = r, cfg.keys, EmailConfig.of(cfg)
        self.state = MailState(r, self.keys, e.folder)
        self.imap = ImapReader(e, addresses_of(cfg), self.state, rt)
        self.smtp = SmtpSender(e)
        self.window = e.reply_window
        self.show_typing: TypingHook | None = None

    def reconfigure(self, cfg: Config) -> None:
        """config.toml changed (gateways/runner.py): the owner's addresses, the allowlist and
        who authenticates senders apply from the next mail on."""
        self.imap.addrs = addresses_of(cfg)

    async def start(self) -> None:
        """Nothing to open before the loops: IMAP connects in its own, SMTP for each reply.
        Says at once when no sender can be authenticated (every mail is then a stranger's)."""
        addrs = self.imap.addrs
        if not addrs.trusted_ids and not addrs.trust_mailbox:
            log.warning(
                "email.senders_unverifiable",
                detail="no sender can be authenticated, so mail from the owner's addresses is "
                "treated as a stranger's: set [email] trusted_authserv_ids to your mail server's "
                "Authentication-Results id, or trust_unauthenticated = true for a mailbox that "
                "only your own server delivers to",
            )

    def inbound(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"imap": self.imap.run()}

    async def sessions(self) -> list[str]:
        return await asyncio.to_thread(self._scan)

    def _scan(self) -> list[str]:
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

    async def send(self, reply: Reply) -> None:
        original = await asyncio.to_thread(self.state.headers_for, reply.in_reply_to)
        if original is None:
            detail = "the message it answers is unknown (or older than 14 days); not sent"
            log.error("email.reply_unroutable", reply_id=reply.reply_id, detail=detail)
            raise Undeliverable(detail)
        msg = self.smtp.compose(reply, original)
        rcpts = envelope(msg)
        self.recheck(reply, original, rcpts)
        # the reply window: an answer to this reply from its recipients within [email]
        # reply_window is recorded, not answered. It opens before the send (an answer may come
        # back while a retry is pending) and again once sent, to run from when the mail went out
        ids = [self.smtp.message_id(reply)]
        await asyncio.to_thread(self.state.note_answered, rcpts, ids, window=self.window)
        await self.smtp.send(msg, rcpts)
        await asyncio.to_thread(self.state.note_answered, rcpts, ids, window=self.window)

    def recheck(self, reply: Reply, original: Headers, rcpts: list[str]) -> None:
        """The audience, checked again as the reply is posted: every recipient must be in the
        audience the reply was written for; else :class:`Withheld` (reported, never sent)."""
        own = self.smtp.own
        try:
            audience = written_for(reply.extra)
        except ValueError as exc:
            raise Withheld(f"not sent: {exc}") from None
        said = "written for"
        if audience is None:  # a reply of an older worker: the audience of the mail it answers
            said = "recomputed from the mail it answers"
            audience = stored_audience(
                original.author, original.sender, original.to, original.cc, own
            )
        if not rcpts:
            raise Undeliverable("not sent: the mail it answers has no address to reply to")
        outside = withheld(rcpts, audience, own)
        if outside:
            raise Withheld(
                f"not sent: {', '.join(outside)} would get it, outside the audience it was "
                f"{said} ({', '.join(sorted(audience)) or 'nobody'})"
            )

    async def close(self) -> None:
        """Nothing stays open: the IMAP loop logs out when it ends."""


def run_email(cfg: Config, r: redis.Redis) -> int:
    """The gateway process until SIGTERM/SIGINT; exit 2 on a fatal configuration error."""
    make = functools.partial(EmailGateway, cfg, r)
    return run_gateway(
        CHANNEL, cfg, r, configured=EmailConfig.of(cfg).configured, hint=HINT, make=make
    )
