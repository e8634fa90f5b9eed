"""Issue 24, items 8 and 4 (the e-mail half), in the pure parts: who a reply goes to (every
address of To and Cc its own SMTP recipient; a Bcc answered to the sender alone), mailing lists
(a group, never one person), and the recheck of a reply's recipients against the audience it was
written for."""

from __future__ import annotations

import email.policy
from email.message import EmailMessage

import pytest

from contract.messages import Privacy, Reply
from gateways.email.audience import (
    handle_address,
    list_addresses,
    stored_audience,
    withheld,
    written_for,
)
from gateways.email.compose import compose_reply, envelope
from gateways.email.parse import Accepted, Addresses, Headers, Rejected, parse_email, with_lists
from tests.support.mailservers import make_message

OWNER, BOT, PEER, CAROL = "owner@example.org", "bot@example.org", "peer@example.com", "c@x.net"
LIST = "dev@lists.example.net"
ADDRS = Addresses(
    own=frozenset({BOT}),
    owner=frozenset({OWNER}),
    allow=frozenset({PEER}),
    allow_all=True,
    trust_mailbox=True,  # who the sender is is not the question here (test_email_auth.py is)
)


def parse(msg: EmailMessage, addrs: Addresses = ADDRS) -> Accepted | Rejected:
    return parse_email(msg.as_bytes(policy=email.policy.SMTP), addrs, 1.0)


def accepted(msg: EmailMessage, addrs: Addresses = ADDRS) -> Accepted:
    got = parse(msg, addrs)
    assert isinstance(got, Accepted), got
    return got


# -- SMTP recipients -------------------------------------------------------------------------------


def test_every_address_of_to_and_cc_is_its_own_recipient() -> None:
    """A reply to a mail with several Cc addresses: one SMTP recipient each (the header string
    "a, b" was handed to SMTP as one recipient, RCPT TO:<a, b>)."""
    got = accepted(make_message(message_id="<m1@x>", cc=f'"Peer, P." <{PEER}>, Carol <{CAROL}>'))
    reply = Reply(reply_id="r1", answers="email/1-0", channel="email", session="email:s",
                  conversation="email:s", in_reply_to="<m1@x>", text="hi", created=1.0)  # fmt: skip
    msg = compose_reply(reply, got.headers, sender=BOT, own=ADDRS.own, now=1.0)
    assert envelope(msg) == [OWNER, PEER, CAROL]


# -- Bcc -------------------------------------------------------------------------------------------


def test_a_bcc_is_answered_to_the_sender_alone_and_its_audience_is_the_sender() -> None:
    got = accepted(make_message(message_id="<m2@x>", to=PEER, cc=CAROL))
    msg = got.message
    assert msg.extra["audience"] == [OWNER] and msg.privacy is Privacy.OWNER
    reply = Reply(reply_id="r2", answers="email/1-0", channel="email", session=msg.session,
                  conversation=msg.conversation, in_reply_to="<m2@x>", text="hi",
                  created=1.0)  # fmt: skip
    assert envelope(compose_reply(reply, got.headers, sender=BOT, own=ADDRS.own, now=1.0)) == [
        OWNER
    ]
    # with a Reply-To, the reply goes there: the audience is the From and the Reply-To
    other = accepted(make_message(message_id="<m3@x>", to=PEER, headers={"Reply-To": CAROL}))
    assert other.message.extra["audience"] == sorted([OWNER, CAROL])
    assert other.message.privacy is Privacy.DIRECT
    assert (other.headers.sender, other.headers.to, other.headers.cc) == (CAROL, [], [])


# -- mailing lists ---------------------------------------------------------------------------------


def test_a_list_named_by_the_mails_own_list_post_makes_a_group() -> None:
    """The owner and a list: not a direct conversation with one person."""
    got = accepted(
        make_message(message_id="<m4@x>", cc=LIST, headers={"List-Post": f"<mailto:{LIST}>"})
    )
    assert got.message.privacy is Privacy.GROUP
    assert got.message.extra["lists"] == [LIST] and got.lists_seen == {LIST}


