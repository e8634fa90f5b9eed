"""No secret reaches a log line: values of secret-looking keys and passwords inside URLs are
replaced before rendering (contract/logs.py), on every line, not only the first of a key."""

from __future__ import annotations

import io
import json

import structlog

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
