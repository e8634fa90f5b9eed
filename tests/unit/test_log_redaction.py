"""No secret reaches a log line: values of secret-looking keys and passwords inside URLs are
replaced before rendering (contract/logs.py), on every line, not only the first of a key."""

from __future__ import annotations

import io
import json
import re

import pytest
import structlog
from hypothesis import assume, given
from hypothesis import strategies as st

from contract import logs


def lines(**events: dict[str, object]) -> list[dict[str, object]]:
    out = io.StringIO()
    logs.configure("test", stream=out)
    log = structlog.get_logger("t")
    for name, fields in events.items():
        log.info(name, **fields)
        log.info(name, **fields)  # the second time the key's verdict comes from the memo
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_secret_keys_are_masked_every_time() -> None:
    got = lines(
        a={"api_key": "sk-live-1", "Authorization": "Bearer x", "db_password": "hunter2"},
        b={"token": "", "secret": None, "ok_value": "plain", "count": 3},
    )
    assert [g["api_key"] for g in got[:2]] == ["***", "***"]
    assert all(g["Authorization"] == "***" and g["db_password"] == "***" for g in got[:2])
    assert got[2]["token"] == "" and got[2]["secret"] is None  # nothing to hide: shown as is
    assert got[3]["ok_value"] == "plain" and got[3]["count"] == 3


def test_passwords_in_urls_are_masked_in_any_value() -> None:
    got = lines(
        c={"error": "cannot reach redis://relay:s3cret@10.0.0.1:6379/0", "url": "http://h/x"}
    )
    assert got[0]["error"] == "cannot reach redis://relay:***@10.0.0.1:6379/0"
    assert got[1]["error"] == got[0]["error"]
    assert got[0]["url"] == "http://h/x"
    assert "s3cret" not in json.dumps(got)


def test_the_event_name_itself_is_never_masked() -> None:
    got = lines(token_refreshed={"n": 1})
    assert got[0]["event"] == "token_refreshed"


def test_secrets_inside_a_message_string_are_masked() -> None:
    """nio's debug line is one string holding a response's repr: the key is inside the text."""
    got = lines(
        d={
            "detail": "Validating response schema LoginResponse: {'access_token': 'syt_cmVs_AbC', "
            "'device_id': 'DEV1', \"password\": \"hunter2\", 'user_id': '@bot:hs'}",
            "header": "sent Authorization: Bearer abc.def-123 to the server",
            "bare": "retrying with syt_cmVsYXk_QWxsb3dlZA_1a2b3c",
            "pair": "login failed password=hunter3 user=bob",
        }
    )
    text = json.dumps(got)
    for secret in ("syt_cmVs", "hunter2", "abc.def-123", "QWxsb3dlZA", "hunter3"):
        assert secret not in text, secret
    assert "'device_id': 'DEV1'" in got[0]["detail"] and "'access_token': '***'" in got[0]["detail"]
    assert "user=bob" in got[0]["pair"]


def test_a_stdlib_message_with_a_token_is_masked() -> None:
    out = io.StringIO()
    logs.configure("gateway", stream=out, fmt="json", env={})
    import logging

    logging.getLogger("nio.responses").warning("got {'access_token': 'syt_secretvalue_x'}")
    assert "syt_secretvalue" not in out.getvalue() and "access_token" in out.getvalue()


def test_a_password_holding_an_unencoded_at_sign_is_masked_whole() -> None:
    from contract.logs import mask_text

    assert mask_text("redis://:PW@SECRET6@127.0.0.1:1") == "redis://:***@127.0.0.1:1"
    assert "pw" not in mask_text("rediss://u:pw@h:1/0 then http://x:y@z/")


def test_a_message_about_a_secret_key_keeps_its_words() -> None:
    """issue 26: "model.api_key: Input should be a valid string" was logged as "model.api_key:
    *** should be ...": a validation message names the key, it does not hold its value."""
    from contract.logs import mask_text

    for text in (
        "/h/config.toml: model.api_key: Input should be a valid string",
        "matrix.password: Field required",
        "email.smtp_password: Extra inputs are not permitted",
    ):
        assert mask_text(text) == text
    got = lines(e={"error": "model.api_key: Input should be a valid string", "max_tokens": 512})
    assert got[0]["error"] == "model.api_key: Input should be a valid string"
    assert got[0]["max_tokens"] == 512  # a count of tokens is not a token
    assert mask_text("usage prompt_tokens=40 max_tokens: 512") == (
        "usage prompt_tokens=40 max_tokens: 512"
    )


