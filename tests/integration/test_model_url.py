"""A model base URL with a key in its query, or a user:password, over real HTTP (adversary
findings: with ``/v1?key=...`` the client asked ``/v1?key=.../chat/completions``, doctor and
onboard printed the key, and a URL's user:password silently replaced the API key)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from contract.config import Config, ConfigError, ModelConfig, parse_config
from relaybot import doctor_model, onboard_checks
from relaybot.doctor_verdict import Check
from tests.support.fakemodel import FakeModelServer
from worker.model import ModelError
from worker.openai_client import OpenAIChatClient

QKEY = "sk-query-9d41c7"
KEY = "sk-bearer-52e8a0"


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _words(checks: list[Check]) -> str:
    return " ".join(f"{c.summary} {c.hint}" for c in checks)


def test_a_key_in_the_query_reaches_every_endpoint_and_no_text(tmp_path: Path) -> None:
    with FakeModelServer(query_key=QKEY) as server:
        base = f"{server.base_url}?key={QKEY}"
        client = OpenAIChatClient(base_url=base, model="fake-model", timeout=3, retries=0)
        try:
            answer = client.complete(_user("hello"), [])
        finally:
            client.close()
        assert answer.content
        found: list[Check] = []
        cfg = Config.model_validate(
            {"home": tmp_path, "model": {"base_url": base, "model": "fake-model"}}
        )
        doctor_model.model_group(cfg, 3.0, found.append)
        listing = onboard_checks.list_models(base, "")
        tried = onboard_checks.try_completion(base, "", "fake-model")
        paths = list(server.paths)
    assert {c.id: c.verdict for c in found} == {
        "model.configured": "ok",
        "model.reachable": "ok",
        "model.exists": "ok",
        "model.tools": "ok",
    }
    assert listing.ok and listing.models == ["fake-model"]
    assert tried.ok, tried.detail
    assert f"POST /v1/chat/completions?key={QKEY}" in paths
    assert f"GET /v1/models?key={QKEY}" in paths
    assert all("?key=" in p and p.split(" ")[1].startswith("/v1/") for p in paths), paths
    assert QKEY not in _words(found)
    assert QKEY not in listing.detail + tried.detail


@pytest.mark.parametrize(
    ("wrong", "refusal", "part"),
    [
        ("sk-wrong-77aa31", "Missing or wrong key in {path}", "sk-wrong-77aa"),
        # the key where each text is cut (adversary round 3: its first part showed): the
        # worker's at 200 characters, doctor's at 160, onboard's at 300
        ("Zq9SECRETkey77", "x" * 184 + " bad key {value}", "Zq9SEC"),
        ("Zq9SECRETkey77", "x" * 145 + " bad key {value}", "Zq9SEC"),
        ("Zq9SECRETkey77", "x" * 284 + " bad key {value}", "Zq9SEC"),
        # percent-encoded in the URL, echoed as sent; and a key the server spells its own way
        ("Zq9%2FSECRET%2Bkey", "Missing or wrong key {value}", "Zq9%2FSECRET"),
        ("Zq9%2FSECRET%2Bkey", "Missing or wrong key Zq9/SECRET+key", "SECRET"),
        ("Zq9/SECRET+key", "Missing or wrong key Zq9%2FSECRET%20key", "SECRET"),
    ],
)
def test_a_wrong_query_key_is_reported_without_any_key(
    tmp_path: Path, wrong: str, refusal: str, part: str
) -> None:
    """The server's 401 echoes the request line, key included: no text repeats it, or a part
    of it, in any spelling."""
    with FakeModelServer(query_key=QKEY, refusal=refusal) as server:
        base = f"{server.base_url}?key={wrong}"
        client = OpenAIChatClient(base_url=base, model="fake-model", timeout=3, retries=0)
        try:
            with pytest.raises(ModelError) as caught:
                client.complete(_user("hello"), [])
        finally:
            client.close()
        found: list[Check] = []
        cfg = Config.model_validate(
            {"home": tmp_path, "model": {"base_url": base, "model": "fake-model"}}
        )
        doctor_model.model_group(cfg, 3.0, found.append)
        listing = onboard_checks.list_models(base, "")
        tried = onboard_checks.try_completion(base, "", "fake-model")
        where = f"{server.host}:{server.port}"
    assert caught.value.status == 401
    texts = [str(caught.value), caught.value.shown, _words(found), listing.detail, tried.detail]
    assert "Missing or wrong key" in listing.detail + _words(found) or "bad key" in listing.detail
    for text in texts:
        assert part.casefold() not in text.casefold(), text
    assert where in str(caught.value)  # the log's text names the endpoint, the reply does not
    assert where not in caught.value.shown


def test_user_and_password_in_the_url_are_sent_as_basic_auth() -> None:
    with FakeModelServer() as server:
        base = server.base_url.replace("http://", "http://proxyuser:proxy-pass-31@")
        client = OpenAIChatClient(base_url=base, model="fake-model", timeout=3, retries=0)
        try:
            client.complete(_user("hello"), [])
        finally:
            client.close()
        sent = server.authorizations
    assert sent == ["Basic " + base64.b64encode(b"proxyuser:proxy-pass-31").decode()]


def test_user_and_password_in_the_url_and_an_api_key_are_refused_before_any_request(
    tmp_path: Path,
) -> None:
    """httpx sends the URL's Basic auth instead of the Bearer key: the key was never sent."""
    with FakeModelServer(api_key=KEY) as server:
        base = server.base_url.replace("http://", "http://proxyuser:proxy-pass-31@")
        with pytest.raises(ModelError) as caught:
            OpenAIChatClient(base_url=base, model="fake-model", api_key=KEY)
        raw = f'[model]\nbase_url = "{base}"\nmodel = "fake-model"\napi_key = "{KEY}"\n'
        with pytest.raises(ConfigError) as refused:
            parse_config(raw.encode(), tmp_path, {})
        derived = (
            f'[model]\nbase_url = "{server.base_url}"\nmodel = "m"\napi_key = "{KEY}"\n'
            f'[model.derive]\nbase_url = "{base}"\n'
        )
        with pytest.raises(ConfigError) as refused_derive:
            parse_config(derived.encode(), tmp_path, {})
        calls = server.calls
        plain = server.base_url
    assert calls == 0
    assert caught.value.kind == "config"
    assert "user:password" in str(refused.value) and "keep one" in str(refused.value)
    assert "model.derive" not in str(refused.value)
    assert "derive" in str(refused_derive.value)
    for text in (str(caught.value), str(refused.value), str(refused_derive.value)):
        assert "proxy-pass-31" not in text and KEY not in text
    # each alone is fine
    ModelConfig(base_url=base, model="m")
    ModelConfig(base_url=plain, model="m", api_key=KEY)
