"""The replies derived from erased text: those whose model input held it (memory.provenance).

A reply row keeps what its context drew on (``extra.drew_on``): the oldest history row it held,
the rows a tool showed, the notes it showed, the summaries it was offered. A reply is *derived*
from a row when a tool showed that row, or when the row lies in the reply's history span (from
``from`` up to the reply, in the log's time order, among the rows that were there) and the
reply's conversation could see it (memory.privacy: the same rule that built the history); from a
note when the context or ``recall`` showed that note; from a summary it was offered whose range
holds one of the rows; from a profile fact it was shown (or quoted as contradicted) that goes
with one of the rows (memory/profile_erasure.py ``affected``: by its evidence, or by the range a
job made it from).

This is one hop; memory/erasure_plan.py calls it once per hop (the rows and notes found at one
hop are what the next hop looks for), up to its bound. Each reply found says what it drew on
(:class:`Derived`), for the erasure's preview and tombstone. Replies from before provenance was
recorded drew on nothing that can be told, and are left alone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
from typing import Any

from contract.messages import Privacy
from memory import profile_erasure, summaries
from memory.identity import person_of
from memory.privacy import Scope, log_row_visible
from memory.provenance import KEY, DrewOn
from memory.rows import LOG_COLUMNS, NOT_ERASED, LogRow, build
from memory.sql import chunks, marks


@dataclass(frozen=True)
class Derived:
    """A reply whose model input held one of the rows or notes: its stream id, what it drew on
    (``("log", id)``, ``("note", id)`` or ``("summary", id)``)."""

    stream_id: str
    source: tuple[str, int]

    @property
    def drew_on(self) -> str:
        return f"{self.source[0]} #{self.source[1]}"


def derived_replies(
    conn: sqlite3.Connection,
    log_ids: Collection[int],
    note_ids: Collection[int],
    *,
    exclude: Collection[int] = (),
) -> dict[int, Derived]:
    """The replies derived from these rows and notes, themselves and ``exclude`` left out."""
    erased_rows = _rows(conn, log_ids)
    erased_notes = set(note_ids)
    if not erased_rows and not erased_notes:
        return {}
    floor = min(erased_rows) if erased_rows else 0
    sql = (
        f"SELECT {LOG_COLUMNS} FROM log WHERE direction = 'out' AND extra LIKE ? "  # noqa: S608
        f"AND {NOT_ERASED}"
    )
    params: list[Any] = [f'%"{KEY}"%']
    if not erased_notes:  # only replies newer than the oldest erased row can hold it
        sql += " AND id > ?"
        params.append(floor)
    hit = set(summaries.covering(conn, erased_rows))  # the summaries the erasure blanks
    facts_hit = set(profile_erasure.affected(conn, erased_rows)[0])  # ... and the facts
    entity_of = _entity_of(conn)
    time_of = _time_of(conn)
    persons = cache(lambda entity: person_of(conn, entity))
    skip = set(exclude)
    found: dict[int, Derived] = {}
    for raw in conn.execute(sql, params):
        reply = build(tuple(raw))
        if reply.id in erased_rows or reply.id in skip:
            continue
        try:
            drew = DrewOn.from_extra(json.loads(reply.extra or "{}"))
        except ValueError:
            continue
        source = _shown(drew, erased_rows.keys(), erased_notes, hit, facts_hit)
        if source is not None:
            found[reply.id] = Derived(reply.stream_id, source)
            continue
        if not drew.history_from or drew.history_from >= reply.id:
            continue
        start = (time_of(drew.history_from), drew.history_from)
        end = (reply.recorded_ts, reply.id)
        span = [  # in the log's time order (memory.rows.order_key), among the rows there then
            r for i, r in erased_rows.items() if i < reply.id and start <= (r.recorded_ts, i) < end
        ]
        if not span:
            continue
        entity = entity_of(reply.stream_id)
        try:
            scope = Scope(reply.conversation, Privacy(reply.privacy), entity)
        except ValueError:  # an unknown class sees nothing (memory.privacy fails closed)
            continue
        seen_by = persons(entity) if entity else frozenset()
        held = [r.id for r in span if log_row_visible(scope, r, persons=seen_by)]
        if held:
            found[reply.id] = Derived(reply.stream_id, ("log", min(held)))
    return found


def _shown(
    drew: DrewOn,
    rows: Collection[int],
    notes: Collection[int],
    summaries_hit: Collection[int],
    facts_hit: Collection[int] = (),
) -> tuple[str, int] | None:
    """What of these a tool, the notes section, the summaries or the profiles section showed the
    reply."""
    for kind, shown, wanted in (
        ("log", drew.rows, rows),
        ("note", drew.notes, notes),
        ("summary", drew.summaries, summaries_hit),
        ("fact", drew.facts, facts_hit),
    ):
        hits = sorted(i for i in shown if i in wanted)
        if hits:
            return (kind, hits[0])
    return None


def _rows(conn: sqlite3.Connection, ids: Collection[int]) -> dict[int, LogRow]:
    out: dict[int, LogRow] = {}
    for chunk in chunks(sorted(ids)):
        for raw in conn.execute(
            f"SELECT {LOG_COLUMNS} FROM log WHERE id IN ({marks(len(chunk))})",  # noqa: S608
            list(chunk),
        ):
            row = build(tuple(raw))
            out[row.id] = row
    return out


def _time_of(conn: sqlite3.Connection) -> Callable[[int], float]:
    """A row's recorded_ts by id (its place in the log's time order); +inf if it is gone."""

    @cache
    def time_of(row_id: int) -> float:
        raw = conn.execute("SELECT recorded_ts FROM log WHERE id = ?", (row_id,)).fetchone()
        return float(raw[0]) if raw is not None and isinstance(raw[0], int | float) else _INF

    return time_of


_INF = float("inf")


def _entity_of(conn: sqlite3.Connection) -> Callable[[str], str | None]:
    """The entity of the person a reply answered (its scope's entity), by stream id."""

    @cache
    def entity_of(stream_id: str) -> str | None:
        raw = conn.execute(
            "SELECT entity FROM log WHERE direction = 'in' AND stream_id = ?", (stream_id,)
        ).fetchone()
        return None if raw is None or raw[0] is None else str(raw[0])

    return entity_of
