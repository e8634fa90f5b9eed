"""The checks `relaybot onboard` runs before it writes a section: can relaybot use this?

Each check talks to the real service once, with short timeouts, and returns a :class:`Check`: ok
or not, and in words what happened (what a person needs to fix it). Nothing here raises for a
failure of the service; nothing here writes anything.

- the model endpoint: ``GET <base>/models`` (the models it offers) and a one-token chat
  completion with the chosen model;
- a channel's section: its own test, in its folder (its onboarding: contract/onboarding.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import httpx

from contract.config import display_url
from contract.onboarding import Tried as Check
from contract.onboarding import http_problem
from worker.openai_parse import Masker, clip, endpoint_url

__all__ = ["Check", "list_models", "try_completion"]

TIMEOUT = 10.0  # seconds for each request or connection
_MAX_DETAIL = 300


def _short(text: str, hide: Callable[[str], str] = str) -> str:
    """One line of at most _MAX_DETAIL characters, masked by ``hide`` before it is cut."""
    return clip(text, _MAX_DETAIL, hide)


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
        return Check(False, http_problem(exc, url))
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
        return Check(False, http_problem(exc, url))
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
