"""The model's base URL: the endpoints under it (its query kept), and what the configuration
and `relaybot onboard` refuse, without ever repeating the URL (a key may ride in it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.config import ConfigError, parse_config
from relaybot.onboard_ask import model_url_problem
from worker.openai_parse import endpoint_url, has_userinfo


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:1/v1", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1?key=abc", "http://h:1/v1/chat/completions?key=abc"),
        ("http://h:1/v1/?key=a&b=c#frag", "http://h:1/v1/chat/completions?key=a&b=c"),
        ("https://u:p@h/api/v1//", "https://u:p@h/api/v1/chat/completions"),
        ("http://h", "http://h/chat/completions"),
    ],
)
def test_an_endpoint_is_under_the_base_path_with_its_query(base: str, url: str) -> None:
    assert endpoint_url(base, "chat/completions") == url


def test_userinfo_is_seen() -> None:
    assert has_userinfo("http://u:p@h/v1") and has_userinfo("http://u@h/v1")
    assert not has_userinfo("http://h/v1?user=u") and not has_userinfo("http://[bad")


SECRET = "sk-secret-host-31f"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"ftp://{SECRET}/v1", "http:// or https://"),
        (f"{SECRET}:11434/v1", "http:// or https://"),
        ("http:///v1?key=" + SECRET, "names no host"),
        (f"http://{SECRET}:99999/v1", "port"),
        (f"http://{SECRET}:0/v1", "port"),
        (f"http://{SECRET}:port/v1", "port"),
        (f"http://{SECRET} /v1", "space or a control character"),
        (f"http://{SECRET}/v1\n", "space or a control character"),
        # what httpx cannot ask (adversary round 3: accepted, then every turn failed)
        (f"http://ab\u200b{SECRET}/v1", "invisible character"),
        (f"http://ab\u00ad{SECRET}/v1", "invisible character"),
        (f"http://llm\u2024{SECRET}/v1", "not a valid host name"),
        ("http://[v1.x]/?key=" + SECRET, "not a valid host name"),
    ],
)
def test_an_unusable_base_url_is_refused_without_repeating_it(
    tmp_path: Path, url: str, reason: str
) -> None:
    for section in ("model", "model.derive"):
        raw = f'[model]\nmodel = "m"\n[{section}]\nbase_url = {json.dumps(url)}\n'.replace(
            '[model]\nmodel = "m"\n[model]\n', '[model]\nmodel = "m"\n'
        )
        with pytest.raises(ConfigError) as refused:
            parse_config(raw.encode(), tmp_path, {})
        assert reason in str(refused.value)
        assert f"{section}.base_url" in str(refused.value)
        assert SECRET not in str(refused.value)
    problem = model_url_problem(url)
    assert problem is not None and reason in problem and SECRET not in problem


def test_the_environments_bad_base_url_is_blamed_on_its_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(None, tmp_path, {"OPENAI_BASE_URL": f"localhost:{SECRET}"})
    assert "OPENAI_BASE_URL" in str(refused.value) and SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:11434/v1",
        "https://api.example.org/v1?key=abc",
        "http://user:pw@proxy.example.org/v1",
        "http://[::1]:8080/v1",
        "HTTPS://API.EXAMPLE.ORG/v1",
        "http://bücher.example/v1",
        "https://api.example.org:443/v1/?",
    ],
)
def test_a_usable_base_url_passes(tmp_path: Path, url: str) -> None:
    cfg = parse_config(f'[model]\nbase_url = "{url}"\nmodel = "m"\n'.encode(), tmp_path, {})
    assert cfg.model.base_url == url
    assert model_url_problem(url) is None


def test_an_empty_userinfo_beside_an_api_key_is_no_conflict(tmp_path: Path) -> None:
    """``http://@host`` sends no Basic auth: the key is the only Authorization header."""
    raw = '[model]\nbase_url = "http://@127.0.0.1:9/v1"\nmodel = "m"\napi_key = "sk-1"\n'
    assert parse_config(raw.encode(), tmp_path, {}).model.api_key is not None
    with pytest.raises(ConfigError):
        parse_config(raw.replace("@", "u@").encode(), tmp_path, {})
