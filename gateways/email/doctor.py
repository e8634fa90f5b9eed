"""``relaybot doctor``'s e-mail checks (the spec's ``doctor`` group): IMAP and SMTP logins and
the owner's own mail refused as unauthenticated (what the gateway noted in Redis). Nothing is
sent: SMTP stops after AUTH; Redis is only read."""

from __future__ import annotations

import contextlib
import imaplib
import json
import smtplib
import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from contract.checks import Add, Check, fail, ok, probe_client, skipped, warn
from contract.config import Config
from gateways.email.auth import Verdict, owner_refusal_hint
from gateways.email.config import EmailConfig
from gateways.email.gateway import owner_addresses
from gateways.email.keys import EmailKeys
from gateways.email.smtp import FatalMailError, check_plain, port_of, tls_context

# -- the owner's mail -----------------------------------------------------------------------

OWNER_AUTH = "email.owner_auth"


def owner_auth(
    record: Mapping[str, Any] | None,
    *,
    trusted: Iterable[str],
    trust_mailbox: bool,
    hint: str,
    now: float,
    owner_addresses: bool = True,
) -> Check:
    """The owner's own mail and its authentication: ``record`` is the last mail from one of the
    owner's addresses that the gateway did not take as the owner's (``email:owner_refused``),
    None when there is none; ``hint`` the fix the gateway would give for it today;
    ``owner_addresses``: whether the owner has e-mail addresses at all."""
    trusted = sorted(trusted)
    if record is None:
        if not trusted and not trust_mailbox and owner_addresses:
            return warn(
                OWNER_AUTH,
                "no sender can be authenticated: mail from your own addresses is a stranger's "
                "(labelled unverified, never yours)",
                "set [email] trusted_authserv_ids to the id your mail server writes first in "
                "Authentication-Results, or trust_unauthenticated = true for a mailbox only your "
                "own server delivers to",
            )
        return ok(OWNER_AUTH, "no mail from your addresses was refused as unauthenticated")
    seen = [str(s) for s in record.get("seen", [])]
    ago = max(0.0, now - float(record.get("at", now)))
    when = f"{ago / 3600:.0f} h ago" if ago >= 3600 else f"{ago / 60:.0f} min ago"
    said = (
        f"mail from {record.get('sender', '?')} ({when}) was not taken as yours: "
        f"{record.get('detail', '?')}; Authentication-Results seen from: "
        f"{', '.join(seen) or 'none'}"
    )
    details = {k: record.get(k) for k in ("sender", "at", "reason", "seen", "message_id")}
    untrusted = record.get("reason") in ("untrusted", "no_trusted_ids")
    if trust_mailbox or (untrusted and set(seen) & set(trusted)):
        return ok(OWNER_AUTH, f"{said} (fixed since: the configuration trusts it now)", **details)
    return warn(OWNER_AUTH, said, hint, **details)


def email_group(cfg: Config, timeout: float, add: Add) -> None:
    e = EmailConfig.of(cfg)
    if not e.configured:
        because = "[email] has no imap_host (the e-mail gateway idles)"
        add(skipped("email.imap", because))
        add(skipped("email.smtp", because))
        add(skipped(OWNER_AUTH, because))
        return
    add(imap_check(e, timeout))
    add(smtp_check(e, timeout))
    add(owner_auth_check(cfg, timeout))


def owner_auth_check(cfg: Config, timeout: float) -> Check:
    """The last mail from the owner's addresses that the gateway refused as unauthenticated
    (``email:owner_refused``, written by the gateway wherever it runs), with the fix."""
    e = EmailConfig.of(cfg)
    if cfg.embedded_redis and not (cfg.redis_dir / "redis.sock").exists():
        return skipped(OWNER_AUTH, "the embedded Redis is not running (redis.reachable)")
    r = probe_client(cfg, timeout)
    key = EmailKeys(cfg.keys).owner_refused
    try:
        raw = r.get(key)
    except redis.exceptions.NoPermissionError as exc:
        return skipped(OWNER_AUTH, f"this Redis user may not read {key} (redis.acl): {exc}")
    except (redis.RedisError, OSError) as exc:
        return skipped(OWNER_AUTH, f"Redis is not reachable (redis.reachable): {exc}")
    finally:
        r.close()
    record: dict[str, Any] | None = None
    if raw is not None:
        with contextlib.suppress(ValueError, TypeError):
            loaded = json.loads(raw)
            record = loaded if isinstance(loaded, dict) else None
    hint = ""
    if record is not None:
        seen = tuple(str(s) for s in record.get("seen", []))
        refused = Verdict(None, str(record.get("reason", "")), str(record.get("detail", "")), seen)
        hint = owner_refusal_hint(refused, e.trusted_authserv_ids)
    return owner_auth(
        record,
        trusted=[t.strip().lower() for t in e.trusted_authserv_ids],
        trust_mailbox=e.trust_unauthenticated,
        hint=hint,
        now=time.time(),
        owner_addresses=bool(owner_addresses(cfg)),
    )


