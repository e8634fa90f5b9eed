"""A reply as an e-mail: pure, no I/O.

``compose_reply`` builds the message that answers ``Headers`` (what ``email_parse`` kept of the
original) in its thread: ``In-Reply-To``, ``References`` (the thread's plus the answered id),
a ``Re:`` subject, a Message-ID derived from the reply id (so a resend is recognisable and
relaybot's own mail is recognised when it comes back), ``Auto-Submitted: auto-replied``, and a
``multipart/alternative`` body: the Markdown text as plain text and as sanitized HTML.
:func:`envelope` is who it goes to: every address of its To and Cc, one SMTP recipient each.
"""

from __future__ import annotations

import email.utils
import re
from email.message import EmailMessage

import markdown
import nh3

from contract.messages import Reply
from gateways.email.audience import addresses
from gateways.email.loop import SENT_ID_PREFIX
from gateways.email.parse import Headers

_RE = re.compile(r"^\s*((re|aw|sv|antw)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)
MAX_REFERENCES = 20


def reply_message_id(reply_id: str, domain: str) -> str:
    return f"<{SENT_ID_PREFIX}{reply_id}@{domain}>"


def re_subject(subject: str) -> str:
    bare = _RE.sub("", subject).strip()
    return f"Re: {bare}" if bare else "Re: your message"


def recipients(original: Headers, own: frozenset[str]) -> tuple[list[str], list[str]]:
    """(To, Cc) of a reply to all: the sender, then everyone else except relaybot itself (no one
    else when relaybot got the mail as a Bcc: the stored To and Cc are empty then)."""
    to = [original.sender]
    cc = [a for a in [*original.to, *original.cc] if a not in own and a not in to]
    return to, list(dict.fromkeys(cc))


def envelope(msg: EmailMessage) -> list[str]:
    """The SMTP recipients of a composed mail: each address of its To and Cc headers (parsed,
    so that ``a@x, b@y`` is two recipients), lowercased, each once."""
    return addresses([str(v) for name in ("To", "Cc") for v in msg.get_all(name, [])])


def to_html(text: str) -> str:
    rendered = markdown.markdown(text, extensions=["fenced_code", "tables", "sane_lists"])
    return nh3.clean(rendered)


def compose_reply(
    reply: Reply, original: Headers, *, sender: str, own: frozenset[str], now: float
) -> EmailMessage:
    """The e-mail carrying ``reply`` into the thread of ``original``."""
    domain = sender.rsplit("@", 1)[-1] or "relaybot.invalid"
    to, cc = recipients(original, own)
    refs = [r for r in original.references if r != original.message_id]
    refs = [*refs[:1], *refs[1:][-(MAX_REFERENCES - 2) :], original.message_id]
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    if cc:
        msg["Cc"] = ", ".join(cc)
    msg["Subject"] = re_subject(original.subject)
    msg["Message-ID"] = reply_message_id(reply.reply_id, domain)
    msg["Date"] = email.utils.formatdate(now, localtime=False)
    msg["In-Reply-To"] = original.message_id
    msg["References"] = " ".join(dict.fromkeys(refs))
    msg["Auto-Submitted"] = "auto-replied"
    msg["X-Auto-Response-Suppress"] = "All"
    text = reply.text if reply.text.strip() else "(empty reply)"
    msg.set_content(text)
    msg.add_alternative(f"<html><body>{to_html(text)}</body></html>", subtype="html")
    return msg
