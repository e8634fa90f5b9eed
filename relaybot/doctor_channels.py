"""``relaybot doctor``'s channel probes: the Matrix login and crypto store, IMAP and SMTP logins,
and the owner's own mail refused as unauthenticated (what the e-mail gateway noted in Redis).

Nothing is sent and nothing is kept: a Matrix password login (only when the gateway has no
session yet) logs its new device out at once; the crypto store is opened read-only; SMTP stops
after AUTH; Redis is only read.
"""

from __future__ import annotations

import contextlib
import imaplib
import json
import smtplib
import sqlite3
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import redis

from contract.config import Config
from gateways.email.auth import Verdict, owner_refusal_hint
from gateways.email.config import EmailConfig
from gateways.email.gateway import owner_addresses
from gateways.email.smtp import FatalMailError, check_plain, port_of, tls_context
from gateways.matrix.config import MatrixConfig
from relaybot import doctor_redis
from relaybot.doctor_verdict import OWNER_AUTH, Check, fail, ok, owner_auth, skipped, warn

Add = Callable[[Check], None]
PICKLE_KEY = "DEFAULT_KEY"  # nio's AsyncClientConfig default, which the gateway keeps
_API = "/_matrix/client/v3"


# -- Matrix ------------------------------------------------------------------------------------


def matrix_group(cfg: Config, timeout: float, add: Add) -> None:
    m = MatrixConfig.of(cfg)
    if not m.configured:
        because = "[matrix] has no homeserver and user_id (the Matrix gateway idles)"
        add(skipped("matrix.login", because))
        add(skipped("matrix.crypto_store", because))
        return
    store = m.store_path or cfg.home / "matrix"
    saved: dict[str, str] = {}
    session_file = store / "session.json"
    if session_file.exists():
        try:
            loaded = json.loads(session_file.read_text(encoding="utf-8"))
            saved = loaded if loaded.get("user_id") == m.user_id else {}
        except (OSError, ValueError, AttributeError) as exc:
            add(
                fail(
                    "matrix.login",
                    f"{session_file} is unreadable: {exc}",
                    f"remove {session_file}: the gateway logs in again with the password",
                )
            )
            add(skipped("matrix.crypto_store", "the session file is unreadable"))
            return
    with httpx.Client(base_url=str(m.homeserver), timeout=httpx.Timeout(timeout)) as http:
        check, device = _login(http, m, saved, session_file)
    add(check)
    if check.verdict == "fail":
        add(skipped("matrix.crypto_store", "the login failed (matrix.login)"))
        return
    if device is None:
        add(
            skipped(
                "matrix.crypto_store",
                "the gateway has not logged in yet: it creates its "
                "device and crypto store at its first start",
            )
        )
        return
    add(crypto_store(store, str(m.user_id), device))


def _login(
    http: httpx.Client, m: MatrixConfig, saved: dict[str, str], session_file: Path
) -> tuple[Check, str | None]:
    """The login check and the device id the gateway uses (None: it has none yet)."""
    token = m.access_token.get_secret_value() if m.access_token else saved.get("access_token")
    where = f"{m.homeserver} as {m.user_id}"
    try:
        if token:
            resp = http.get(f"{_API}/account/whoami", headers={"Authorization": f"Bearer {token}"})
            if resp.status_code != 200:
                hint = (
                    "log in again and update [matrix] access_token"
                    if m.access_token
                    else f"remove {session_file}: the gateway logs in again with the password"
                )
                return fail(
                    "matrix.login", f"{where}: the token was refused ({_matrix_error(resp)})", hint
                ), None
            who = resp.json()
            device = m.device_id or saved.get("device_id") or who.get("device_id")
            if who.get("user_id") != m.user_id:
                return fail(
                    "matrix.login",
                    f"the token belongs to {who.get('user_id')}, not {m.user_id}",
                    "fix [matrix] user_id or access_token",
                ), None
            if who.get("device_id") and device != who["device_id"]:
                return fail(
                    "matrix.login",
                    f"the token is device {who['device_id']} but the gateway uses {device}",
                    "set [matrix] device_id to the token's device (or remove it)",
                ), None
            kind = "access token" if m.access_token else "saved session"
            return ok("matrix.login", f"{where}: {kind} accepted (device {device})"), device
        if not m.password:
            return fail(
                "matrix.login",
                "[matrix] has neither access_token nor password",
                "set [matrix] password (or access_token)",
            ), None
        return _password_login(http, m, where), None
    except httpx.HTTPError as exc:
        return fail(
            "matrix.login",
            f"cannot reach {m.homeserver}: {exc or type(exc).__name__}",
            "check [matrix] homeserver (its https:// URL) and the network",
        ), None


def _password_login(http: httpx.Client, m: MatrixConfig, where: str) -> Check:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": m.user_id},
        "password": m.password.get_secret_value() if m.password else "",
        "initial_device_display_name": "relaybot doctor (logged out at once)",
    }
    resp = http.post(f"{_API}/login", json=body)
    if resp.status_code != 200:
        return fail(
            "matrix.login",
            f"{where}: password login refused ({_matrix_error(resp)})",
            "fix [matrix] password (or user_id)",
        )
    token = resp.json().get("access_token", "")
    http.post(f"{_API}/logout", headers={"Authorization": f"Bearer {token}"}, json={})
    return ok("matrix.login", f"{where}: password accepted (the gateway has not logged in yet)")


def _matrix_error(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return f"{resp.status_code} {body.get('errcode')}: {body.get('error')}"
    except (ValueError, AttributeError):
        return f"HTTP {resp.status_code}"


def crypto_store(store: Path, user_id: str, device: str) -> Check:
    """The gateway's nio store for (user, device) exists, opens and holds that device's keys."""
    cid = "matrix.crypto_store"
    db = store / f"{user_id}_{device}.db"
    reset = (
        f"stop the gateway, remove {store} (it logs in as a new device; encrypted rooms "
        "re-share their keys with it)"
    )
    if not db.exists():
        others = sorted(p.name for p in store.glob(f"{user_id}_*.db")) if store.is_dir() else []
        if others:
            return fail(
                cid,
                f"no crypto store for device {device} in {store}; it holds "
                f"{', '.join(others)}: the keys of another device",
                reset,
            )
        return warn(
            cid,
            f"no crypto store for device {device} in {store} yet",
            "start the gateway: it creates the store; encrypted messages sent to the "
            "device before that cannot be decrypted",
        )
    try:
        conn = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=2)
        try:
            rows = conn.execute(
                "SELECT account, shared, device_id FROM accounts WHERE user_id = ?", (user_id,)
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return fail(cid, f"{db} does not open: {exc}", reset)
    mine = [r for r in rows if r[2] == device]
    if not mine:
        return fail(
            cid,
            f"{db} holds no account for device {device} "
            f"({', '.join(str(r[2]) for r in rows) or 'none'})",
            reset,
        )
    try:
        from nio.crypto import OlmAccount

        account: Any = OlmAccount.from_pickle(mine[0][0], PICKLE_KEY, bool(mine[0][1]))
        key = str(account.identity_keys.get("ed25519", ""))[:12]
    except Exception as exc:  # a corrupt pickle, another pickle key: any failure is the verdict
        return fail(cid, f"the account in {db} cannot be unpickled: {exc}", reset)
    return ok(cid, f"{db.name} opens: device {device}, ed25519 {key}…", path=str(db))


# -- e-mail ------------------------------------------------------------------------------------


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
    r = doctor_redis.client(cfg, timeout)
    key = cfg.keys.email_owner_refused
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
