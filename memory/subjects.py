"""An erased mail's subject in the replies of its thread (on the channels whose messages carry a
subject: their specs' ``subjects``, contract/channels.py).

A mail's subject is part of its text (``Subject: …`` heads the row's text, and ``extra.subject``
keeps it), and every reply in its thread repeats it (``Re: …``): erasing the mail must take the
subject out of those replies too. A kept row loses its subject (the ``Subject:`` line of its text
goes, ``extra.subject`` becomes ``""`` and ``extra.subject_erased`` names the erasure) when it

- is a mail (of such a channel) that comes after an erased mail with a subject,
- in the same thread (``extra.thread``, the thread's first Message-ID) or conversation,
- and its subject, without its ``Re:``/``Fwd:`` prefixes, holds the erased mail's (compared
  without case and runs of blanks).

Its other text stays. Outside memory, the tombstone names these rows (``subject_ids``,
``subject_keys``): memory/copies.py turns them into their stream entries (deleted: they hold the
subject) and their Message-IDs, whose cached reply headers lose the subject (the channel's erasure
hook), so a reply to such a mail goes out as ``Re: your message``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence

from contract import channels as registry
from memory.rows import NOT_ERASED
from memory.sql import chunks, marks

# reply and forward prefixes, as mail clients in several languages write them, repeated
_PREFIX = re.compile(r"^\s*((re|aw|sv|antw|fw|fwd|wg|tr|rv)\s*(\[\d+\])?\s*:\s*)+", re.I)
_ROW = (
    "SELECT id, direction, stream_id, conversation, json_extract(extra, '$.thread'), "
    "json_extract(extra, '$.subject') FROM log "
)


def bare(subject: str) -> str:
    """A subject as its thread repeats it: no reply prefixes, one blank between words, no case."""
    return " ".join(_PREFIX.sub("", subject).split()).casefold()


def subject_rows(conn: sqlite3.Connection, erased: Sequence[int]) -> dict[int, tuple[str, str]]:
    """The kept rows whose subject repeats the subject of an erased mail (module docstring):
    id -> (direction, stream id). Read before the erased rows are blanked."""
    found: dict[int, tuple[str, str]] = {}
    for ch in registry.channels():
        if ch.subjects:
            found.update(_subject_rows(conn, erased, ch.name))
    return found


def _subject_rows(
    conn: sqlite3.Connection, erased: Sequence[int], channel: str
) -> dict[int, tuple[str, str]]:
    wanted: list[tuple[int, str, str, str]] = []  # (id, conversation, thread, bare subject)
    for chunk in chunks(list(erased)):
        sql = f"{_ROW} WHERE channel = ? AND json_valid(extra) AND id IN ({marks(len(chunk))})"
        for id_, _d, _sid, conversation, thread, subject in conn.execute(sql, [channel, *chunk]):
            subj = bare(subject) if isinstance(subject, str) else ""
            if subj:
                wanted.append((int(id_), str(conversation), str(thread or ""), subj))
    if not wanted:
        return {}
    first = min(w[0] for w in wanted)
    erased_set = set(erased)
    found: dict[int, tuple[str, str]] = {}
    sql = (
        f"{_ROW} WHERE channel = ? AND id > ? AND json_valid(extra) "
        f"AND json_extract(extra, '$.subject') != '' AND {NOT_ERASED}"
    )
    for id_, d, sid, conversation, thread, subject in conn.execute(sql, (channel, first)):
        if int(id_) in erased_set or not isinstance(subject, str):
            continue
        subj = bare(subject)
        for mail_id, mail_conv, mail_thread, mail_subj in wanted:
            same = conversation == mail_conv or (mail_thread and thread == mail_thread)
            if int(id_) > mail_id and same and mail_subj in subj:
                found[int(id_)] = (str(d), str(sid))
                break
    return found


def drop_subjects(conn: sqlite3.Connection, erasure_id: int, row_ids: Sequence[int]) -> None:
    """Take the subject out of these rows' text and extra; the caller holds the grant."""
    for chunk in chunks(list(row_ids)):
        rows = conn.execute(
            f"SELECT id, text, extra FROM log WHERE id IN ({marks(len(chunk))})",  # noqa: S608
            list(chunk),
        ).fetchall()
        for id_, text, extra_raw in rows:
            extra = json.loads(extra_raw)
            subject = str(extra.get("subject") or "")
            extra["subject"] = ""
            extra["subject_erased"] = erasure_id
            conn.execute(
                "UPDATE log SET text = ?, extra = ? WHERE id = ?",
                (
                    without_subject(str(text), subject),
                    json.dumps(extra, separators=(",", ":"), ensure_ascii=False),
                    id_,
                ),
            )


def without_subject(text: str, subject: str) -> str:
    """The text of a mail without its ``Subject:`` line (its gateway puts it first,
    followed by a blank line)."""
    head = f"Subject: {subject}"
    if subject and text.startswith(head) and text[len(head) : len(head) + 1] in ("", "\n"):
        return text[len(head) :].lstrip("\n")
    return text
