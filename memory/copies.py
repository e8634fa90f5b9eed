"""What finds an erasure's text outside memory: the keys of the copies Redis may still hold.

Memory is not the only place a message lives: its stream entry, its reply in a reply or in-flight
queue, a dead letter, the e-mail gateway's cached headers (and those of the replies in a thread
whose subject repeats an erased mail's). An erasure's tombstone (memory/
erasure.py) names the rows it erased; :func:`copies_of` turns it into what those copies are
known by, for the worker to find and delete them (worker/scrub.py). Read-only, from the
tombstone and the (blanked) rows, so it gives the same answer when the worker replays the
command after a crash.

A copy that names nothing memory knows it by (a malformed entry without a conversation, a dead
letter of one, a raw mail a gateway could not parse) is found by the erased text itself
(:meth:`Copies.holds_text`). The texts are not in the tombstone (it keeps no text): the erasure
hands them to the worker in the process that applied it (memory.command_types), and a worker
that replays the command after a crash takes them from the erased entries Redis still holds
(worker/scrub.py).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from memory.identity import handles_of
from memory.schedule_erasure import command_entries
from memory.sql import chunks, marks

MIN_TEXT_MATCH = 8  # shorter texts ("ok", "yes") are found only as a whole value, not inside one
_QUOTE_MARK = re.compile(r"^[ \t>|]+", re.M)


def plain(text: str) -> str:
    """Text as a copy may carry it: without quote marks (``>``, ``|``) at line starts, line
    breaks, runs of blanks and case."""
    return " ".join(_QUOTE_MARK.sub("", text).split()).casefold()


@dataclass(frozen=True)
class Copies:
    """The keys of an erasure's copies (see the module docstring)."""

    erasure: int
    entries: frozenset[str]  # the stream ids of the erased messages, of the kept ones whose
    # quote of erased text was dropped, and of the owner's commands that wrote erased notes
    answers: frozenset[str]  # the stream ids the erased replies answer (in reply queues)
    reply_ids: frozenset[str]  # the erased replies' ids
    event_ids: frozenset[tuple[str, str]]  # (channel, platform event id) of the erased messages
    handles: frozenset[tuple[str, str]]  # an erased person's (channel, address), casefolded
    conversations: frozenset[str]  # an erased conversation
    # (channel, platform event id) of the kept mails whose subject repeated an erased one's:
    # their cached reply headers lose the subject (memory/subjects.py)
    subject_event_ids: frozenset[tuple[str, str]] = frozenset()
    # the erased texts, as :func:`plain` makes them (see the module docstring)
    texts: frozenset[str] = field(default_factory=frozenset)

    def sender_erased(self, channel: str, sender: str) -> bool:
        return (channel.strip().casefold(), sender.strip().casefold()) in self.handles

    def with_texts(self, texts: Iterable[str]) -> Copies:
        """These copies, also found by ``texts`` (raw; blank ones are left out)."""
        flat = {plain(t) for t in texts}
        return replace(self, texts=self.texts | {t for t in flat if t})

    def holds_text(self, value: str) -> bool:
        """Whether ``value`` holds an erased text: inside it (a text of at least
        :data:`MIN_TEXT_MATCH` characters), or as all of it (a shorter one)."""
        if not self.texts or not value:
            return False
        return _index(self.texts).found_in(plain(value))


@dataclass(frozen=True)
class _TextIndex:
    """The erased texts, so that a value is looked through once, not once per text: a text of
    three words or more is looked for only where one of its inner words (whole in any copy of
    it) is a word of the value; shorter ones are looked for directly."""

    whole: frozenset[str]
    keyed: dict[str, list[str]]  # an inner word -> the texts it is the key of
    direct: list[str]

    def found_in(self, flat: str) -> bool:
        if flat in self.whole:
            return True
        if any(t in flat for t in self.direct):
            return True
        for word in set(flat.split(" ")):
            if any(t in flat for t in self.keyed.get(word, ())):
                return True
        return False


