"""Sending replies over SMTP, and the TLS settings both protocols share.

``tls_context`` checks certificates (and host names) always; ``ca_file`` adds a CA. Plain
connections are refused except to a loopback address. A reply is sent from its session's reply
queue through ``gateways.deliver``, and retried, not dropped (RFC 5321 4.5.4: a sender retries
what was refused for now):

- a transient failure is retried with the runner's backoff until ``delivery.max_age``: the
  connection, TLS or the server lost, a 4xx reply at any step (``451`` greylisting at RCPT TO,
  ``421`` shutting down, ``452`` out of storage);
- a permanent refusal (5xx at MAIL FROM, RCPT TO of every recipient, or DATA) is
  :class:`~gateways.deliver.Undeliverable`: the reply is reported ``failed``;
- a refused login is fatal (a person has to act).

Every attempt carries the same Message-ID, derived from the reply id (``email_compose``): a resend
after a lost connection or a crash between the delivery mark and the server's answer is the same
mail to the recipient's server and mail client, the e-mail counterpart of a Matrix transaction id.
"""

from __future__ import annotations

import ipaddress
import ssl
import time
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib
import structlog

from contract.messages import Reply
from gateways.deliver import Undeliverable
from gateways.email.compose import compose_reply, reply_message_id
from gateways.email.config import EmailConfig
from gateways.email.parse import Headers
from gateways.runner import FatalGatewayError, NotSent

__all__ = [
    "FatalMailError",
    "NotSent",
    "SmtpSender",
    "Undeliverable",
    "check_plain",
    "permanent",
    "port_of",
    "tls_context",
]

log = structlog.get_logger(__name__)

DEFAULT_PORTS = {"imap": {"tls": 993, "starttls": 143, "plain": 143},
                 "smtp": {"tls": 465, "starttls": 587, "plain": 25}}  # fmt: skip


class FatalMailError(FatalGatewayError):
    """The configuration cannot work (a refused login, plain text to a remote host)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plain(mode: str, host: str, what: str) -> None:
    if mode == "plain" and not is_loopback(host):
        raise FatalMailError(
            f"[email] {what}_tls = 'plain' is only allowed to a loopback address, not {host!r}: "
            "use 'tls' or 'starttls'"
        )


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file is not None:
        ctx.load_verify_locations(cafile=str(ca_file))
    return ctx


def port_of(cfg: EmailConfig, what: str) -> int:
    port = cfg.imap_port if what == "imap" else cfg.smtp_port
    mode = cfg.imap_tls if what == "imap" else cfg.smtp_tls
    return port or DEFAULT_PORTS[what][mode]


def permanent(exc: BaseException) -> bool:
    """Whether an SMTP failure refuses the mail for good (5xx); anything else may pass later."""
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):  # every recipient refused
        return bool(exc.recipients) and all(r.code >= 500 for r in exc.recipients)
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return 500 <= exc.code < 600
    return False


class SmtpSender:
    def __init__(self, cfg: EmailConfig) -> None:
        self.cfg = cfg
        self.host = cfg.smtp_host or cfg.imap_host or "localhost"
        check_plain(cfg.smtp_tls, self.host, "smtp")
        self.port = port_of(cfg, "smtp")
        self.sender = cfg.addresses[0] if cfg.addresses else (cfg.smtp_user or "")
        if "@" not in self.sender:
            raise FatalMailError("[email] addresses: relaybot's own address is not set")
        self.own = frozenset(a.lower() for a in cfg.addresses)

    def message_id(self, reply: Reply) -> str:
        """The Message-ID every attempt to send ``reply`` carries."""
        return reply_message_id(
            reply.reply_id, self.sender.rsplit("@", 1)[-1] or "relaybot.invalid"
        )

    def compose(self, reply: Reply, original: Headers) -> EmailMessage:
        """The mail carrying ``reply`` (a new Date each attempt, the same Message-ID)."""
        return compose_reply(reply, original, sender=self.sender, own=self.own, now=time.time())

    async def send(self, msg: EmailMessage, recipients: list[str]) -> None:
        """Hand ``msg`` to the SMTP server for ``recipients`` (one RCPT TO each)."""
        password = self.cfg.smtp_password.get_secret_value() if self.cfg.smtp_password else None
        mode = self.cfg.smtp_tls
        client = aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            use_tls=mode == "tls",
            start_tls=mode == "starttls",
            validate_certs=True,
            tls_context=None if mode == "plain" else tls_context(self.cfg.ca_file),
            timeout=30,
        )
        try:
            await client.connect()
            if self.cfg.smtp_user and password is not None:
                await client.login(self.cfg.smtp_user, password)
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise FatalMailError(f"SMTP login refused for {self.cfg.smtp_user}: {exc}") from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise NotSent(f"SMTP {self.host}:{self.port}: {exc}") from exc
        try:
            refused, _response = await client.send_message(
                msg, sender=self.sender, recipients=recipients
            )
        except aiosmtplib.SMTPResponseException as exc:  # 4xx/5xx at MAIL FROM or DATA
            raise self._refused(exc, msg["Message-ID"]) from exc
        except aiosmtplib.SMTPRecipientsRefused as exc:  # at RCPT TO, for every recipient
            raise self._refused(exc, msg["Message-ID"]) from exc
        finally:
            try:
                await client.quit()
            except (aiosmtplib.SMTPException, OSError):
                client.close()
        if refused:  # some recipients only: the others have it, so it is not sent again
            log.warning(
                "email.recipients_refused",
                message_id=msg["Message-ID"],
                refused={a: f"{r.code} {r.message}"[:200] for a, r in refused.items()},
            )
        log.info("email.sent", message_id=msg["Message-ID"], to=recipients)

    def _refused(self, exc: aiosmtplib.SMTPException, message_id: str) -> Exception:
        """What a refusal by the server becomes: :class:`Undeliverable` (5xx) or NotSent."""
        detail = f"SMTP {self.host}:{self.port} refused {message_id}: {exc}"
        if permanent(exc):
            return Undeliverable(detail)
        return NotSent(detail)
