"""``relaybot onboard``'s e-mail questions (the spec's ``onboard``): IMAP and SMTP servers,
security, users and passwords, the bot's address, tested before they are written: an IMAP login
(and the folder selected) and an SMTP login, each in the TLS mode configured (``tls``,
``starttls``, ``plain`` only to a loopback address), certificates checked."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.config import Config
from contract.onboarding import (
    TIMEOUT,
    Asker,
    Onboarding,
    Tried,
    port_problem,
    report,
    short,
    with_answers,
)
from gateways.email.config import EmailConfig

# the login tests import what they use (smtplib, imaplib, gateways.email.smtp and aiosmtplib
# behind it) when they run: every `relaybot` command that builds its parser reads this module's
# questions, not its tests
if TYPE_CHECKING:
    import smtplib

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")

EMAIL_KEYS = (
    "email_imap_host",
    "email_imap_tls",
    "email_imap_port",
    "email_imap_user",
    "email_imap_password",
    "email_smtp_host",
    "email_smtp_tls",
    "email_smtp_port",
    "email_smtp_user",
    "email_smtp_password",
    "email_address",
)
QUESTIONS = {
    "email": "set up the e-mail gateway: y or n",
    "email_imap_host": "the bot's IMAP server",
    "email_imap_tls": "IMAP security: tls, starttls or plain",
    "email_imap_port": "IMAP port (default from the security)",
    "email_imap_user": "the bot's IMAP user",
    "email_imap_password": "the bot's IMAP password",
    "email_smtp_host": "the bot's SMTP server",
    "email_smtp_tls": "SMTP security: starttls, tls or plain",
    "email_smtp_port": "SMTP port (default from the security)",
    "email_smtp_user": "the bot's SMTP user ('' : no login)",
    "email_smtp_password": "the bot's SMTP password (default: the IMAP one)",
    "email_address": "the bot's own e-mail address",
}


def email_problem(value: str) -> str | None:
    return None if _EMAIL.match(value) else f"{value!r} is not an e-mail address"


def tls_problem(value: str) -> str | None:
    return None if value in ("tls", "starttls", "plain") else "tls, starttls or plain"


# -- the questions --------------------------------------------------------------------------------


def _smtp_host(imap_host: str) -> str:
    return "smtp." + imap_host.removeprefix("imap.") if imap_host.startswith("imap.") else imap_host


def ask_email(asker: Asker, cfg: Config) -> dict[str, Any] | None:
    """``[email]`` IMAP and SMTP servers, logins and the bot's address, after login tests."""
    e = EmailConfig.of(cfg)
    asker.say("\nE-mail: relaybot reads a mailbox of its own over IMAP and answers over SMTP.")
    if not asker.yes("Set up the e-mail gateway?", e.configured, key="email"):
        return None
    while True:
        section = _email_answers(asker, cfg)
        imap = imap_login(
            section["imap_host"],
            section["imap_port"],
            section["imap_tls"],
            section["imap_user"],
            section["imap_password"],
            folder=e.folder,
            ca_file=e.ca_file,
        )
        smtp = smtp_login(
            section["smtp_host"],
            section["smtp_port"],
            section["smtp_tls"],
            section["smtp_user"],
            section["smtp_password"],
            ca_file=e.ca_file,
        )
        if report(asker, imap) & report(asker, smtp):
            return section
        decision = asker.after_failure("e-mail")
        if decision == "keep":
            return section
        if decision == "skip":
            return None
        asker.forget(EMAIL_KEYS)
        cfg = with_answers(cfg, "email", section)  # a retry starts from these answers


def _email_answers(asker: Asker, cfg: Config) -> dict[str, Any]:
    from gateways.email.smtp import DEFAULT_PORTS

    e = EmailConfig.of(cfg)

    def secret(value: Any) -> str:
        return str(value.get_secret_value()) if value is not None else ""

    imap_host = asker.ask(
        "IMAP server (e.g. imap.fastmail.com)", e.imap_host or "", key="email_imap_host",
        required=True,
    )  # fmt: skip
    imap_tls = asker.ask(
        "IMAP security: tls (port 993), starttls (143) or plain (loopback only)",
        e.imap_tls, key="email_imap_tls", check=tls_problem,
    )  # fmt: skip
    imap_port = asker.ask(
        "IMAP port", str(e.imap_port or DEFAULT_PORTS["imap"][imap_tls]),
        key="email_imap_port", check=port_problem,
    )  # fmt: skip
    imap_user = asker.ask(
        "IMAP user (the bot's mailbox)", e.imap_user or "", key="email_imap_user", required=True
    )
    imap_password = asker.ask(
        "IMAP password (an app password with most providers)", secret(e.imap_password),
        key="email_imap_password", secret=True, required=True,
    )  # fmt: skip
    smtp_host = asker.ask(
        "SMTP server", e.smtp_host or _smtp_host(imap_host), key="email_smtp_host", required=True
    )
    smtp_tls = asker.ask(
        "SMTP security: starttls (port 587), tls (465) or plain (loopback only)",
        e.smtp_tls, key="email_smtp_tls", check=tls_problem,
    )  # fmt: skip
    smtp_port = asker.ask(
        "SMTP port", str(e.smtp_port or DEFAULT_PORTS["smtp"][smtp_tls]),
        key="email_smtp_port", check=port_problem,
    )  # fmt: skip
    smtp_user = asker.ask(
        "SMTP user (empty: no login)", e.smtp_user or imap_user, key="email_smtp_user"
    )
    smtp_password = ""
    if smtp_user:
        smtp_password = asker.ask(
            "SMTP password (empty: the IMAP password)", secret(e.smtp_password),
            key="email_smtp_password", secret=True,
        ) or imap_password  # fmt: skip
    own = e.addresses[0] if e.addresses else (imap_user if "@" in imap_user else "")
    address = asker.ask(
        "The bot's own e-mail address (it sends from it)", own, key="email_address",
        check=email_problem, required=True,
    )  # fmt: skip
    section: dict[str, Any] = {
        "imap_host": imap_host,
        "imap_port": int(imap_port),
        "imap_tls": imap_tls,
        "imap_user": imap_user,
        "imap_password": imap_password,
        "smtp_host": smtp_host,
        "smtp_port": int(smtp_port),
        "smtp_tls": smtp_tls,
        "addresses": [address, *[a for a in e.addresses if a != address]],
    }
    if smtp_user:
        section["smtp_user"] = smtp_user
        section["smtp_password"] = smtp_password
    return section