def test_a_configured_list_makes_a_group() -> None:
    addrs = Addresses(own=ADDRS.own, owner=ADDRS.owner, trust_mailbox=True, lists=frozenset({LIST}))
    assert accepted(make_message(message_id="<m5@x>", cc=LIST), addrs).message.privacy is (
        Privacy.GROUP
    )
    # a list the bot was not addressed beside (a Bcc): the reply reaches the sender alone
    bcc = accepted(make_message(message_id="<m6@x>", to=LIST), addrs).message
    assert bcc.privacy is Privacy.OWNER and bcc.extra["audience"] == [OWNER]


def test_list_mail_is_ignored_but_its_list_is_learned_and_makes_later_mail_a_group() -> None:
    """Mail through a list (List-Id) is not answered (the loop guard); its list address is
    learned (the gateway keeps it in Redis), and a later mail that copies the list is a group."""
    through = parse(
        make_message(sender=PEER, message_id="<l1@x>", to=LIST,
                     headers={"List-Id": "Developers <dev.lists.example.net>"})
    )  # fmt: skip
    assert isinstance(through, Rejected) and through.lists_seen == {LIST}
    later = accepted(make_message(message_id="<m7@x>", cc=LIST))
    assert later.message.privacy is Privacy.DIRECT  # nothing in this mail says it is a list
    grouped = with_lists(later, {LIST}).message
    assert grouped.privacy is Privacy.GROUP and grouped.extra["lists"] == [LIST]
    assert grouped.conversation == later.message.conversation
    assert with_lists(later, {"other@x.org"}) is later


def test_list_headers_cannot_make_the_owner_relaybot_or_an_allowlisted_person_a_list() -> None:
    """A forged List-Post naming the owner (or relaybot, or a person the owner allowlisted):
    the owner's own conversations would become groups."""
    for who in (OWNER, BOT, PEER):
        got = parse(make_message(message_id=f"<f-{who}>", headers={"List-Post": f"<mailto:{who}>"}))
        assert got.lists_seen == frozenset(), who
    headers = {"List-Post": "<mailto:A@L.org?subject=x>, <https://l.org>", "List-Id": "x <b.l.org>"}
    assert list_addresses(lambda name: headers.get(name, "")) == {"a@l.org", "b@l.org"}


# -- the recheck before sending --------------------------------------------------------------------


def test_recipients_outside_the_audience_are_withheld() -> None:
    own = frozenset({BOT})
    audience = written_for({"audience": [f"{OWNER} (unverified)"]})
    assert audience == {OWNER}  # an unverified sender's handle stands for its address
    assert withheld([OWNER, BOT, PEER, "Peer@Example.com"], audience, own) == [PEER]
    assert withheld(["OWNER@example.org"], audience, own) == []
    assert written_for({}) is None  # an older worker: the caller recomputes
    for bad in ("owner@example.org", [1], {"a": 1}, None):
        with pytest.raises(ValueError, match="not a list"):
            written_for({"audience": bad})
    stored = Headers("<m@x>", [], "", sender=CAROL, to=[PEER], cc=[BOT], author=OWNER)
    assert stored_audience(stored.author, stored.sender, stored.to, stored.cc, own) == {
        OWNER,
        CAROL,
        PEER,
    }
    assert handle_address(" Owner@Example.org (unverified) ") == OWNER


def test_several_to_and_cc_headers_all_count() -> None:
    """Found by the adversarial review: with two To (or Cc) headers only the first was read,
    and the people of the second were outside the audience although they got the mail."""
    raw = make_message(message_id="<m9@x>", to=BOT).as_bytes(policy=email.policy.SMTP)
    head, _sep, body = raw.partition(b"\r\n\r\n")
    extra = f"\r\nTo: {PEER}\r\nCc: {CAROL}\r\nCc: d@x.net".encode()
    got = parse_email(head + extra + b"\r\n\r\n" + body, ADDRS, 1.0)
    assert isinstance(got, Accepted), got
    assert {PEER, CAROL, "d@x.net"} <= set(got.message.extra["audience"])
    assert got.message.privacy is Privacy.GROUP