def test_real_secrets_next_to_the_words_are_still_masked() -> None:
    from contract.logs import mask_text

    # a value runs to the end of the line (a passphrase holds spaces), or to the next key
    assert mask_text("password: Hunter2 was refused") == "password: ***"
    assert mask_text("password=Summer rain") == "password=***"
    assert mask_text("token: abc123, api_key: Sk-live") == "token: ***, api_key: ***"
    assert mask_text("access_token=syt_abcdefghij tokens_used=4") == (
        "access_token=*** tokens_used=4"
    )
    got = lines(f={"access_token": "syt_x", "api_key": "Input"})
    assert got[0]["access_token"] == "***" and got[0]["api_key"] == "***"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("password: Abc def", "password: ***"),
        ("smtp_password: Correct horse battery", "smtp_password: ***"),
        ("login password=correct horse battery user=bob", "login password=*** user=bob"),
        ("smtp_password: Correct horse; next: x", "smtp_password: ***; next: x"),
        ("password: Hunter2\nnext line", "password: ***\nnext line"),
        ("asked https://gw/v1?key=QKEY123 for it", "asked https://gw/v1?key=*** for it"),
        ("GET https://h/p?a=1&QKEY#access_token=T0K", "GET https://h/p?a=***&***#access_token=***"),
        (
            "see https://docs.example.org/x.html#anchor",
            "see https://docs.example.org/x.html#anchor",
        ),
        (
            "to redis://relay:pw@h:1/0?ssl_cert_reqs=none",
            "to redis://relay:***@h:1/0?ssl_cert_reqs=***",
        ),
    ],
)
def test_passphrases_and_url_queries_are_masked(text: str, masked: str) -> None:
    """issue 26: a passphrase with spaces after a secret-named key, and a URL's query in free
    text, were left as they were."""
    assert logs.mask_text(text) == masked


def _pydantic_messages() -> list[str]:
    """Every message template of the installed pydantic-core, its placeholders filled."""
    from pydantic_core._pydantic_core import list_all_errors

    return sorted(
        {
            re.sub(r"\{(\w+)\}", lambda m: "List" if m[1] == "field_type" else "x1", e[key])
            for e in list_all_errors()
            for key in ("message_template_python", "message_template_json")
            if key in e
        }
    )


@pytest.mark.parametrize("message", _pydantic_messages())
def test_pydantic_own_words_after_a_secret_key_stay(message: str) -> None:
    """The openings kept are pydantic's real ones: each of its messages after "loc: " is kept,
    a value of the same key that is not one is masked."""
    text = f"email.smtp_password: {message}"
    assert logs.mask_text(text) == text
    assert any(message.startswith(o) for o in logs.PYDANTIC_OPENINGS) or " should have at " in (
        message
    )


_WORD = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cc", "Cs", "Z"), exclude_characters=",;]}=\"'"
    ),
    min_size=1,
    max_size=12,
)


@given(words=st.lists(_WORD, min_size=1, max_size=5), key=st.sampled_from(
    ["password", "smtp_password", "api_key", "matrix.access_token", "client_secret"]
))  # fmt: skip
def test_any_passphrase_after_a_secret_key_is_masked(words: list[str], key: str) -> None:
    value = " ".join(words)
    assume(not any(value.startswith(o) for o in logs.PYDANTIC_OPENINGS))
    assume(re.match(r"[A-Z][a-z]+ should have at", value) is None)
    for sep in (": ", "="):
        assert logs.mask_text(f"{key}{sep}{value}") == f"{key}{sep}***"


@given(value=st.text(alphabet=st.characters(codec="ascii", categories=("L", "N")), min_size=4))
def test_any_url_query_value_is_masked(value: str) -> None:
    text = logs.mask_text(f"calling https://gw.example.org/v1?key={value}&v=2 now")
    assert text == "calling https://gw.example.org/v1?key=***&v=*** now"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("X-Api-Key: SECRETXAPI", "SECRETXAPI"),
        ("Cookie: session=v123abc", "v123abc"),
        ("pwd: hunter2", "hunter2"),
        ("the key sk-abcdefghijklmnopqrstu leaked", "sk-abcdefghijklmnopqrstu"),
        ("xoxb-1234567890-abcdef", "xoxb-1234567890-abcdef"),
        ("ghp_abcdefghijklmnopqrstuvwx12", "ghp_abcdefghijklmnopqrstuvwx12"),
    ],
)
def test_header_names_and_well_known_key_shapes_are_masked(text: str, secret: str) -> None:
    """The second review: X-Api-Key (a hyphen), Cookie, pwd and bare sk-/xoxb- keys showed in
    status's failed-job reasons."""
    assert secret not in logs.mask_text(text)


def test_a_masked_query_does_not_swallow_the_words_after_it() -> None:
    assert logs.mask_text("GET https://x/cb?token=S&x=1 failed") == (
        "GET https://x/cb?token=***&x=*** failed"
    )
