"""Reply content for Matrix (pure) and the gateway's policy from the config."""

from __future__ import annotations

from pathlib import Path

from contract.config import Config
from gateways.matrix.events import GroupPolicy
from gateways.matrix.gateway import build_policy
from gateways.matrix.render import reply_content, to_html
from gateways.runner import Backoff


def test_markdown_is_sanitized_html() -> None:
    html = to_html("**bold** <script>alert(1)</script> [x](javascript:alert(1)) `code`")
    assert "<strong>bold</strong>" in html
    assert "<code>code</code>" in html
    assert "<script" not in html
    assert "javascript:" not in html


def test_a_reply_to_the_answered_event() -> None:
    content = reply_content("hi *there*", "$asked", None)
    assert content["body"] == "hi *there*"
    assert content["format"] == "org.matrix.custom.html"
    assert content["formatted_body"] == "<p>hi <em>there</em></p>"
    assert content["m.relates_to"] == {"m.in_reply_to": {"event_id": "$asked"}}
    assert content["msgtype"] == "m.text"
    assert content["m.mentions"] == {}


def test_a_reply_stays_in_its_thread() -> None:
    rel = reply_content("ok", "$asked", "$root")["m.relates_to"]
    assert rel == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": False,
        "m.in_reply_to": {"event_id": "$asked"},
    }
    assert "m.relates_to" not in reply_content("ok", None, None)


def test_policy_from_config(tmp_path: Path) -> None:
    cfg = Config.model_validate(
        {
            "home": tmp_path,
            "owner": {
                "aliases": [
                    "@ada:example.org",
                    {"address": "@ada:other.org", "channel": "matrix"},
                    {"address": "@not:email.org", "channel": "email"},
                    "ada@example.org",
                ]
            },
            "matrix": {
                "homeserver": "https://example.org",
                "user_id": "@bot:example.org",
                "allowlist": ["@bob:example.org"],
                "group_policy": "open",
                "rooms": {"!r:example.org": {"policy": "allowlist", "allowlist": ["@c:x"]}},
            },
        }
    )
    policy = build_policy(cfg, "@bot:example.org")
    assert policy.owners == {"@ada:example.org", "@ada:other.org"}
    assert policy.may_invite("@bob:example.org")
    assert not policy.may_invite("@eve:example.org")
    assert policy.room_policy("!r:example.org") == (GroupPolicy.ALLOWLIST, frozenset({"@c:x"}))
    assert policy.room_policy("!other:example.org")[0] == GroupPolicy.OPEN
    assert "bot" in policy.own_names


def test_backoff_doubles_up_to_a_cap() -> None:
    b = Backoff()
    delays = [b.next() for _ in range(9)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(delays) == 60.0
    b.reset()
    assert b.next() == 1.0
