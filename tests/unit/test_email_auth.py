"""Who sent a mail is established, not claimed (issue 10, cases 1-3 and 5, in the pure parser):
Authentication-Results from a trusted authserv-id, aligned with the From domain; an unverified
sender is nobody we know; a thread is one conversation per audience."""

from __future__ import annotations

import email.policy
from email.message import EmailMessage

import pytest

from contract.messages import Privacy
from gateways.audience import audience_key
from gateways.email.auth import aligned, authenticate
from gateways.email.parse import Accepted, Addresses, parse_email
from tests.support.mailservers import make_message

OWNER, BOB, CAROL, EVE, BOT = (
    "owner@home.example",
    "bob@friends.example",
    "carol@friends.example",
    "eve@evil.example",
    "bot@home.example",
)
ADDRS = Addresses(
    own=frozenset({BOT}),
    owner=frozenset({OWNER}),
    allow=frozenset({BOB, CAROL}),
    trusted_ids=frozenset({"mx.home.example"}),
)


def passed(domain: str, method: str = "dkim") -> str:
    if method == "dmarc":
        return f"mx.home.example; dmarc=pass (p=reject) header.from={domain}"
    if method == "spf":
        return f"mx.home.example; spf=pass smtp.mailfrom=bounce@{domain}"
    return f"mx.home.example; dkim=pass (2048-bit key) header.d={domain} header.s=sel"


def parse(msg: EmailMessage, addrs: Addresses = ADDRS) -> Accepted:
    got = parse_email(msg.as_bytes(policy=email.policy.SMTP), addrs, 1.0)
    assert isinstance(got, Accepted), got
    return got


def mail(sender: str, auth: list[str] | None = None, **kw: str) -> EmailMessage:
    msg = make_message(sender=sender, to=kw.pop("to", BOT), message_id=kw.pop("mid", "<m@x>"), **kw)
    for value in reversed(auth or []):  # the receiving server puts its header on top
        msg._headers.insert(0, ("Authentication-Results", value))
    return msg


# -- the parser of Authentication-Results ---------------------------------------------------------


def test_authentication_results_are_read_with_comments_quotes_and_case() -> None:
    """RFC 8601 syntax (authres): comments (nested, with semicolons), quoted values holding
    semicolons, a version after the authserv-id, any letter case; policy.* and unknown
    properties are not evidence, and do not stop the rest from being read."""
    value = (
        "MX.Home.example (a comment; with a semicolon) 1; DKIM=Pass (good (nested) sig) "
        'header.D=Friends.Example header.b="ab;cd" x-bits=2048; '
        "spf=fail smtp.mailfrom=x@other.example; "
        "dmarc=pass policy.dmarc=reject (p=reject) header.from=friends.example"
    )
    how = authenticate([value], BOB, trusted_ids=ADDRS.trusted_ids, trust_mailbox=False).how
    assert how == "mx.home.example: dkim=pass header.d=friends.example"
    assert aligned("Friends.Example.", "friends.example")


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        ("friends.example", "friends.example", True),
        ("mail.friends.example", "friends.example", True),
        ("friends.example", "mail.friends.example", True),
        ("evil.example", "friends.example", False),
        ("notfriends.example", "friends.example", False),
        ("", "friends.example", False),
    ],
)
def test_relaxed_alignment(a: str, b: str, ok: bool) -> None:
    assert aligned(a, b) is ok


@pytest.mark.parametrize("method", ["dkim", "dmarc", "spf"])
def test_a_trusted_pass_aligned_with_the_from_domain_authenticates(method: str) -> None:
    how = authenticate(
        [passed("friends.example", method)], BOB, trusted_ids=ADDRS.trusted_ids, trust_mailbox=False
    ).how
    assert how is not None and how.startswith(f"mx.home.example: {method}=pass")


