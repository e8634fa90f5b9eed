"""``relaybot doctor``'s Matrix checks (the spec's ``doctor`` group): the login and the crypto
store. Nothing is kept: a password login (only when the gateway has no session yet) logs its new
device out at once; the crypto store is opened read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from contract.checks import Add, Check, fail, ok, skipped, warn
from contract.config import Config
from gateways.matrix.config import MatrixConfig

PICKLE_KEY = "DEFAULT_KEY"  # nio's AsyncClientConfig default, which the gateway keeps
_API = "/_matrix/client/v3"


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
        rows = _accounts(db, user_id)
    except Exception as exc:  # peewee's errors (SQLite's text): a file that does not open
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


def _accounts(db: Path, user_id: str) -> list[tuple[Any, bool, str]]:
    """The store's ``(account, shared, device_id)`` of ``user_id``, read with matrix-nio's own
    model of its store (no SQL of ours), read-only."""
    from nio.store.models import Accounts
    from peewee import SqliteDatabase

    database = SqliteDatabase(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=2)
    try:
        with database.bind_ctx([Accounts]):
            found = Accounts.select().where(Accounts.user_id == user_id)
            return [(a.account, bool(a.shared), str(a.device_id)) for a in found]
    finally:
        database.close()
