"""The e-mail normalizer and composer: pure functions, recorded and malformed messages."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

import pytest

from contract.messages import InboundMessage, Privacy, Reply
from gateways.email.compose import compose_reply, re_subject, reply_message_id
from gateways.email.parse import (
    MAX_BODY_CHARS,
    Accepted,
    Addresses,
    Headers,
    Rejected,
    audience_key,
    parse_email,
    thread_key,
)
from tests.support.mailcorpus import corpus
from tests.support.mailservers import make_message

ADDRS = Addresses(
    own=frozenset({"bot@example.org"}),
    owner=frozenset({"owner@example.org", "me@home.example"}),
    allow=frozenset({"friend@example.com", "@trusted.example"}),
    trust_mailbox=True,  # these tests are about threads and classes; tests/unit/test_email_auth.py
)
OWNER_ONLY = audience_key(["owner@example.org"])


def raw(msg: EmailMessage) -> bytes:
    return msg.as_bytes(policy=email.policy.SMTP)


def accepted(data: bytes) -> Accepted:
    result = parse_email(data, ADDRS, 1000.0)
    assert isinstance(result, Accepted), result
    # what the gateway XADDs round-trips through the wire contract
    InboundMessage.from_fields(result.message.to_fields())
    return result


def test_new_message_starts_its_own_thread() -> None:
    got = accepted(raw(make_message(message_id="<root-1@example.org>", subject="Plans")))
    msg = got.message
    assert msg.channel == "email"
    assert msg.session == msg.conversation == f"email:root-1@example.org/{OWNER_ONLY}"
    assert msg.event_id == "<root-1@example.org>"
    assert msg.sender == "owner@example.org"
    assert msg.privacy is Privacy.OWNER
    assert msg.text.startswith("Subject: Plans\n\nhi there")
    assert got.headers.references == []


def test_follow_up_joins_the_root_thread() -> None:
    got = accepted(
        raw(
            make_message(
                message_id="<c@example.org>",
                in_reply_to="<b@example.org>",
                references="<root-1@example.org> <b@example.org>",
            )
        )
    )
    assert got.message.session == f"email:root-1@example.org/{OWNER_ONLY}"
    assert got.headers.references == ["<root-1@example.org>", "<b@example.org>"]
    only_irt = accepted(raw(make_message(message_id="<d@x>", in_reply_to="<root-1@example.org>")))
    assert only_irt.message.session == f"email:root-1@example.org/{OWNER_ONLY}"


def test_odd_message_ids_become_safe_routing_keys() -> None:
    key = thread_key("<weird id with spaces & {braces}@x>")
    assert key.startswith("h") and len(key) == 33
    assert thread_key("<ok.id-1@host>") == "ok.id-1@host"


@pytest.mark.parametrize(
    ("sender", "to", "cc", "privacy"),
    [
        ("owner@example.org", "bot@example.org", None, Privacy.OWNER),
        ("owner@example.org", "bot@example.org", "me@home.example", Privacy.OWNER),
        ("friend@example.com", "bot@example.org", None, Privacy.DIRECT),
        ("owner@example.org", "bot@example.org, friend@example.com", None, Privacy.DIRECT),
        ("friend@example.com", "bot@example.org", "x@trusted.example", Privacy.GROUP),
    ],
)
def test_privacy_from_the_people_in_the_thread(
    sender: str, to: str, cc: str | None, privacy: Privacy
) -> None:
    got = accepted(raw(make_message(sender=sender, to=to, cc=cc, message_id="<p@x>")))
    assert got.message.privacy is privacy


@pytest.mark.parametrize(
    ("headers", "sender"),
    [
        ({"Auto-Submitted": "auto-replied"}, "owner@example.org"),
        ({"Auto-Submitted": "auto-generated"}, "owner@example.org"),
        ({"Precedence": "bulk"}, "owner@example.org"),
        ({"Precedence": "list"}, "owner@example.org"),
        ({"Precedence": "junk"}, "owner@example.org"),
        ({"List-Id": "<list.example.org>"}, "owner@example.org"),
        ({}, "MAILER-DAEMON@example.org"),
        ({}, "postmaster@example.org"),
        ({}, "bot@example.org"),
    ],
)
def test_loop_guard(headers: dict[str, str], sender: str) -> None:
    msg = make_message(sender=sender, message_id="<g@x>", headers=headers)
    result = parse_email(raw(msg), ADDRS, 1.0)
    assert isinstance(result, Rejected) and not result.dead


def test_loop_guard_knows_its_own_message_ids_and_lets_auto_submitted_no_through() -> None:
    ours = make_message(message_id=reply_message_id("abc", "example.org"))
    assert isinstance(parse_email(raw(ours), ADDRS, 1.0), Rejected)
    human = make_message(message_id="<h@x>", headers={"Auto-Submitted": "no"})
    assert isinstance(parse_email(raw(human), ADDRS, 1.0), Accepted)


def test_allowlist() -> None:
    stranger = make_message(sender="stranger@evil.example", message_id="<s@x>")
    result = parse_email(raw(stranger), ADDRS, 1.0)
    assert isinstance(result, Accepted)  # recorded in memory, but not answered:
    assert result.message.extra["no_reply"] == "sender not on the allowlist"
    for sender in ("friend@example.com", "anyone@trusted.example", "ME@home.example"):
        accepted(raw(make_message(sender=sender, message_id="<a@x>")))
    for sender in ("friend@example.com", "anyone@trusted.example", "ME@home.example"):
        ok = parse_email(raw(make_message(sender=sender, message_id="<a@x>")), ADDRS, 1.0)
        assert isinstance(ok, Accepted) and "no_reply" not in ok.message.extra
    open_door = Addresses(own=ADDRS.own, owner=ADDRS.owner, allow_all=True, trust_mailbox=True)
    opened = parse_email(raw(stranger), open_door, 1.0)
    assert isinstance(opened, Accepted) and "no_reply" not in opened.message.extra


def test_unparseable_is_a_dead_letter_value() -> None:
    for data in (b"", b"   \r\n", b"no headers at all, no from"):
        result = parse_email(data, ADDRS, 1.0)
        assert isinstance(result, Rejected) and result.dead


def test_malformed_corpus_parses_without_exceptions() -> None:
    messages = corpus()
    assert len(messages) >= 20
    for name, data in messages.items():
        result = parse_email(data, ADDRS, 1.0)
        assert isinstance(result, Accepted), (name, result)
        InboundMessage.from_fields(result.message.to_fields())
    huge = accepted(messages["huge-body"]).message.text
    assert len(huge) < MAX_BODY_CHARS + 200 and "[truncated by relaybot" in huge
    html = accepted(messages["html-only"]).message.text
    assert "Hello there" in html and "alert" not in html and "<p>" not in html
    attached = accepted(messages["attachment"]).message
    assert attached.extra["attachments"] == [
        {"name": "pic.png", "type": "image/png", "size": 102404}
    ]
    assert "pic.png (image/png, 102404 bytes)" in attached.text
    assert "caça va" in accepted(messages["latin1"]).message.text
    assert "part" in accepted(messages["no-boundary"]).message.text


def _reply(text: str = "**Yes**, see you\n\n- one\n- two") -> Reply:
    return Reply(
        reply_id="r123",
        answers="1-0",
        channel="email",
        session="email:root@x",
        conversation="email:root@x",
        in_reply_to="<b@x>",
        text=text,
        created=1.0,
    )


def test_compose_threads_the_reply() -> None:
    original = Headers(
        message_id="<b@x>",
        references=["<root@x>", "<a@x>"],
        subject="Re: RE: Plans",
        sender="owner@example.org",
        to=["bot@example.org", "friend@example.com"],
        cc=["other@example.com", "owner@example.org"],
    )
    own = frozenset({"bot@example.org"})
    msg = compose_reply(_reply(), original, sender="bot@example.org", own=own, now=1.7e9)
    assert msg["In-Reply-To"] == "<b@x>"
    assert msg["References"] == "<root@x> <a@x> <b@x>"
    assert msg["Subject"] == "Re: Plans"
    assert msg["Message-ID"] == "<relaybot.r123@example.org>"
    assert msg["Auto-Submitted"] == "auto-replied"
    assert msg["To"] == "owner@example.org"
    assert msg["Cc"] == "friend@example.com, other@example.com"
    assert msg["Date"]
    assert msg.get_content_type() == "multipart/alternative"
    plain = msg.get_body(("plain",))
    html = msg.get_body(("html",))
    assert plain is not None and "**Yes**" in plain.get_content()
    assert html is not None and "<strong>Yes</strong>" in html.get_content()
    again = email.message_from_bytes(raw(msg), policy=email.policy.default)
    assert again["Message-ID"] == msg["Message-ID"]


def test_compose_sanitizes_html_and_subjects() -> None:
    original = Headers("<b@x>", [], "", "owner@example.org", [], [])
    msg = compose_reply(
        _reply("<script>x()</script> hi"),
        original,
        sender="bot@example.org",
        own=frozenset(),
        now=1.0,
    )
    html = msg.get_body(("html",))
    assert html is not None and "<script>" not in html.get_content()
    assert msg["Subject"] == "Re: your message"
    assert re_subject("Aw: Re[2]: hello") == "Re: hello"
    assert re_subject("hello") == "Re: hello"
