"""Who a mail and its reply reach (pure: no I/O).

- :func:`mail_audience`: everyone who can read a mail, relaybot's own addresses aside: its
  sender (From as established, and Reply-To, where the reply goes), and To and Cc. When relaybot
  is in neither To nor Cc (it got the mail as a Bcc, or through an alias), the reply goes to the
  sender alone, so the audience is the sender alone too: the others never see the reply.
- Mailing lists: an address in the audience that is a list (configured in ``[email] lists``,
  named by this mail's ``List-Post``/``List-Id``, or learned from those headers of mail seen
  earlier) is a group of unknown size, never one person: such an audience is a ``group``.
- :func:`withheld`: the recheck right before a reply is sent. Its recipients must be exactly
  within the audience the reply was written for (``Reply.extra["audience"]``, as the inbound
  entry's ``extra["audience"]`` had it; for a reply of an older worker without it, the audience
  recomputed from the stored headers of the mail it answers).

Addresses are compared as the audience is computed: lowercased addr-specs, relaybot's own
addresses aside; the handle of an unverified sender, ``address (unverified)``, stands for
``address`` (the reply reaches that mailbox, whoever wrote the mail).
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Callable, Iterable, Sequence

UNVERIFIED = "(unverified)"  # after the From address of a mail whose sender is not authenticated
MAX_LISTS = 5  # list addresses taken from one mail's headers
_MAILTO = re.compile(r"<\s*mailto:([^>?\s]+)", re.IGNORECASE)
_LIST_ID = re.compile(r"<\s*([A-Za-z0-9_-][A-Za-z0-9_.-]*\.[A-Za-z0-9.-]+)\s*>")

Header = Callable[[str], str]  # a header's value, "" when absent


def handle_address(handle: str) -> str:
    """The mailbox an audience member's handle stands for: lowercased, without ``(unverified)``."""
    return handle.strip().removesuffix(UNVERIFIED).strip().lower()


def addresses(values: Iterable[str]) -> list[str]:
    """The addr-specs in header values (``getaddresses``: one per address, however many a
    header holds), lowercased, each once, in order."""
    out: list[str] = []
    for _name, raw in email.utils.getaddresses(list(values)):
        addr = raw.strip().lower()
        if "@" in addr and addr not in out:
            out.append(addr)
    return out


def mail_audience(
    who: str, reply_to: str, to: Sequence[str], cc: Sequence[str], own: frozenset[str]
) -> list[str]:
    """Who can read the mail, relaybot aside (sorted handles): ``who`` is the From as
    established (``address (unverified)`` when it is not), ``to`` and ``cc`` what the mail shows,
    already reduced to the sender alone by the caller when relaybot was not among them."""
    people = {a for a in [who, reply_to, *to, *cc] if a and handle_address(a) not in own}
    return sorted(people)


def visible_to(own: frozenset[str], to: Sequence[str], cc: Sequence[str]) -> bool:
    """Whether relaybot is among the recipients the mail shows (else: a Bcc, or an alias)."""
    return bool(own & {a.lower() for a in [*to, *cc]})


def list_addresses(header: Header) -> set[str]:
    """The mailing-list addresses a mail's own headers name: ``List-Post: <mailto:...>``, and
    ``List-Id: <name.domain>`` read as ``name@domain`` (what Mailman, Sympa and Google Groups
    use). At most :data:`MAX_LISTS`."""
    found: list[str] = []
    for value in _MAILTO.findall(header("List-Post")):
        found += addresses([value])
    m = _LIST_ID.search(header("List-Id"))
    if m:
        name, _dot, domain = m.group(1).partition(".")
        if name and "." in domain:
            found += addresses([f"{name}@{domain}"])
    return set(list(dict.fromkeys(found))[:MAX_LISTS])


def lists_in(audience: Iterable[str], lists: Iterable[str]) -> list[str]:
    """The audience members that are list addresses (sorted)."""
    known = {a.lower() for a in lists}
    return sorted({handle_address(a) for a in audience} & known)


def stored_audience(
    author: str, sender: str, to: Sequence[str], cc: Sequence[str], own: frozenset[str]
) -> set[str]:
    """The audience recomputed from the stored headers of a mail (``author``: its From, ""
    when stored by an older gateway; ``sender``: where replies go; ``to``/``cc`` as stored,
    empty when relaybot was not among them)."""
    return {handle_address(a) for a in [author, sender, *to, *cc] if a} - own


def written_for(extra: dict[str, object]) -> set[str] | None:
    """The audience a reply was written for (``Reply.extra["audience"]``); None when the reply
    does not say (an older worker); raises ValueError when it is not a list of addresses."""
    if "audience" not in extra:
        return None
    raw = extra["audience"]
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ValueError(f"the reply's audience is not a list of addresses: {str(raw)[:100]!r}")
    return {handle_address(a) for a in raw}


def withheld(recipients: Iterable[str], audience: set[str], own: frozenset[str]) -> list[str]:
    """The recipients that are outside ``audience`` (relaybot's own addresses aside)."""
    out: list[str] = []
    for r in recipients:
        addr = handle_address(r)
        if addr not in own and addr not in audience and addr not in out:
            out.append(addr)
    return out