@lru_cache(maxsize=8)
def _index(texts: frozenset[str]) -> _TextIndex:
    keyed: dict[str, list[str]] = {}
    direct: list[str] = []
    for text in texts:
        if len(text) < MIN_TEXT_MATCH:
            continue  # found only as a whole value
        words = text.split(" ")
        if len(words) < 3:
            direct.append(text)
        else:  # the first and last words may be glued to what surrounds the text
            keyed.setdefault(max(words[1:-1], key=len), []).append(text)
    return _TextIndex(texts, keyed, direct)


def _more_entries(detail: dict[str, Any]) -> set[str]:
    """The stream entries that hold erased text besides the erased messages' own: those of the
    kept rows whose quote of it was dropped, of the owner's commands that wrote erased notes
    (``relaybot memory notes add|supersede``: memory/notes/commands.py keys such a note
    ``cmd:<stream id>``), and of those that set erased scheduled items (``relaybot reminders
    add``: memory/schedule_erasure.py)."""
    out: set[str] = command_entries(detail)
    for key in detail.get("quote_keys", []):
        if isinstance(key, list) and len(key) == 2 and key[0] == "in":
            out.add(str(key[1]))
    for key in detail.get("note_op_keys", []):
        if isinstance(key, str) and key.startswith("cmd:"):
            out.add(key.removeprefix("cmd:"))
    return out


def copies_of(conn: sqlite3.Connection, erasure_id: int) -> Copies:
    """The copies of what erasure ``erasure_id`` erased; an unknown id finds nothing."""
    raw = conn.execute(
        "SELECT target_kind, target, detail FROM erasure WHERE id = ?", (erasure_id,)
    ).fetchone()
    if raw is None:
        nothing: frozenset[Any] = frozenset()
        return Copies(erasure_id, nothing, nothing, nothing, nothing, nothing, nothing)
    kind, target, detail_raw = str(raw[0]), str(raw[1]), raw[2]
    try:
        detail = json.loads(detail_raw or "{}")
    except ValueError:
        detail = {}
    ids = [i for i in detail.get("log_ids", []) if isinstance(i, int)]
    entries: set[str] = set()
    answers: set[str] = set()
    reply_ids: set[str] = set()
    event_ids: set[tuple[str, str]] = set()
    for chunk in chunks(ids):
        for direction, sid, channel, event_id, reply_id in conn.execute(
            "SELECT direction, stream_id, channel, event_id, reply_id FROM log "  # noqa: S608
            f"WHERE id IN ({marks(len(chunk))})",
            list(chunk),
        ):
            if direction == "in":
                entries.add(str(sid))
                event_ids.add((str(channel), str(event_id)))
            else:
                answers.add(str(sid))
                if reply_id:
                    reply_ids.add(str(reply_id))
    entries.update(_more_entries(detail))
    # kept mails that repeated an erased subject: their entries hold it, their cached headers too
    subject_event_ids: set[tuple[str, str]] = set()
    subject_ids = [i for i in detail.get("subject_ids", []) if isinstance(i, int)]
    for chunk in chunks(subject_ids):
        for direction, sid, channel, event_id in conn.execute(
            "SELECT direction, stream_id, channel, event_id FROM log "  # noqa: S608
            f"WHERE id IN ({marks(len(chunk))})",
            list(chunk),
        ):
            if direction == "in":
                entries.add(str(sid))
                subject_event_ids.add((str(channel), str(event_id)))
    entities = [e for e in detail.get("entities", []) if isinstance(e, str)]
    handles = {
        (h.channel.strip().casefold(), h.address.strip().casefold())
        for e in entities
        for h in handles_of(conn, e)
    }
    return Copies(
        erasure=erasure_id,
        entries=frozenset(entries),
        answers=frozenset(answers),
        reply_ids=frozenset(reply_ids),
        event_ids=frozenset(event_ids),
        handles=frozenset(handles),
        conversations=frozenset({target} if kind == "conversation" else ()),
        subject_event_ids=frozenset(subject_event_ids),
    )