def imap_check(e: EmailConfig, timeout: float) -> Check:
    host, port, mode = e.imap_host or "", port_of(e, "imap"), e.imap_tls
    where = f"IMAP {host}:{port} ({mode})"
    try:
        check_plain(mode, host, "imap")
        conn: imaplib.IMAP4
        if mode == "tls":
            conn = imaplib.IMAP4_SSL(
                host, port, ssl_context=tls_context(e.ca_file), timeout=timeout
            )
        else:
            conn = imaplib.IMAP4(host, port, timeout=timeout)
            if mode == "starttls":
                conn.starttls(tls_context(e.ca_file))
    except FatalMailError as exc:
        return fail("email.imap", str(exc), "use imap_tls = 'tls' or 'starttls'")
    except (OSError, imaplib.IMAP4.error, ssl.SSLError) as exc:
        return fail(
            "email.imap",
            f"cannot connect to {where}: {exc}",
            "check [email] imap_host, imap_port, imap_tls (and ca_file)",
        )
    try:
        password = e.imap_password.get_secret_value() if e.imap_password else ""
        try:
            conn.login(e.imap_user or "", password)
        except imaplib.IMAP4.error as exc:
            return fail(
                "email.imap",
                f"{where}: login refused for {e.imap_user!r}: {exc}",
                "fix [email] imap_user / imap_password",
            )
        typ, _data = conn.select(e.folder, readonly=True)
        if typ != "OK":
            return fail("email.imap", f"{where}: no folder {e.folder!r}", "fix [email] folder")
        _typ, caps = conn.capability()  # after login: servers add capabilities then
        idle = "IDLE" in _text(caps[0] or b"").upper().split() or "IDLE" in conn.capabilities
    except (OSError, imaplib.IMAP4.error) as exc:
        return fail("email.imap", f"{where}: {exc}", "check the IMAP server")
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            conn.logout()
    said = f"{where}: logged in as {e.imap_user}, folder {e.folder}"
    if e.idle and not idle:
        return warn(
            "email.imap",
            said + f", no IDLE: the gateway polls every {e.poll_interval:.0f} s",
            "lower [email] poll_interval for quicker answers, or use a server with IDLE",
        )
    return ok("email.imap", said + (", IDLE" if idle else ", polling (idle = false)"))


def smtp_check(e: EmailConfig, timeout: float) -> Check:
    host = e.smtp_host or e.imap_host or "localhost"
    port, mode = port_of(e, "smtp"), e.smtp_tls
    where = f"SMTP {host}:{port} ({mode})"
    if not e.addresses and "@" not in (e.smtp_user or ""):
        return fail(
            "email.smtp",
            "[email] addresses is not set: replies have no sender",
            'set [email] addresses = ["bot@example.org"]',
        )
    try:
        check_plain(mode, host, "smtp")
        conn: smtplib.SMTP
        if mode == "tls":
            conn = smtplib.SMTP_SSL(host, port, timeout=timeout, context=tls_context(e.ca_file))
        else:
            conn = smtplib.SMTP(host, port, timeout=timeout)
    except FatalMailError as exc:
        return fail("email.smtp", str(exc), "use smtp_tls = 'tls' or 'starttls'")
    except (OSError, smtplib.SMTPException) as exc:
        return fail(
            "email.smtp",
            f"cannot connect to {where}: {exc}",
            "check [email] smtp_host, smtp_port, smtp_tls (and ca_file)",
        )
    try:
        conn.ehlo()
        if mode == "starttls":
            conn.starttls(context=tls_context(e.ca_file))
            conn.ehlo()
        if not e.smtp_user:
            return ok(
                "email.smtp",
                f"{where}: EHLO answered; no smtp_user, so no AUTH "
                "(the server must relay for this host)",
            )
        password = e.smtp_password.get_secret_value() if e.smtp_password else ""
        conn.login(e.smtp_user, password)
    except smtplib.SMTPAuthenticationError as exc:
        return fail(
            "email.smtp",
            f"{where}: login refused for {e.smtp_user!r}: {exc.smtp_code} {_text(exc.smtp_error)}",
            "fix [email] smtp_user / smtp_password",
        )
    except smtplib.SMTPNotSupportedError as exc:
        return fail(
            "email.smtp",
            f"{where}: {exc}",
            "the server offers no AUTH here: use "
            "smtp_tls = 'starttls' or 'tls' (servers offer AUTH only over TLS)",
        )
    except (OSError, smtplib.SMTPException) as exc:
        return fail("email.smtp", f"{where}: {exc}", "check the SMTP server")
    finally:
        try:
            conn.quit()
        except (OSError, smtplib.SMTPException):
            conn.close()
    return ok("email.smtp", f"{where}: EHLO, AUTH as {e.smtp_user} accepted (nothing sent)")


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