@pytest.mark.parametrize(
    "headers",
    [
        [],  # nothing
        ["mx.home.example; dkim=fail header.d=friends.example"],
        ["mx.home.example; dkim=pass header.d=evil.example"],  # signed, by someone else
        ["attacker.example; dkim=pass header.d=friends.example"],  # not a trusted id
        # the receiving server's own header is on top: a forged one below does not count
        ["mx.home.example; dkim=none", "mx.home.example; dkim=pass header.d=friends.example"],
        # results about another domain, or no result at all
        ["mx.home.example; dkim=pass header.d=evil.example; spf=pass smtp.mailfrom=e@evil.example"],
        ["mx.home.example; none"],
        ["mx.home.example; spf=pass smtp.helo=friends.example"],  # helo is not the sender
        ["mx.home.example; dmarc=pass"],  # for which domain?
        # a policy property is not a signing domain
        ["mx.home.example; dkim=pass policy.d=friends.example header.d=evil.example"],
        # header values the parser refuses, from the trusted id: not read, never a crash
        ["mx.home.example; dkim=pass header.d=friends.example; spf="],
        ["mx.home.example"],
        ["mx.home.example; dmarc=pass header.from=friends.example, evil.example"],
        ["mx.home.example; dkim=pass header.d=friends.example\x00; \udcff"],
        ["", ";;;", "(((", "mx.home.example; dmarc=fail header.from=friends.example"],
        # a trusted header below an untrusted one is the receiving server's verdict: read
        ["mx.evil.example; dkim=pass header.d=friends.example", "MX.HOME.EXAMPLE; dkim=fail"],
    ],
)
def test_anything_else_does_not(headers: list[str]) -> None:
    verdict = authenticate(headers, BOB, trusted_ids=ADDRS.trusted_ids, trust_mailbox=False)
    assert verdict.how is None and verdict.reason and verdict.detail


# -- case 1: a forged From ------------------------------------------------------------------------


def test_a_forged_owner_address_is_an_unverified_stranger_and_replies_go_to_the_audience() -> None:
    """Issue 10, case 1: From the owner's address, Reply-To the attacker, no authentication."""
    got = parse(mail(OWNER, headers={"Reply-To": EVE}))
    msg = got.message
    assert msg.sender == f"{OWNER} (unverified)"
    assert msg.privacy is not Privacy.OWNER
    assert msg.extra["authenticated"] is None
    assert msg.extra["no_reply"] == "sender not authenticated"
    assert EVE in msg.extra["audience"]  # the attacker is in the audience the turn is for
    assert got.headers.sender == EVE  # and only the audience gets the reply
    # the same for a contact's address
    bob = parse(mail(BOB)).message
    assert bob.sender == f"{BOB} (unverified)" and bob.extra["no_reply"]


def test_the_owner_authenticated_is_the_owner() -> None:
    msg = parse(mail(OWNER, [passed("home.example", "dmarc")])).message
    assert (msg.sender, msg.privacy) == (OWNER, Privacy.OWNER)
    assert "no_reply" not in msg.extra
    assert msg.extra["authenticated"] == "mx.home.example: dmarc=pass header.from=home.example"


def test_an_authenticated_owner_replying_to_someone_else_is_not_the_owners_conversation() -> None:
    msg = parse(mail(OWNER, [passed("home.example")], headers={"Reply-To": EVE})).message
    assert msg.privacy is Privacy.DIRECT  # the audience holds someone else
    assert msg.extra["audience"] == sorted([OWNER, EVE])


def test_a_mailbox_only_the_owners_server_delivers_to_may_trust_every_from() -> None:
    local = Addresses(own=ADDRS.own, owner=ADDRS.owner, trust_mailbox=True)
    msg = parse(mail(OWNER), local).message
    assert (msg.sender, msg.privacy) == (OWNER, Privacy.OWNER)


def test_unverified_mail_is_answered_only_when_anyone_is() -> None:
    anyone = Addresses(own=ADDRS.own, owner=ADDRS.owner, allow_all=True)
    msg = parse(mail(OWNER), anyone).message
    assert msg.sender == f"{OWNER} (unverified)" and "no_reply" not in msg.extra


# -- cases 2, 3, 5: a thread is one conversation per audience ------------------------------------


def test_naming_a_private_threads_message_id_does_not_join_it() -> None:
    """Issue 10, case 2."""
    private = parse(mail(OWNER, [passed("home.example")], mid="<private@home.example>")).message
    intruder = parse(
        mail(EVE, [passed("evil.example")], mid="<e@evil.example>",
             references="<private@home.example>", in_reply_to="<private@home.example>")
    ).message  # fmt: skip
    assert intruder.conversation != private.conversation
    assert intruder.extra["thread"] == "<private@home.example>"  # it may quote, sees nothing
    # and a forged From with the same recipients: still another conversation
    forged = parse(mail(OWNER, mid="<f@x>", references="<private@home.example>")).message
    assert forged.conversation != private.conversation


