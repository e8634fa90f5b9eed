"""``relaybot onboard``'s Matrix questions (the spec's ``onboard``): the homeserver, the bot's
user id and its password or access token, tested by a login before they are written: the
homeserver answers ``/_matrix/client/versions``; a password login (the session is logged out
again, so no stray device is left) or ``whoami`` with an access token, which must belong to the
bot's user id."""

from __future__ import annotations

import re
from typing import Any

import httpx

from contract.config import Config
from contract.onboarding import (
    TIMEOUT,
    Asker,
    Onboarding,
    Tried,
    error_text,
    http_problem,
    report,
    url_problem,
    with_answers,
)
from gateways.matrix.config import MatrixConfig

_MATRIX_ID = re.compile(r"^@[^:\s]+:\S+$")

MATRIX_KEYS = (
    "matrix_homeserver",
    "matrix_user",
    "matrix_login",
    "matrix_password",
    "matrix_token",
)
QUESTIONS = {
    "matrix": "set up the Matrix gateway: y or n",
    "matrix_homeserver": "the bot's homeserver URL",
    "matrix_user": "the bot's Matrix user id",
    "matrix_login": "log the bot in with its p(assword) or an access t(oken)",
    "matrix_password": "the bot's Matrix password",
    "matrix_token": "the bot's Matrix access token",
}


def matrix_problem(value: str) -> str | None:
    if _MATRIX_ID.match(value):
        return None
    return f"{value!r} is not a Matrix user id (like @ada:example.org)"


# -- the questions --------------------------------------------------------------------------------


def ask_matrix(asker: Asker, cfg: Config) -> dict[str, Any] | None:
    """``[matrix]`` homeserver, user_id and password or access_token, after a login test."""
    m = MatrixConfig.of(cfg)
    asker.say("\nMatrix: relaybot uses an account of its own on a homeserver (not yours).")
    if not asker.yes("Set up the Matrix gateway?", m.configured, key="matrix"):
        return None
    while True:
        homeserver = asker.ask(
            "Homeserver URL (e.g. https://matrix.example.org)",
            m.homeserver or "",
            key="matrix_homeserver",
            check=url_problem,
            required=True,
        )
        user_id = asker.ask(
            "The bot's Matrix user id (e.g. @relaybot:example.org)",
            m.user_id or "",
            key="matrix_user",
            check=matrix_problem,
            required=True,
        )
        how = asker.ask(
            "Log in with its [p]assword or an access [t]oken",
            "t" if "matrix_token" in asker.preset or m.access_token else "p",
            key="matrix_login",
            check=lambda a: None if a[:1].lower() in ("p", "t") else "p or t",
        )[:1].lower()
        section: dict[str, Any] = {"homeserver": homeserver, "user_id": user_id}
        if how == "t":
            current = m.access_token.get_secret_value() if m.access_token else ""
            token = asker.ask(
                "Access token", current, key="matrix_token", secret=True, required=True
            )
            result = matrix_login(homeserver, user_id, token=token)
            section["access_token"] = token
            if result.device_id:
                section["device_id"] = result.device_id
        else:
            current = m.password.get_secret_value() if m.password else ""
            password = asker.ask(
                "Password", current, key="matrix_password", secret=True, required=True
            )
            result = matrix_login(homeserver, user_id, password=password)
            section["password"] = password
        if report(asker, result):
            return section
        decision = asker.after_failure("Matrix")
        if decision == "keep":
            return section
        if decision == "skip":
            return None
        asker.forget(MATRIX_KEYS)
        cfg = with_answers(cfg, "matrix", section)  # a retry starts from these answers
        m = MatrixConfig.of(cfg)


# -- the login test -------------------------------------------------------------------------------


def matrix_login(homeserver: str, user_id: str, *, password: str = "", token: str = "") -> Tried:
    """Log in as ``user_id`` with the password (then log out again) or check the token."""
    base = homeserver.rstrip("/")
    try:
        with httpx.Client(timeout=TIMEOUT) as http:
            versions = http.get(f"{base}/_matrix/client/versions")
            if versions.status_code != 200 or "versions" not in _json(versions):
                return Tried(
                    False, f"{base} does not answer as a Matrix homeserver "
                           f"({versions.status_code} at /_matrix/client/versions)"
                )  # fmt: skip
            if token:
                return _whoami(http, base, user_id, token)
            if not password:
                return Tried(False, "neither a password nor an access token was given")
            return _password_login(http, base, user_id, password)
    except httpx.HTTPError as exc:
        return Tried(False, http_problem(exc, base))


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _whoami(http: httpx.Client, base: str, user_id: str, token: str) -> Tried:
    resp = http.get(
        f"{base}/_matrix/client/v3/account/whoami", headers={"Authorization": f"Bearer {token}"}
    )
    if resp.status_code != 200:
        return Tried(False, f"the homeserver refused the access token ({error_text(resp)})")
    data = _json(resp)
    if data.get("user_id") != user_id:
        return Tried(False, f"the access token belongs to {data.get('user_id')!r}, not {user_id}")
    device = data.get("device_id")
    return Tried(
        True, f"the access token is {user_id}'s", device_id=str(device) if device else None
    )


def _password_login(http: httpx.Client, base: str, user_id: str, password: str) -> Tried:
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
        why = error_text(resp)
        if resp.status_code == 403:
            return Tried(False, f"the homeserver refused the login: wrong user or password ({why})")
        return Tried(False, f"the login failed: {resp.status_code} {why}")
    data = _json(resp)
    if data.get("user_id") not in (None, user_id):
        return Tried(False, f"the login is {data.get('user_id')!r}, not {user_id}")
    token = data.get("access_token")
    if isinstance(token, str):  # leave no device behind: the gateway logs in on its own
        http.post(f"{base}/_matrix/client/v3/logout", headers={"Authorization": f"Bearer {token}"})
    return Tried(True, f"logged in as {user_id} (and out again)")


ONBOARDING = Onboarding(
    questions=QUESTIONS,
    owner=("matrix_ids", "Your Matrix user id(s), comma-separated", matrix_problem),
    ask=ask_matrix,
    replaced=("password", "access_token", "device_id"),
)
