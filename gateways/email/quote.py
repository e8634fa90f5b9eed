"""A reply's new text told from the earlier mail it quotes (pure: no I/O).

Mail clients put the thread under (or, inline, between) what the sender wrote: ``> `` lines, an
``On <date>, <name> wrote:`` line (in many languages), an Outlook ``From: / Sent: / To:`` block,
``-----Original Message-----``. :func:`split_reply` finds where the quote starts with
``mail-parser-reply`` (a maintained parser with the headers of 13 languages) and keeps the
sender's own lines exactly as written (the parser strips every line; code and indentation
matter). What it never does: drop the only text of a mail (a mail that is all quote keeps it
all), split a forward (the forwarded mail *is* the message), or cut an inline answer (``> q`` /
answer / ``> q`` / answer stays whole: the parser splits only at a quote header). A quote block at
the very end of the new text, with no header, is the quote too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mailparser_reply import EmailReplyParser
from mailparser_reply.constants import MAIL_LANGUAGES

MAX_QUOTED_CHARS = 16_000  # what is kept of a quote (the earlier mail is in memory already)
_PARSER = EmailReplyParser(languages=list(MAIL_LANGUAGES))
_FORWARD_SUBJECT = re.compile(r"^\s*(fwd?|wg|tr|rv|doorst)\s*:", re.I)
_FORWARD_MARK = re.compile(
    r"^\s*(-{2,}\s*(forwarded message|weitergeleitete nachricht|message transféré)\s*-{2,}"
    r"|begin forwarded message:|anfang der weitergeleiteten nachricht:)\s*$",
    re.I | re.M,
)
_QUOTED_LINE = re.compile(r"^\s*>")
# the line that introduces a quote: "On ..., Bob wrote:", "Am ... schrieb Bob:", "Bob a écrit :"
_ATTRIBUTION = re.compile(
    r"(wrote|schrieb|a écrit|escribió|scrisse|schreef|napisał|skrev|napsal|kirjoitti)[^:\n]*:\s*$",
    re.I,
)
_SEPARATOR = re.compile(r"^\s*[_-]{10,}\s*$")  # Outlook's line above its From:/Sent: block


@dataclass(frozen=True)
class Split:
    new: str  # what the sender wrote (the whole body when nothing is quoted)
    quoted: str = ""  # the earlier mail(s) it quotes, header line included ("" when none)


def split_reply(body: str, subject: str = "") -> Split:
    """The new text and the quoted part of a mail body (see the module docstring)."""
    if not body.strip() or _FORWARD_SUBJECT.match(subject):
        return Split(body)
    new, quoted = _by_header(body)
    if quoted and _FORWARD_MARK.search(new):  # "FYI" over a forwarded mail: all of it is new
        return Split(body)
    new, tail = _trailing_quote(new)
    quoted = "\n".join(p for p in (tail, quoted) if p)
    if not quoted.strip() or not new.strip():
        return Split(body)  # nothing quoted (the body as it came), or nothing but a quote
    return Split(new.rstrip(), _capped(quoted.strip()))


def _by_header(body: str) -> tuple[str, str]:
    """Split at the first quote header the parser finds; the new text as written."""
    try:
        parsed: Any = _PARSER.read(body)
    except Exception:  # a parser bug on odd mail: nothing is split
        return body, ""
    replies = list(parsed.replies)
    if len(replies) < 2 or not replies[0].content or replies[0].headers:
        return body, ""  # nothing quoted, or nothing but a quote
    normalized: str = parsed.text
    first: str = replies[0].content
    end = normalized.find(first) + len(first)
    lines = body.replace("\r\n", "\n").split("\n")
    if normalized.count("\n") != len(lines) - 1:  # the parser added lines: take its text
        return first, normalized[end:].strip()
    keep = normalized[:end].count("\n") + 1  # the parser only stripped lines: same lines
    return "\n".join(lines[:keep]), "\n".join(lines[keep:]).strip()


def _trailing_quote(text: str) -> tuple[str, str]:
    """A block of ``>`` lines ending the text, after text of the sender's own: the quote."""
    lines = text.rstrip().split("\n")
    cut = len(lines)
    while cut > 0 and (_QUOTED_LINE.match(lines[cut - 1]) or not lines[cut - 1].strip()):
        cut -= 1
    if cut == len(lines):
        return _without_separator(text), ""
    if cut > 0 and _ATTRIBUTION.search(lines[cut - 1]):  # "On ..., Bob wrote:" goes with it
        cut -= 1
    own = lines[:cut]
    if not any(x.strip() and not _QUOTED_LINE.match(x) for x in own):
        return text, ""  # all of it is quote: kept whole (split_reply gives the body back)
    return _without_separator("\n".join(own)), "\n".join(lines[cut:]).strip()


def _without_separator(text: str) -> str:
    lines = text.rstrip().split("\n")
    while len(lines) > 1 and (_SEPARATOR.match(lines[-1]) or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines)


def _capped(quoted: str) -> str:
    if len(quoted) <= MAX_QUOTED_CHARS:
        return quoted
    note = f"\n[truncated by relaybot: the quote had {len(quoted)} characters]"
    return quoted[: MAX_QUOTED_CHARS - len(note)] + note
