"""The checks `relaybot onboard` runs before it writes a section: can relaybot use this?

Each check talks to the real service once, with short timeouts, and returns a :class:`Check`: ok
or not, and in words what happened (what a person needs to fix it). Nothing here raises for a
failure of the service; nothing here writes anything.

- the model endpoint: ``GET <base>/models`` (the models it offers) and a one-token chat
  completion with the chosen model;
- Matrix: the homeserver answers ``/_matrix/client/versions``; a password login (the session is
  logged out again, so no stray device is left) or ``whoami`` with an access token, which must
  belong to the bot's user id;
- e-mail: an IMAP login (and the folder selected) and an SMTP login, each in the TLS mode
  configured (``tls``, ``starttls``, ``plain`` only to a loopback address), certificates checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import imaplib
import smtplib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateways.email.smtp import DEFAULT_PORTS, is_loopback, tls_context
from worker.openai_parse import Masker, clip, display_url, endpoint_url

__all__ = [
    "DEFAULT_PORTS",
    "Check",
    "imap_login",
    "list_models",
    "matrix_login",
    "smtp_login",
    "try_completion",
]

TIMEOUT = 10.0  # seconds for each request or connection
_MAX_DETAIL = 300


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str  # what happened, in words
    models: list[str] = field(default_factory=list)  # the model listing's, when that was the check
    device_id: str | None = None  # Matrix: the access token's device
    unlisted: bool = False  # the endpoint answers but has no model list (a completion may work)


def _short(text: str, hide: Callable[[str], str] = str) -> str:
    """One line of at most _MAX_DETAIL characters, masked by ``hide`` before it is cut."""
    return clip(text, _MAX_DETAIL, hide)


def _http_problem(exc: httpx.HTTPError, url: str) -> str:
    url = display_url(url)
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: {_short(str(exc)) or 'connection refused'}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer within {TIMEOUT:g} s"
    return f"{url}: {_short(str(exc)) or type(exc).__name__}"


def _error_text(resp: httpx.Response, hide: Callable[[str], str] = str) -> str:
    try:
        data = resp.json()
    except ValueError:
        return _short(resp.text, hide)
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return _short(str(err.get("message") or err), hide)
        if isinstance(err, str):
            return _short(f"{data.get('errcode', '')} {err}".strip(), hide)
    return _short(resp.text, hide)


# -- the model endpoint ------------------------------------------------------------------------


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _masked(check: Check, hide: Masker) -> Check:
    """``check`` without a secret of the URL or the key in its words (a server's error text may
    echo the request line: ``GET /v1/models?key=...``; what was cut is masked already)."""
    return dataclasses.replace(check, detail=hide(check.detail))


def list_models(base_url: str, api_key: str = "") -> Check:
    """``GET <base_url>/models``: the ids of the models the endpoint offers."""
    hide = Masker(base_url, api_key)
    return _masked(_list_models(base_url, api_key, hide), hide)


def _list_models(base_url: str, api_key: str, hide: Masker) -> Check:
    url = endpoint_url(base_url, "models")
    shown = display_url(url)
    try:
        resp = httpx.get(url, headers=_headers(api_key), timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        return Check(False, _http_problem(exc, url))
    if resp.status_code in (401, 403):
        return Check(False, f"the endpoint refused the API key ({resp.status_code}: "
                            f"{_error_text(resp, hide)})")  # fmt: skip
    if resp.status_code == 404:
        return Check(
            False,
            f"{shown} does not exist (404): an OpenAI-compatible base URL usually ends in /v1",
            unlisted=True,
        )
    if resp.status_code != 200:
        return Check(False, f"{shown} answered {resp.status_code}: {_error_text(resp, hide)}")
    try:
        data = resp.json().get("data")
        models = sorted({str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")})
    except (ValueError, AttributeError, TypeError, KeyError):
        return Check(False, f"{shown} did not answer with a model list (is it OpenAI-compatible?)")
    if not models:
        return Check(True, "the endpoint answers, but lists no models", models=[])
    return Check(True, f"the endpoint answers and offers {len(models)} model(s)", models=models)


def try_completion(base_url: str, api_key: str, model: str) -> Check:
    """A one-token chat completion with ``model``: the endpoint can answer with it."""
    hide = Masker(base_url, api_key)
    return _masked(_try_completion(base_url, api_key, model, hide), hide)


def _try_completion(base_url: str, api_key: str, model: str, hide: Masker) -> Check:
    url = endpoint_url(base_url, "chat/completions")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with the single word: ok"}],
        "max_tokens": 5,
    }
    try:
        resp = httpx.post(url, json=body, headers=_headers(api_key), timeout=max(TIMEOUT, 60.0))
    except httpx.HTTPError as exc:
        return Check(False, _http_problem(exc, url))
    if resp.status_code == 404:
        return Check(False, f"the endpoint has no model {model!r} ({_error_text(resp, hide)})")
    if resp.status_code != 200:
        return Check(
            False, f"a test completion with {model!r} failed: {resp.status_code} "
                   f"{_error_text(resp, hide)}"
        )  # fmt: skip
    try:
        choices = resp.json()["choices"]
        if not isinstance(choices, list) or not choices:
            raise ValueError("no choices")
    except (ValueError, KeyError, TypeError):
        return Check(
            False, f"a test completion with {model!r} gave no answer: {_short(resp.text, hide)}"
        )
    return Check(True, f"{model} answered a test completion")


# -- Matrix --------------------------------------------------------------------------------------


def matrix_login(homeserver: str, user_id: str, *, password: str = "", token: str = "") -> Check:
    """Log in as ``user_id`` with the password (then log out again) or check the token."""
    base = homeserver.rstrip("/")
    try:
        with httpx.Client(timeout=TIMEOUT) as http:
            versions = http.get(f"{base}/_matrix/client/versions")
            if versions.status_code != 200 or "versions" not in _json(versions):
                return Check(
                    False, f"{base} does not answer as a Matrix homeserver "
                           f"({versions.status_code} at /_matrix/client/versions)"
                )  # fmt: skip
            if token:
                return _whoami(http, base, user_id, token)
            if not password:
                return Check(False, "neither a password nor an access token was given")
            return _password_login(http, base, user_id, password)
    except httpx.HTTPError as exc:
        return Check(False, _http_problem(exc, base))


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _whoami(http: httpx.Client, base: str, user_id: str, token: str) -> Check:
    resp = http.get(
        f"{base}/_matrix/client/v3/account/whoami", headers={"Authorization": f"Bearer {token}"}
    )
    if resp.status_code != 200:
        return Check(False, f"the homeserver refused the access token ({_error_text(resp)})")
    data = _json(resp)
    if data.get("user_id") != user_id:
        return Check(False, f"the access token belongs to {data.get('user_id')!r}, not {user_id}")
    device = data.get("device_id")
    return Check(
        True, f"the access token is {user_id}'s", device_id=str(device) if device else None
    )


def _password_login(http: httpx.Client, base: str, user_id: str, password: str) -> Check:
    resp = http.post(
        f"{base}/_matrix/client/v3/login",
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user_id},
            "password": password,
            "initial_device_display_name": "relaybot onboard (login test)",
        },
    )
    if resp.status_code != 200:
        why = _error_text(resp)
        if resp.status_code == 403:
            return Check(False, f"the homeserver refused the login: wrong user or password ({why})")
        return Check(False, f"the login failed: {resp.status_code} {why}")
    data = _json(resp)
    if data.get("user_id") not in (None, user_id):
        return Check(False, f"the login is {data.get('user_id')!r}, not {user_id}")
    token = data.get("access_token")
    if isinstance(token, str):  # leave no device behind: the gateway logs in on its own
        http.post(f"{base}/_matrix/client/v3/logout", headers={"Authorization": f"Bearer {token}"})
    return Check(True, f"logged in as {user_id} (and out again)")


# -- e-mail --------------------------------------------------------------------------------------


def imap_login(
    host: str,
    port: int,
    mode: str,
    user: str,
    password: str,
    *,
    folder: str = "INBOX",
    ca_file: Path | None = None,
) -> Check:
    """Log in to IMAP (in ``mode``: tls, starttls or plain) and select ``folder``."""
    where = f"IMAP {host}:{port} ({mode})"
    if mode == "plain" and not is_loopback(host):
        return Check(False, f"{where}: plain text is only allowed to a loopback address")
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
        return Check(False, f"{where}: cannot connect: {_short(str(exc)) or type(exc).__name__}")
    try:
        try:
            conn.login(user, password)
        except imaplib.IMAP4.error as exc:
            return Check(False, f"{where}: login refused for {user!r}: {_short(_text(exc))}")
        status, _ = conn.select(_quote(folder), readonly=True)
        if status != "OK":
            return Check(False, f"{where}: logged in, but there is no folder {folder!r}")
        idle = "IDLE" in conn.capabilities
        return Check(True, f"{where}: logged in as {user}" + ("" if idle else " (no IDLE: polls)"))
    except (OSError, imaplib.IMAP4.error) as exc:
        return Check(False, f"{where}: {_short(str(exc)) or type(exc).__name__}")
    finally:
        with contextlib.suppress(OSError, imaplib.IMAP4.error):
            conn.logout()


def _quote(folder: str) -> str:
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def smtp_login(
    host: str, port: int, mode: str, user: str, password: str, *, ca_file: Path | None = None
) -> Check:
    """Connect to SMTP (in ``mode``) and log in (``user`` empty: no login, a relay)."""
    where = f"SMTP {host}:{port} ({mode})"
    if mode == "plain" and not is_loopback(host):
        return Check(False, f"{where}: plain text is only allowed to a loopback address")
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
        return Check(False, f"{where}: cannot connect: {_short(str(exc)) or type(exc).__name__}")
    try:
        conn.ehlo_or_helo_if_needed()
        if not user:
            return Check(True, f"{where}: connected (no login configured)")
        try:
            conn.login(user, password)
        except smtplib.SMTPAuthenticationError as exc:
            return Check(False, f"{where}: login refused for {user!r}: {_smtp_text(exc)}")
        except smtplib.SMTPNotSupportedError:
            return Check(False, f"{where}: the server offers no login (AUTH) here")
        return Check(True, f"{where}: logged in as {user}")
    except (OSError, smtplib.SMTPException) as exc:
        return Check(False, f"{where}: {_short(str(exc)) or type(exc).__name__}")
    finally:
        with contextlib.suppress(OSError, smtplib.SMTPException):
            conn.quit()


def _smtp_text(exc: smtplib.SMTPResponseException) -> str:
    message = exc.smtp_error
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    return _short(f"{exc.smtp_code} {text}")