# -- the login tests ------------------------------------------------------------------------------


def imap_login(
    host: str,
    port: int,
    mode: str,
    user: str,
    password: str,
    *,
    folder: str = "INBOX",
    ca_file: Path | None = None,
) -> Tried:
    """Log in to IMAP (in ``mode``: tls, starttls or plain) and select ``folder``."""
    import imaplib

    from gateways.email.smtp import is_loopback, tls_context

    where = f"IMAP {host}:{port} ({mode})"
    if mode == "plain" and not is_loopback(host):
        return Tried(False, f"{where}: plain text is only allowed to a loopback address")
    try:
        if mode == "tls":
            conn: imaplib.IMAP4 = imaplib.IMAP4_SSL(
                host, port, ssl_context=tls_context(ca_file), timeout=TIMEOUT
            )
        else:
            conn = imaplib.IMAP4(host, port, timeout=TIMEOUT)
            if mode == "starttls":
                conn.starttls(tls_context(ca_file))
    except (OSError, imaplib.IMAP4.error) as exc:
        return Tried(False, f"{where}: cannot connect: {short(str(exc)) or type(exc).__name__}")
    try:
        try:
            conn.login(user, password)
        except imaplib.IMAP4.error as exc:
            return Tried(False, f"{where}: login refused for {user!r}: {short(_text(exc))}")
        status, _ = conn.select(_quote(folder), readonly=True)
        if status != "OK":
            return Tried(False, f"{where}: logged in, but there is no folder {folder!r}")
        # after login: servers (pymap, Dovecot with some settings) list IDLE only then
        _typ, caps = conn.capability()
        idle = "IDLE" in _text_of(caps[0] if caps else b"").upper().split()
        return Tried(True, f"{where}: logged in as {user}" + ("" if idle else " (no IDLE: polls)"))
    except (OSError, imaplib.IMAP4.error) as exc:
        return Tried(False, f"{where}: {short(str(exc)) or type(exc).__name__}")
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            conn.logout()


def _quote(folder: str) -> str:
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text_of(data: object) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def smtp_login(
    host: str, port: int, mode: str, user: str, password: str, *, ca_file: Path | None = None
) -> Tried:
    """Connect to SMTP (in ``mode``) and log in (``user`` empty: no login, a relay)."""
    import smtplib

    from gateways.email.smtp import is_loopback, tls_context

    where = f"SMTP {host}:{port} ({mode})"
    if mode == "plain" and not is_loopback(host):
        return Tried(False, f"{where}: plain text is only allowed to a loopback address")
    try:
        if mode == "tls":
            conn: smtplib.SMTP = smtplib.SMTP_SSL(
                host, port, timeout=TIMEOUT, context=tls_context(ca_file)
            )
        else:
            conn = smtplib.SMTP(host, port, timeout=TIMEOUT)
            if mode == "starttls":
                conn.starttls(context=tls_context(ca_file))
    except (OSError, smtplib.SMTPException) as exc:
        return Tried(False, f"{where}: cannot connect: {short(str(exc)) or type(exc).__name__}")
    try:
        conn.ehlo_or_helo_if_needed()
        if not user:
            return Tried(True, f"{where}: connected (no login configured)")
        try:
            conn.login(user, password)
        except smtplib.SMTPAuthenticationError as exc:
            return Tried(False, f"{where}: login refused for {user!r}: {_smtp_text(exc)}")
        except smtplib.SMTPNotSupportedError:
            return Tried(False, f"{where}: the server offers no login (AUTH) here")
        return Tried(True, f"{where}: logged in as {user}")
    except (OSError, smtplib.SMTPException) as exc:
        return Tried(False, f"{where}: {short(str(exc)) or type(exc).__name__}")
    finally:
        with contextlib.suppress(OSError, smtplib.SMTPException):
            conn.quit()


def _smtp_text(exc: smtplib.SMTPResponseException) -> str:
    message = exc.smtp_error
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    return short(f"{exc.smtp_code} {text}")


def next_steps(answers: Mapping[str, Any]) -> list[str]:
    return [
        "E-mail: set [email] trusted_authserv_ids (or trust_unauthenticated) so that mail "
        "from you is known to be yours (README: E-mail, step 3)."
    ]


ONBOARDING = Onboarding(
    questions=QUESTIONS,
    owner=("emails", "Your e-mail address(es), comma-separated", email_problem),
    ask=ask_email,
    next_steps=next_steps,
)
