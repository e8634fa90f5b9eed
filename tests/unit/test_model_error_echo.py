"""A model server's error that quotes the request (worker/openai_parse.hide_echo): never shown."""

from __future__ import annotations

import json

import pytest

from worker.openai_parse import ECHOED, hide_echo

PROMPT = "You are relaybot, the owner's assistant. Answer briefly."


@pytest.mark.parametrize(
    "message",
    [
        "pin 4711\nacct 99812\niban 55",  # every line shorter than the window (the review's)
        "mot de passe: héllo wörld ça",
        "Kontonummer 12345678901 geheim",
        "tab\tseparated\tvalues\tof mine",
        "a\u2028line\u2029separator and \U0001f600 emoji text",
    ],
)
@pytest.mark.parametrize(
    "quote",
    [
        lambda m: m,  # as it is
        json.dumps,  # JSON-escaped, as an API error body carries it
        lambda m: json.dumps(m, ensure_ascii=False),
        repr,  # a Python server's repr
        lambda m: m.upper(),
    ],
)
def test_an_error_quoting_the_message_in_any_form_is_hidden(message, quote) -> None:
    detail = f"400 Bad Request: Input should be shorter: {quote(message)}"
    shown = hide_echo(detail, [PROMPT, message], keep="Bad Request")
    assert shown == f"400 Bad Request{ECHOED}"


def test_an_error_that_quotes_nothing_is_shown_whole() -> None:
    detail = "400 Bad Request: This model's maximum context length is 8192 tokens"
    assert hide_echo(detail, [PROMPT, "pin 4711\nacct 99812"], keep="Bad Request") == detail


def test_a_short_request_shares_words_with_an_error_without_hiding_it() -> None:
    # "[[status:400]]" has the letters of "scripted status 400", not its text (CI caught it)
    detail = "400 Bad Request: scripted status 400"
    assert hide_echo(detail, ["[[status:400]]"], keep="Bad Request") == detail
    assert hide_echo("401: wrong key", ["the key"], keep="401") == "401: wrong key"