def test_a_wider_or_narrower_audience_is_another_conversation_of_the_thread() -> None:
    """Issue 10, cases 3 and 5: owner-only turns, then Carol copied in; a group thread, then Bob
    writing to the assistant alone."""
    ok = [passed("home.example")]
    first = parse(mail(OWNER, ok, mid="<t1@home.example>")).message
    again = parse(mail(OWNER, ok, mid="<t2@home.example>", references="<t1@home.example>"))
    assert again.message.conversation == first.conversation  # the same people: the same one
    wider = parse(
        mail(OWNER, ok, mid="<t3@home.example>", references="<t1@home.example>", cc=CAROL)
    ).message
    assert wider.conversation != first.conversation
    assert wider.privacy is Privacy.DIRECT
    group = parse(
        mail(BOB, [passed("friends.example")], mid="<g1@f>", cc=f"{CAROL}, {OWNER}")
    ).message
    alone = parse(mail(BOB, [passed("friends.example")], mid="<g2@f>", references="<g1@f>")).message
    assert group.privacy is Privacy.GROUP and alone.privacy is Privacy.DIRECT
    assert alone.conversation != group.conversation
    assert alone.conversation.endswith(audience_key([BOB]))


# -- beyond the listed cases ----------------------------------------------------------------------


def test_a_display_name_imitating_the_owner_changes_nothing() -> None:
    """The owner is an authenticated address, never a name: "Owner <eve@...>" is Eve, and an
    authenticated Eve using the owner's name is still Eve."""
    msg = parse(mail(f'"Owner (owner@home.example)" <{EVE}>', [passed("evil.example")])).message
    assert msg.sender == EVE and msg.privacy is Privacy.DIRECT
    assert msg.extra["audience"] == [EVE]


def test_a_trusted_header_is_not_made_by_adding_another() -> None:
    """A sender can put Authentication-Results of their own in the mail, below the one the
    receiving server adds on top: one from an untrusted authserv-id counts for nothing, and one
    forged in the trusted server's name below its real verdict does not turn a fail into a
    pass."""
    untrusted = ["mx.evil.example; dkim=pass header.d=home.example"]
    msg = parse(mail(OWNER, untrusted)).message
    assert msg.sender == f"{OWNER} (unverified)" and msg.privacy is not Privacy.OWNER
    forged = [
        "mx.home.example; dkim=fail header.d=home.example",  # the receiving server's, on top
        "mx.home.example; dkim=pass header.d=home.example",  # the sender's, below it
    ]
    msg = parse(mail(OWNER, forged)).message
    assert msg.sender == f"{OWNER} (unverified)" and msg.privacy is not Privacy.OWNER


def test_the_bot_in_bcc_answers_the_sender_alone() -> None:
    """Issue 24, item 8: a mail that reaches the assistant by Bcc is answered to its sender
    alone, never to the recipients it shows, so its audience is the sender alone too (the
    owner's own conversation when the owner wrote it)."""
    got = parse(mail(OWNER, [passed("home.example")], to=BOB, cc=CAROL))  # bot only in Bcc
    msg = got.message
    assert msg.extra["audience"] == [OWNER] and msg.privacy is Privacy.OWNER
    assert msg.conversation.endswith(audience_key([OWNER]))
    assert (got.headers.sender, got.headers.to, got.headers.cc) == (OWNER, [], [])
    assert msg.extra["to"] == [BOB] and msg.extra["bcc"] is True  # kept for the record
    bob = parse(mail(BOB, [passed("friends.example")], to=CAROL, mid="<b@f>")).message
    assert bob.extra["audience"] == [BOB] and bob.privacy is Privacy.DIRECT


def test_a_forwarded_mail_is_the_forwarders_words() -> None:
    """Bob forwards a mail the owner wrote: it is Bob's message, in Bob's conversation; the
    quoted From inside the body makes nobody the owner."""
    body = f"---------- Forwarded message ---------\nFrom: {OWNER}\n\nthe door code is 1234"
    msg = parse(mail(BOB, [passed("friends.example")], body=body)).message
    assert msg.sender == BOB and msg.privacy is Privacy.DIRECT
    assert msg.extra["audience"] == [BOB]


def test_an_unverified_sender_joins_no_earlier_conversation() -> None:
    """Found by the review: mail from an unauthenticated address is anyone's who can forge that
    From, so naming the Message-ID of that address's earlier thread must not show the forger
    its history: each unauthenticated mail is a conversation of its own (it may still quote)."""
    anyone = Addresses(own=ADDRS.own, owner=ADDRS.owner, allow_all=True)
    first = parse(mail(BOB, mid="<b1@f>"), anyone).message
    forged = parse(mail(BOB, mid="<b2@f>", references="<b1@f>", in_reply_to="<b1@f>"), anyone)
    assert forged.message.conversation != first.conversation
    assert forged.message.extra["thread"] == "<b1@f>"
    ok = [passed("friends.example")]
    real = parse(mail(BOB, ok, mid="<b3@f>")).message
    follow = parse(mail(BOB, ok, mid="<b4@f>", references="<b3@f>")).message
    assert follow.conversation == real.conversation  # authenticated: the thread goes on
