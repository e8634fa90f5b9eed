"""E-mail in, normalized message out: pure functions, no I/O.

``parse_email(raw, policy, received_at)`` turns the bytes of one message into an ``Accepted``
(the ``InboundMessage`` to XADD plus the headers a reply needs) or a ``Rejected`` with the
reason. Nothing here raises on bad mail: unknown or lying charsets are decoded with
replacement characters, HTML-only bodies become text, huge bodies are truncated with a note and
attachments are described (name, type, size) instead of included.

Who sent it is established, not claimed (gateways/email/auth.py): an unauthenticated From is
``address (unverified)``, nobody we know. The *audience* is everyone who can read the mail:
From (as established), To, Cc and Reply-To, relaybot's own addresses aside; the sender alone when
relaybot is in neither To nor Cc (a Bcc: the reply goes to the sender alone). A mailing list in it
makes it a group (gateways/email/audience.py).

Threads: the session and conversation are ``email:<thread id>/<audience key>``, where the thread
id is the root Message-ID of ``References`` (else ``In-Reply-To``, else the message's own
Message-ID) and the audience key names its audience: a thread is one conversation per audience.
So naming a private thread's Message-ID, or copying someone new in, or writing to the assistant
alone inside a group thread, starts a conversation of its own, which sees nothing of the
others'. Privacy: the audience other than the owner — nobody: ``owner``; one person: ``direct``;
more, or a mailing list: ``group``. A reply goes to the audience only (Reply-To, else From, and
To and Cc unless relaybot got the mail as a Bcc).

A reply's text is what its sender wrote: the earlier mail it quotes is cut off
(gateways/email/quote.py) and kept in ``extra.quoted``, not given to the model as new text (the
thread is in memory already). :func:`show_quote` puts it back, marked as a quote, for a mail whose
quoted mail never reached relaybot (it was copied into a thread late): then the quote is context
the model has nowhere else. Nothing vouches for it: the sender may have written it all, the
attribution line ("On ..., Ada wrote:") included. So the note says the quote's author is the
sender's claim, unverified, and every quoted line is prefixed with ``| `` up to an end line:
no line of it can read as someone else (the owner) speaking outside the sender's message.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
import re
from dataclasses import dataclass, field, replace
from email.message import EmailMessage, Message
from html.parser import HTMLParser
from typing import Any, ClassVar

from contract.messages import MAX_TEXT_CHARS, InboundMessage, Kind, Privacy
from gateways.audience import audience_key
from gateways.email.audience import (
    UNVERIFIED,
    addresses,
    list_addresses,
    lists_in,
    mail_audience,
    visible_to,
)
from gateways.email.auth import UNVERIFIED_SENDER, Verdict, authenticate, from_problem
from gateways.email.loop import loop_guard
from gateways.email.quote import split_reply

__all__ = ["UNVERIFIED", "Accepted", "Addresses", "Headers", "Rejected", "parse_email"]

CHANNEL = "email"
MAX_BODY_CHARS = 20_000
_ID_CHARS = re.compile(r"^[A-Za-z0-9_.:@+=/!#$-]{1,150}$")
_MSGID = re.compile(r"<([^<>\s]+)>")


@dataclass(frozen=True)
class Addresses:
    """Who is who, by lowercased address."""

    own: frozenset[str]  # relaybot's own addresses
    owner: frozenset[str]  # the owner's addresses (always allowed, once authenticated)
    allow: frozenset[str] = frozenset()  # other senders answered: "a@b.org" or "@b.org"
    allow_all: bool = False
    trusted_ids: frozenset[str] = frozenset()  # authserv-ids of trusted Authentication-Results
    trust_mailbox: bool = False  # every From is believed (only the owner's server delivers here)
    lists: frozenset[str] = frozenset()  # mailing-list addresses ([email] lists)

    def allowed(self, sender: str) -> bool:
        domain = "@" + sender.rsplit("@", 1)[-1]
        known = sender in self.owner or sender in self.allow
        return self.allow_all or known or domain in self.allow

    def may_be_list(self, address: str) -> bool:
        """Whether a list header may make ``address`` a list: never relaybot's own, the owner's
        or a person allowlisted by address (a forged List-Post cannot turn them into a list)."""
        return address not in self.own and address not in self.owner and address not in self.allow


@dataclass(frozen=True)
class Headers:
    """What a reply needs from the message it answers."""

    message_id: str  # with angle brackets
    references: list[str]  # with angle brackets, oldest first
    subject: str
    sender: str  # the address replies go to (Reply-To, else From)
    to: list[str]  # empty when relaybot was in neither To nor Cc (a Bcc): the sender alone
    cc: list[str]
    author: str = ""  # the From address ("" in what an older gateway stored)

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "references": self.references,
            "subject": self.subject,
            "sender": self.sender,
            "to": self.to,
            "cc": self.cc,
            "author": self.author,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Headers:
        return cls(
            message_id=str(data["message_id"]),
            references=[str(x) for x in data.get("references", [])],
            subject=str(data.get("subject", "")),
            sender=str(data["sender"]),
            to=[str(x) for x in data.get("to", [])],
            cc=[str(x) for x in data.get("cc", [])],
            author=str(data.get("author", "")),
        )


@dataclass(frozen=True)
class Accepted:
    message: InboundMessage
    headers: Headers
    verdict: Verdict = UNVERIFIED_SENDER  # how the sender was authenticated, or why not
    lists_seen: frozenset[str] = frozenset()  # list addresses this mail's headers name
    owner_refused: bool = False  # from one of the owner's addresses, and not authenticated


@dataclass(frozen=True)
class Rejected:
    reason: str
    message_id: str = ""
    sender: str = ""
    dead: bool = False  # True: the message could not be parsed at all (dead-letter it)
    extra: dict[str, Any] = field(default_factory=dict)
    lists_seen: frozenset[str] = frozenset()  # list addresses this mail's headers name


def parse_email(raw: bytes, addrs: Addresses, received_at: float) -> Accepted | Rejected:
    """One raw message as a normalized inbound message, or the reason it is not answered."""
    if not raw or not raw.strip():
        return Rejected("empty message", dead=True)
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
    except Exception as exc:  # any parser failure is a dead letter, not a crash
        return Rejected(f"unparseable: {type(exc).__name__}: {exc}", dead=True)
    try:
        return _parse(msg, addrs, received_at)
    except Exception as exc:  # bad mail never stops the loop
        return Rejected(f"unparseable: {type(exc).__name__}: {exc}", dead=True)


def _parse(msg: EmailMessage, addrs: Addresses, received_at: float) -> Accepted | Rejected:
    message_id = _first_id(_header(msg, "Message-ID"))
    from_name, sender = _first_address(_header(msg, "From"))
    if not sender:
        return Rejected("no From address", message_id=message_id, dead=True)
    lists_seen = frozenset(a for a in _lists_named(msg) if addrs.may_be_list(a))
    guard = loop_guard(msg, lambda name: _header(msg, name), sender, message_id, addrs.own)
    if guard:
        return Rejected(guard, message_id=message_id, sender=sender, lists_seen=lists_seen)
    verdict = authenticate(
        _all_headers(msg, "Authentication-Results"),
        sender,
        trusted_ids=addrs.trusted_ids,
        trust_mailbox=addrs.trust_mailbox,
        from_issue=from_problem(msg),
    )
    authenticated = verdict.how
    # a sender not on the allowlist is recorded (the worker stores it) but not answered; an
    # unauthenticated one is nobody we know (its own handle), answered only with allowlist "*"
    if authenticated:
        who = sender
        no_reply = "" if addrs.allowed(sender) else "sender not on the allowlist"
    else:
        who = f"{sender} {UNVERIFIED}"
        no_reply = "" if addrs.allow_all else "sender not authenticated"
    if not message_id:
        digest = hashlib.sha256(bytes(msg.as_bytes(policy=email.policy.SMTP))).hexdigest()[:32]
        message_id = f"<{digest}@no-message-id.invalid>"
    references = _ids(_header(msg, "References"))
    in_reply_to = _ids(_header(msg, "In-Reply-To"))
    if not references and in_reply_to:
        references = in_reply_to[:1]
    root = references[0] if references else message_id
    _reply_name, reply_to = _first_address(_header(msg, "Reply-To"))
    to = _addresses(*_every(msg, "To"))  # a mail may (wrongly) carry several To or Cc headers:
    cc = _addresses(*_every(msg, "Cc"))  # everyone each names received it
    # relaybot in neither To nor Cc (a Bcc): the reply reaches the sender alone, and so the
    # audience is the sender alone (the others never see what relaybot answers)
    bcc = not visible_to(addrs.own, to, cc)
    reply_to_all, reply_cc = ([], []) if bcc else (to, cc)
    # the audience: who can read this mail (relaybot aside); a thread is one conversation per
    # audience, so naming a thread's Message-ID never joins the conversation of other people
    audience = mail_audience(who, reply_to, reply_to_all, reply_cc, addrs.own)
    # an unauthenticated sender cannot be told from anyone forging the same From: its mail joins
    # no earlier conversation (naming a thread's Message-ID would show the forger its history)
    joined = root if authenticated else message_id
    thread = f"email:{thread_key(joined)}/{audience_key(audience)}"
    subject = _clean(_header(msg, "Subject"))[:500]
    body, attachments = extract_body(msg)
    split = split_reply(body, subject)
    body = split.new
    text = f"Subject: {subject}\n\n{body}" if subject else body
    if attachments:
        described = "\n".join(
            f"- {a['name']} ({a['type']}, {a['size']} bytes)" for a in attachments
        )
        text += f"\n\n[attachments, not included:\n{described}]"
    if len(text) > MAX_TEXT_CHARS:
        note = "\n[truncated by relaybot]"
        text = text[: MAX_TEXT_CHARS - len(note)] + note
    lists = lists_in(audience, addrs.lists | lists_seen)
    headers = Headers(
        message_id=message_id,
        references=references,
        subject=subject,
        sender=reply_to or sender,
        to=reply_to_all,
        cc=reply_cc,
        author=sender,
    )
    inbound = InboundMessage(
        kind=Kind.MESSAGE,
        channel=CHANNEL,
        session=thread,
        conversation=thread,
        sender=who[:320],
        sender_name=(from_name or who)[:320],
        privacy=privacy_of(audience, addrs.owner, lists),
        text=text,
        ts=_date(msg, received_at),
        event_id=message_id[:1000],
        extra={
            "subject": subject,
            "to": to,
            "cc": cc,
            "thread": root,
            "audience": audience,
            "authenticated": authenticated,
            "attachments": attachments,
            **({"bcc": True} if bcc else {}),
            **({"lists": lists} if lists else {}),
            **({"quoted": split.quoted} if split.quoted else {}),
            **({"no_reply": no_reply} if no_reply else {}),
        },
    )
    refused = not authenticated and sender in addrs.owner
    return Accepted(inbound, headers, verdict, lists_seen, owner_refused=refused)


def privacy_of(audience: list[str], owner: frozenset[str], lists: list[str]) -> Privacy:
    """The owner alone: ``owner``; one other person: ``direct``; more, or a list: ``group``."""
    others = set(audience) - owner
    if lists or len(others) > 1:
        return Privacy.GROUP
    return Privacy.DIRECT if others else Privacy.OWNER


def with_lists(accepted: Accepted, lists: set[str]) -> Accepted:
    """The mail again, knowing that these audience members are mailing lists (learned from
    earlier mail): a group conversation."""
    msg = accepted.message
    found = lists_in(msg.extra.get("audience", []), {*lists, *msg.extra.get("lists", [])})
    if found == msg.extra.get("lists", []):
        return accepted
    extra = {**msg.extra, "lists": found}
    shown = msg.model_copy(update={"privacy": Privacy.GROUP, "extra": extra})
    return replace(accepted, message=shown)


def _lists_named(msg: Message) -> set[str]:
    try:
        return list_addresses(lambda name: _header(msg, name))
    except Exception:  # a list header the policy cannot read names no list
        return set()


QUOTE_NOTE = "[quoted from an earlier mail that relaybot did not receive]"
QUOTE_UNVERIFIED = (
    "[the lines marked | are part of this message from {sender}: they say they quote an earlier "
    "mail, but who wrote it and what it said is only the sender's claim, unverified]"
)
QUOTE_END = "[end of the quote in the message from {sender}]"
QUOTE_MARK = "| "


def quoted_mail(accepted: Accepted) -> str:
    """The Message-ID of the mail this one answers (its parent), "" for a new thread."""
    refs = accepted.headers.references
    return refs[-1] if refs else ""


def show_quote(accepted: Accepted) -> Accepted:
    """The mail with its quote put back into the text, after a note saying what it is."""
    msg = accepted.message
    quoted = msg.extra.get("quoted")
    if not isinstance(quoted, str) or not quoted:
        return accepted
    sender = msg.sender
    marked = "\n".join(QUOTE_MARK + line for line in quoted.split("\n"))
    text = (
        f"{msg.text}\n\n{QUOTE_NOTE}\n{QUOTE_UNVERIFIED.format(sender=sender)}\n{marked}\n"
        f"{QUOTE_END.format(sender=sender)}"
    )
    if len(text) > MAX_TEXT_CHARS:
        note = "\n[truncated by relaybot]"
        text = text[: MAX_TEXT_CHARS - len(note)] + note
    shown = msg.model_copy(update={"text": text, "extra": {**msg.extra, "quote_shown": True}})
    return replace(accepted, message=shown)


def thread_key(message_id: str) -> str:
    """A routing-key-safe form of a Message-ID: itself when it can be, else a digest."""
    bare = message_id.strip().strip("<>")
    if _ID_CHARS.match(bare) and bare[0].isalnum():
        return bare
    return "h" + hashlib.sha256(bare.encode("utf-8", "replace")).hexdigest()[:32]


def extract_body(msg: Message) -> tuple[str, list[dict[str, Any]]]:
    """The text of a message (plain preferred, else HTML as text) and its attachments."""
    plain: list[str] = []
    html: list[str] = []
    attachments: list[dict[str, Any]] = []
    parts = list(msg.walk()) if msg.is_multipart() else [msg]
    for part in parts[:500]:
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        disposition = (part.get_content_disposition() or "").lower()
        filename = _filename(part)
        if ctype.startswith("multipart/"):  # a multipart without a usable boundary: its text
            ctype = "text/plain"
        if disposition == "attachment" or filename or not ctype.startswith("text/"):
            payload = _payload(part)
            attachments.append(
                {"name": (filename or "(unnamed)")[:200], "type": ctype, "size": len(payload)}
            )
            continue
        text = decode_text(_payload(part), part.get_content_charset())
        if ctype == "text/html":
            html.append(html_to_text(text))
        else:
            plain.append(text)
    body = "\n\n".join(p.strip() for p in (plain or html) if p.strip())
    body = body.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    if len(body) > MAX_BODY_CHARS:
        body = (
            body[:MAX_BODY_CHARS]
            + f"\n[truncated by relaybot: the body had {len(body)} characters]"
        )
    return body, attachments[:50]


def decode_text(data: bytes, charset: str | None) -> str:
    """Decode with the declared charset; an unknown or lying one falls back, never raises."""
    for candidate in (charset, "utf-8"):
        if not candidate:
            continue
        try:
            return data.decode(candidate)
        except (LookupError, UnicodeDecodeError, ValueError):
            continue
    return data.decode("utf-8", errors="replace")


class _Text(HTMLParser):
    _BLOCK: ClassVar[frozenset[str]] = frozenset(
        {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote"}
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "head"):
            self._skip += 1
        elif tag in self._BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head") and self._skip:
            self._skip -= 1
        elif tag in self._BLOCK:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.out.append(data)


def html_to_text(html: str) -> str:
    parser = _Text()
    try:
        parser.feed(html)
        parser.close()
    except Exception:  # noqa: S110 - broken HTML: keep what was read
        pass
    text = "".join(parser.out)
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def _payload(part: Message) -> bytes:
    try:
        data = part.get_payload(decode=True)
    except Exception:  # broken transfer encoding
        data = None
    if isinstance(data, bytes):
        return data
    raw = part.get_payload()
    return raw.encode("utf-8", "replace") if isinstance(raw, str) else b""


def _filename(part: Message) -> str:
    try:
        return _clean(part.get_filename() or "")
    except Exception:  # a broken RFC 2231 parameter
        return "(unreadable name)"


def _header(msg: Message, name: str) -> str:
    try:
        value = msg.get(name)
    except Exception:  # a header the policy cannot parse
        value = None
        for key, raw in msg.raw_items():
            if key.lower() == name.lower():
                value = raw
                break
    return "" if value is None else str(value)


def _all_headers(msg: Message, name: str) -> list[str]:
    """Every value of a header, top first."""
    return [str(value) for key, value in msg.raw_items() if key.lower() == name.lower()]


def _clean(text: str) -> str:
    return " ".join(text.replace("\x00", "").split())


def _ids(value: str) -> list[str]:
    found = [f"<{m}>" for m in _MSGID.findall(value)]
    return found[-50:] if len(found) <= 50 else [found[0], *found[-49:]]


def _first_id(value: str) -> str:
    ids = _MSGID.findall(value)
    if ids:
        return f"<{ids[0][:900]}>"
    bare = value.strip()
    return f"<{bare[:900]}>" if bare and " " not in bare else ""


def _addresses(*values: str) -> list[str]:
    return addresses(values)[:100]


def _every(msg: Message, name: str) -> list[str]:
    """Every value of a header, as the parser reads it (the raw text where it cannot)."""
    try:
        return [str(v) for v in msg.get_all(name) or []]
    except Exception:  # a header the policy cannot parse
        return _all_headers(msg, name)


def _first_address(value: str) -> tuple[str, str]:
    for name, raw in email.utils.getaddresses([value]):
        addr = raw.strip().lower()
        if "@" in addr:
            return _clean(name), addr
    return "", ""


def _date(msg: Message, fallback: float) -> float:
    try:
        when = email.utils.parsedate_to_datetime(_header(msg, "Date"))
        ts = when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return fallback
    return ts if ts > 0 else fallback
