"""Logging the Matrix gateway in, and telling the homeserver's fatal answers from the others.

Credentials: a configured access token (its device id configured, or asked with ``whoami``),
else the token and device saved by an earlier login in ``<store>/session.json`` (mode 600),
else a password login. The device id is kept so that the crypto store under the same directory
stays valid across restarts. A refused login or a lost session is a :class:`FatalMatrixError`;
any other error response comes back as a value and is raised as :class:`ErrorValue`, which the
caller retries with a backoff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import structlog
from nio import AsyncClient, AsyncClientConfig, ErrorResponse, LoginResponse, WhoamiResponse

from gateways.matrix.config import MatrixConfig
from gateways.runner import FatalGatewayError

log = structlog.get_logger(__name__)

_FATAL_CODES = ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN_TOKEN")


class FatalMatrixError(FatalGatewayError):
    """The session is gone or the login was refused: a person has to act."""


class ErrorValue(Exception):
    """An error response that nio returned as a value (never ignored: it is retried)."""

    def __init__(self, resp: Any) -> None:
        super().__init__(describe(resp))
        self.resp = resp


def describe(resp: Any) -> str:
    if isinstance(resp, ErrorResponse):
        return f"{resp.status_code}: {resp.message}"
    return repr(resp)[:200]


def check_fatal(resp: Any) -> None:
    """Raise :class:`FatalMatrixError` when the homeserver ended this session."""
    if isinstance(resp, ErrorResponse) and resp.status_code in _FATAL_CODES:
        soft = bool(getattr(resp, "soft_logout", False))
        raise FatalMatrixError(
            f"the homeserver ended this session ({resp.status_code}"
            f"{', soft logout' if soft else ''}): log in again and update [matrix] "
            "access_token (or remove the session file to log in with the password)"
        )


async def login(m: MatrixConfig, store: Path) -> AsyncClient:
    """A logged-in client with its crypto store under ``store``."""
    if not (m.homeserver and m.user_id):
        raise FatalMatrixError("[matrix] homeserver and user_id are not configured")
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    session_file = store / "session.json"
    saved: dict[str, str] = {}
    if session_file.exists():
        saved = json.loads(session_file.read_text(encoding="utf-8"))
        if saved.get("user_id") != m.user_id:
            saved = {}
    config = AsyncClientConfig(
        max_timeouts=1, max_limit_exceeded=3, store_sync_tokens=False, encryption_enabled=True
    )
    client = AsyncClient(
        m.homeserver, m.user_id, device_id=m.device_id, store_path=str(store), config=config
    )
    try:
        token, device_id = await _credentials(client, m, saved)
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
    return client


async def _credentials(
    client: AsyncClient, m: MatrixConfig, saved: dict[str, str]
) -> tuple[str, str]:
    """(access token, device id): configured, saved from an earlier login, or a new login."""
    token = m.access_token.get_secret_value() if m.access_token else saved.get("access_token")
    device_id = m.device_id or saved.get("device_id")
    if token and not device_id:
        client.access_token = token
        who = await client.whoami()
        if not isinstance(who, WhoamiResponse) or not who.device_id:
            check_fatal(who)
            raise ErrorValue(who)
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
            raise FatalMatrixError(f"password login refused: {describe(resp)}")
        raise ErrorValue(resp)
    return str(resp.access_token), str(resp.device_id)
