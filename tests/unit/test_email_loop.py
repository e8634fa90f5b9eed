"""The loop guard (RFC 3834 and practice) over raw mails: what relaybot never answers.

Each case is the raw bytes of a mail as it arrives (a real DSN, an MDN, an out-of-office reply,
list mail, robots), parsed by ``gateways.email.parse.parse_email``: a guarded mail is a
``Rejected`` (not published, left unread, logged as ``email.ignored``), never a dead letter.
"""

from __future__ import annotations

import pytest

from gateways.email.parse import Accepted, Addresses, Rejected, parse_email

ADDRS = Addresses(
    own=frozenset({"bot@example.org"}),
    owner=frozenset({"owner@example.org"}),
    allow=frozenset({"@example.com"}),
    trust_mailbox=True,
)


def mail(*headers: str, sender: str = "peer@example.com", body: str = "hello") -> bytes:
    top = [
        f"From: Someone <{sender}>",
        "To: bot@example.org",
        "Subject: hello",
        "Message-ID: <m1@example.com>",
        "Date: Tue, 24 Nov 2026 09:00:00 +0000",
    ]
    names = {h.split(":", 1)[0].lower() for h in headers}
    top = [h for h in top if h.split(":", 1)[0].lower() not in names]
    text = "\r\n".join([*headers, *top])
    if not any(h.lower().startswith("content-type:") for h in headers):
        text += "\r\nContent-Type: text/plain; charset=utf-8"
    return f"{text}\r\n\r\n{body}\r\n".encode()


DSN = (
    b"Return-Path: <>\r\n"
    b"From: Mail Delivery System <mailer-daemon@mx.example.com>\r\n"
    b"To: bot@example.org\r\n"
    b"Subject: Undelivered Mail Returned to Sender\r\n"
    b"Message-ID: <dsn1@mx.example.com>\r\n"
    b"MIME-Version: 1.0\r\n"
    b'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n'
    b"\r\n--B\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
    b"--B\r\nContent-Type: message/delivery-status\r\n\r\n"
    b"Reporting-MTA: dns; mx.example.com\r\n\r\nFinal-Recipient: rfc822; gone@example.com\r\n"
    b"Action: failed\r\nStatus: 5.1.1\r\n--B--\r\n"
)


def report(sender: str, report_type: str) -> bytes:
    """A multipart/report from an ordinary-looking sender (an MDN comes from a person's MUA)."""
    return (
        f"From: {sender}\r\nTo: bot@example.org\r\nSubject: Read: hello\r\n"
        "Message-ID: <mdn1@example.com>\r\nMIME-Version: 1.0\r\n"
        f'Content-Type: multipart/report; report-type={report_type}; boundary="B"\r\n'
        "\r\n--B\r\nContent-Type: text/plain\r\n\r\nYour message was displayed.\r\n"
        "--B\r\nContent-Type: message/disposition-notification\r\n\r\n"
        "Disposition: manual-action/MDN-sent-manually; displayed\r\n--B--\r\n"
    ).encode()


GUARDED = {
    "null Return-Path (a bounce)": mail("Return-Path: <>"),
    "null Return-Path with spaces": mail("Return-Path:   < >"),
    "a DSN": DSN,
    "an MDN (read receipt) from a person": report("peer@example.com", "disposition-notification"),
    "Precedence: bulk": mail("Precedence: bulk"),
    "Precedence: junk": mail("Precedence: junk"),
    "Precedence: list": mail("Precedence: list"),
    "Precedence: auto_reply": mail("Precedence: auto_reply"),
    "Precedence: Auto_Reply (any case)": mail("Precedence: Auto_Reply"),
    "Auto-Submitted: auto-replied": mail("Auto-Submitted: auto-replied"),
    "Auto-Submitted: auto-generated": mail("Auto-Submitted: auto-generated"),
    "Auto-Submitted: auto-notified (any value but no)": mail("Auto-Submitted: auto-notified"),
    "X-Autoreply": mail("X-Autoreply: yes"),
    "X-Autorespond": mail("X-Autorespond: Out of office"),
    "X-Auto-Response (some MTAs)": mail("X-AutoReply-From: peer@example.com", "X-Autoreply: 1"),
    "X-Auto-Response-Suppress: All": mail("X-Auto-Response-Suppress: All"),
    "X-Auto-Response-Suppress: DR, OOF, AutoReply": mail(
        "X-Auto-Response-Suppress: DR, OOF, AutoReply"
    ),
    "List-Id": mail("List-Id: Friends <friends.lists.example.com>"),
    "List-Unsubscribe": mail("List-Unsubscribe: <mailto:leave@lists.example.com>"),
    "from MAILER-DAEMON": mail(sender="MAILER-DAEMON@mx.example.com"),
    "from postmaster": mail(sender="postmaster@example.com"),
    "from noreply": mail(sender="noreply@example.com"),
    "from no-reply": mail(sender="no-reply@service.example.com"),
    "from no_reply": mail(sender="no_reply@service.example.com"),
    "from donotreply": mail(sender="donotreply@service.example.com"),
    "from do-not-reply": mail(sender="do-not-reply@service.example.com"),
    "from noreply+tag": mail(sender="noreply+alerts@service.example.com"),
    "From: relaybot itself": mail(sender="bot@example.org"),
    "From: relaybot itself, other case": mail(sender="Bot@Example.ORG"),
    "Reply-To: relaybot itself": mail("Reply-To: <bot@example.org>"),
    "Reply-To: relaybot among others": mail("Reply-To: peer@example.com, bot@example.org"),
    "a Message-ID relaybot made": mail("Message-ID: <relaybot.abc123@example.org>"),
}


@pytest.mark.parametrize("raw", list(GUARDED.values()), ids=list(GUARDED))
def test_guarded_mail_is_never_answered(raw: bytes) -> None:
    result = parse_email(raw, ADDRS, 1.0)
    assert isinstance(result, Rejected), result
    assert not result.dead  # ignored with a log line, not a dead letter
    assert result.reason


ANSWERED = {
    "a plain mail": mail(),
    "Auto-Submitted: no": mail("Auto-Submitted: no"),
    "Auto-Submitted: no with a comment": mail("Auto-Submitted: no (a person wrote this)"),
    "Precedence: first-class": mail("Precedence: first-class"),
    "X-Auto-Response-Suppress: DR, RN (receipts only)": mail("X-Auto-Response-Suppress: DR, RN"),
    "a normal Return-Path": mail("Return-Path: <peer@example.com>"),
    "a sender whose name merely contains noreply": mail(sender="noreplyingfan@example.com"),
    "multipart/mixed with an attachment": (
        b"From: peer@example.com\r\nTo: bot@example.org\r\nSubject: s\r\n"
        b'Message-ID: <mx@example.com>\r\nContent-Type: multipart/mixed; boundary="B"\r\n\r\n'
        b"--B\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n"
        b"--B\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; "
        b'filename="a.pdf"\r\n\r\nxx\r\n--B--\r\n'
    ),
}


@pytest.mark.parametrize("raw", list(ANSWERED.values()), ids=list(ANSWERED))
def test_ordinary_mail_passes_the_guard(raw: bytes) -> None:
    result = parse_email(raw, ADDRS, 1.0)
    assert isinstance(result, Accepted), result
    assert "no_reply" not in result.message.extra
