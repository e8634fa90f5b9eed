"""What an erasure takes of the scheduled items (memory/schedule.py), and how it takes it.

An erasure (memory/erasure.py, planned by memory/erasure_plan.py) takes these items:

- of a **conversation**: every item set in it (:func:`of_conversation`);
- of a **person**: every item they set, in any conversation (:func:`of_person`: by the setter's
  entity, or by their handle for an item stored without one);
- set in a **turn** whose text goes (:func:`set_in`): the turn of a target message (a message
  erased by id, or redacted on its platform, that set a reminder), or of a reply derived from
  erased text (the model may have put that text in the reminder), as a note written in such a
  turn goes.

An item that goes is ended for good: ``status = 'erased'``, its text blanked, ``end_reason
'erased'`` (:func:`blank`, under the erasure's grant: the schema refuses it otherwise). Its
occurrences' log rows go with it (:func:`occurrence_rows`): each holds its text under a header,
and is recorded with the scheduler as its sender, not the person who set it, so the person's rows
alone would miss them; what drew on those rows (the reply that delivered the reminder, and so on)
goes by the erasure's own cascade. The ledger of its runs (``scheduled_runs``) holds no text and
stays.

The tombstone names the items by id and by the turn or command that set them
(:func:`keys`), so a restored backup that still holds one finds it and erases it again
(memory/importer.py, :func:`by_keys`), and the worker deletes the entry of an owner command that
set one (it holds the text: :func:`command_entries`, memory/copies.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from memory.schedule import command_key
from memory.sql import chunks, marks

Rows = dict[int, tuple[str, str]]  # log id -> (direction, stream id), as erasure_plan has them

_LIVE = "status != 'erased'"
_COMMAND = command_key("")
# an occurrence's inbound row, by its event id schedule:<id>:<occurrence> on the item's channel
# (the index of inbound rows by event id: migration 9), not erased yet
_BY_EVENT = (
    "SELECT id, direction, stream_id FROM log WHERE direction = 'in' AND channel = ? "
    "AND event_id >= ? AND event_id < ? AND extra NOT LIKE '{\"erased\":%'"
)
# ... and by the stream id its run recorded (the same row, or one recorded on another channel)
_BY_RUN = (
    "SELECT l.id, l.direction, l.stream_id FROM scheduled_runs AS r JOIN log AS l "
    "ON l.direction = 'in' AND l.stream_id = r.stream_id "
    "WHERE r.item = ? AND l.extra NOT LIKE '{\"erased\":%'"
)


def of_conversation(conn: sqlite3.Connection, conversation: str) -> list[int]:
    """The items set in ``conversation`` that are not erased yet."""
    sql = f"SELECT id FROM scheduled WHERE conversation = ? AND {_LIVE} ORDER BY id"  # noqa: S608
    return [int(i) for (i,) in conn.execute(sql, (conversation,))]


def of_person(
    conn: sqlite3.Connection, entities: Sequence[str], handles: Collection[tuple[str, str]]
) -> list[int]:
    """The items a person set (not erased yet): their entity is one of ``entities``, or it was
    stored without one and its (channel, setter handle), casefolded, is one of ``handles``."""
    found: set[int] = set()
    for chunk in chunks(list(entities)):
        sql = f"SELECT id FROM scheduled WHERE setter_entity IN ({marks(len(chunk))}) AND {_LIVE}"  # noqa: S608
        found.update(int(i) for (i,) in conn.execute(sql, list(chunk)))
    if handles:
        sql = f"SELECT id, channel, setter FROM scheduled WHERE setter_entity IS NULL AND {_LIVE}"  # noqa: S608
        for id_, channel, setter in conn.execute(sql):
            if (str(channel).strip().casefold(), str(setter).strip().casefold()) in handles:
                found.add(int(id_))
    return sorted(found)


def set_in(conn: sqlite3.Connection, stream_id: str) -> list[int]:
    """The items set by the turn of the entry ``stream_id`` (not erased yet)."""
    sql = f"SELECT id FROM scheduled WHERE created_by = ? AND {_LIVE} ORDER BY id"  # noqa: S608
    return [int(i) for (i,) in conn.execute(sql, (stream_id,))]


def occurrence_rows(conn: sqlite3.Connection, item_ids: Iterable[int]) -> Rows:
    """The log rows of these items' occurrences that are not erased yet: by their event id
    (``schedule:<id>:<occurrence>``) and by the stream ids their runs recorded."""
    rows: Rows = {}
    for item_id in item_ids:
        raw = conn.execute("SELECT channel FROM scheduled WHERE id = ?", (item_id,)).fetchone()
        if raw is None:
            continue
        prefix = f"schedule:{int(item_id)}:"
        upper = prefix[:-1] + ";"  # the next character after ':': every occurrence in between
        for sql, params in (
            (_BY_EVENT, (str(raw[0]), prefix, upper)),
            (_BY_RUN, (item_id,)),
        ):
            for id_, direction, sid in conn.execute(sql, params):
                rows[int(id_)] = (str(direction), str(sid))
    return rows


def keys(conn: sqlite3.Connection, item_ids: Sequence[int]) -> list[tuple[int, str]]:
    """(id, created_by) of each item: what the tombstone names them by (no text)."""
    out: list[tuple[int, str]] = []
    for chunk in chunks(sorted(item_ids)):
        sql = f"SELECT id, created_by FROM scheduled WHERE id IN ({marks(len(chunk))}) ORDER BY id"  # noqa: S608
        out += [(int(i), str(c)) for i, c in conn.execute(sql, list(chunk))]
    return out


def by_keys(conn: sqlite3.Connection, raw_keys: object) -> list[int]:
    """The items here, not erased yet, that a tombstone's ``scheduled_keys`` name (the same id
    *and* the same turn or command that set it: another item that took a free id is not one)."""
    found: list[int] = []
    for key in raw_keys if isinstance(raw_keys, list) else []:
        if not (isinstance(key, list) and len(key) == 2 and isinstance(key[0], int)):
            continue
        hit = conn.execute(
            f"SELECT id FROM scheduled WHERE id = ? AND created_by = ? AND {_LIVE}",  # noqa: S608
            (key[0], str(key[1])),
        ).fetchone()
        if hit is not None:
            found.append(int(hit[0]))
    return sorted(found)


def texts(conn: sqlite3.Connection, item_ids: Sequence[int]) -> list[str]:
    """The items' texts, read before they are blanked (the worker looks for copies of them)."""
    out: list[str] = []
    for chunk in chunks(sorted(item_ids)):
        sql = f"SELECT text FROM scheduled WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        out += [str(t) for (t,) in conn.execute(sql, list(chunk)) if t]
    return out


def blank(conn: sqlite3.Connection, item_ids: Sequence[int], now: float) -> None:
    """End the items for good and blank their text; the caller holds the erasure's grant."""
    for chunk in chunks(sorted(item_ids)):
        conn.execute(
            "UPDATE scheduled SET text = '', status = 'erased', next_due = NULL, "  # noqa: S608
            "ended = coalesce(ended, ?), end_reason = 'erased' "
            f"WHERE id IN ({marks(len(chunk))})",
            [now, *chunk],
        )


def command_entries(detail: Mapping[str, Any]) -> set[str]:
    """The stream ids of the owner commands that set the erased items (``cmd:<stream id>``):
    their entries hold the items' text."""
    out: set[str] = set()
    for key in detail.get("scheduled_keys", []):
        by = key[1] if isinstance(key, list) and len(key) == 2 else None
        if isinstance(by, str) and by.startswith(_COMMAND):
            out.add(by.removeprefix(_COMMAND))
    return out
