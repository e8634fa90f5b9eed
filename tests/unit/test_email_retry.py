"""What an SMTP failure means for a reply (retried or failed), and the reply window that gives an
auto-responder storm one reply: pure rules, and the window's state on fakeredis."""

from __future__ import annotations

import aiosmtplib
import fakeredis
import pytest

from contract.keys import Keys
from gateways.email.smtp import permanent
from gateways.email.state import MailState


def refused(*codes: int) -> aiosmtplib.SMTPRecipientsRefused:
    return aiosmtplib.SMTPRecipientsRefused(
        [aiosmtplib.SMTPRecipientRefused(c, "refused", f"r{i}@x") for i, c in enumerate(codes)]
    )


@pytest.mark.parametrize(
    ("exc", "for_good"),
    [
        (refused(451), False),  # greylisting at RCPT TO
        (refused(450, 550), False),  # one recipient may pass later: try again
        (refused(550, 553), True),
        (aiosmtplib.SMTPSenderRefused(421, "shutting down", "bot@x"), False),
        (aiosmtplib.SMTPSenderRefused(553, "not allowed", "bot@x"), True),
        (aiosmtplib.SMTPDataError(452, "out of storage"), False),
        (aiosmtplib.SMTPDataError(554, "rejected as spam"), True),
        (aiosmtplib.SMTPServerDisconnected("lost"), False),
        (aiosmtplib.SMTPTimeoutError("slow"), False),
        (ConnectionRefusedError(), False),
    ],
)
def test_only_a_5xx_refuses_a_mail_for_good(exc: BaseException, for_good: bool) -> None:
    assert permanent(exc) is for_good


def test_the_reply_window_remembers_who_was_sent_which_message_id() -> None:
    r = fakeredis.FakeRedis()
    state = MailState(r, Keys("rb:"), "INBOX")
    state.note_answered(["peer@example.com"], ["<root@x>", "<relaybot.r1@bot>"], window=600)
    assert state.recently_answered(["peer@example.com"], ["<relaybot.r1@bot>"])
    assert state.recently_answered(["PEER@example.com", "other@x"], ["<other@x>", "<root@x>"])
    # whoever answers within the window is held (an auto-responder may answer from an alias)
    assert state.recently_answered(["other@example.com"], ["<relaybot.r1@bot>"])
    assert not state.recently_answered(["peer@example.com"], ["<another-thread@x>"])
    ttls = {r.ttl(k) for k in r.keys("rb:email:rate:replied:*")}
    assert ttls and all(590 < t <= 600 for t in ttls)  # Redis keeps the time: one clock


def test_a_window_of_zero_is_off() -> None:
    r = fakeredis.FakeRedis()
    state = MailState(r, Keys("rb:"), "INBOX")
    state.note_answered(["peer@example.com"], ["<root@x>"], window=0)
    assert not state.recently_answered(["peer@example.com"], ["<root@x>"])
