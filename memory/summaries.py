"""Layer 1: conversation summaries over exact ranges of the log (DESIGN.md, seed 002).

A summary names the conversation and the first and last log ids it covers: every row of that
conversation between them, none erased, all of one privacy class (a summary never spans an audience
change, so it is shown only where every message it covers could be shown: it inherits its range's
privacy and conversation). Summaries are derived by the jobs (worker/summarize_job.py) and applied
here by the worker, the only writer, after checking the proposal again against memory as it is now
(:func:`apply`): the range still exists, nothing in it was erased since the job read it (a
proposal that does not say how many messages it read is refused when the range holds an erased
one), no current summary covers any of it (unless the proposal supersedes exactly that one). A
refused proposal is never applied, and its range is planned again as a new job over what
remains (worker/derive.py notices the erasure: :func:`erased_since`). A summary is never
edited: a new version supersedes the old (``supersedes``); an erasure of a covered row
tombstones it (:func:`tombstone`, under the erasure's grant) and the range is derived again from
what remains.

Applying is idempotent on the job's key (conversation, first id, last id, version): a job run twice,
or a derived entry replayed after a crash, adds one summary.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memory.rows import LOG_COLUMNS, NOT_ERASED, LogRow, build
from memory.sql import chunks, marks

Method = Literal["model", "fallback"]

COLUMNS = (
    "id, conversation, channel, privacy, first_id, last_id, rows, first_ts, last_ts, text, "
    "method, job_key, supersedes, erased, created"
)
# not superseded by another summary, not tombstoned
CURRENT = (
    "erased IS NULL AND NOT EXISTS (SELECT 1 FROM summary AS newer "
    "WHERE newer.supersedes = summary.id)"
)
_RANGE = f"SELECT {LOG_COLUMNS} FROM log WHERE conversation = ? AND id BETWEEN ? AND ? ORDER BY id"  # noqa: S608


@dataclass(frozen=True)
class Summary:
    id: int
    conversation: str
    channel: str
    privacy: str
    first_id: int
    last_id: int
    rows: int
    first_ts: float
    last_ts: float
    text: str
    method: str
    job_key: str
    supersedes: int | None
    erased: int | None
    created: float


@dataclass(frozen=True)
class Proposal:
    """A summary a job proposes (validated again by :func:`apply`)."""

    conversation: str
    first_id: int
    last_id: int
    text: str
    method: Method
    job_key: str
    supersedes: int | None = None
    rows: int | None = None  # how many (not erased) messages the job read in the range


MAX_ID = 2**62
MAX_TEXT = 4000  # memory.segments.MAX_SUMMARY_CHARS: what a job may propose


def _id(value: Any, name: str) -> int:
    n = int(value)
    if not 0 < n < MAX_ID:
        raise ValueError(f"{name} out of range: {n}")
    return n


def proposal_of(conversation: str, text: str, extra: Mapping[str, Any]) -> Proposal:
    """The proposal a job's derived entry carries (``extra.type == "summary"``); ValueError,
    KeyError or TypeError when it is not one."""
    supersedes, rows = extra.get("supersedes"), extra.get("rows")
    if len(text) > MAX_TEXT:
        raise ValueError(f"a summary of {len(text)} characters (at most {MAX_TEXT})")
    return Proposal(
        conversation=conversation,
        first_id=_id(extra["first_id"], "first_id"),
        last_id=_id(extra["last_id"], "last_id"),
        text=text,
        method="fallback" if extra.get("method") == "fallback" else "model",
        job_key=str(extra["job_key"]),
        supersedes=None if supersedes is None else _id(supersedes, "supersedes"),
        rows=None if rows is None else _id(rows, "rows"),
    )


class Refused(ValueError):
    """A proposal memory does not take (the reason is the message)."""


def job_key(conversation: str, first_id: int, last_id: int, version: int = 1) -> str:
    """The idempotency key of deriving this exact range (``version`` > 1: a re-derivation)."""
    return f"{conversation}@{first_id}-{last_id}#v{version}"


def summary_of(raw: Sequence[object]) -> Summary:
    (id_, conv, channel, privacy, first, last, rows, fts_, lts, text, method, key, sup, erased,
     created) = raw  # fmt: skip
    return Summary(
        int(id_),  # type: ignore[call-overload]
        str(conv),
        str(channel),
        str(privacy),
        int(first),  # type: ignore[call-overload]
        int(last),  # type: ignore[call-overload]
        int(rows),  # type: ignore[call-overload]
        float(fts_),  # type: ignore[arg-type]
        float(lts),  # type: ignore[arg-type]
        str(text),
        str(method),
        str(key),
        None if sup is None else int(sup),  # type: ignore[call-overload]
        None if erased is None else int(erased),  # type: ignore[call-overload]
        float(created),  # type: ignore[arg-type]
    )


def range_rows(conn: sqlite3.Connection, conversation: str, first: int, last: int) -> list[LogRow]:
    """Every row of the conversation from log id ``first`` to ``last`` (erased ones included)."""
    return [build(tuple(r)) for r in conn.execute(_RANGE, (conversation, first, last))]


def live_rows(conn: sqlite3.Connection, conversation: str, first: int, last: int) -> list[LogRow]:
    """The range's rows an erasure has not blanked: what a summary of the range covers (a
    range re-derived after an erasure has holes where the erased messages were)."""
    return [r for r in range_rows(conn, conversation, first, last) if not is_erased(r)]


def is_erased(row: LogRow) -> bool:
    return row.extra.startswith('{"erased":')


def by_key(conn: sqlite3.Connection, key: str) -> Summary | None:
    raw = conn.execute(f"SELECT {COLUMNS} FROM summary WHERE job_key = ?", (key,)).fetchone()  # noqa: S608
    return None if raw is None else summary_of(raw)


def by_id(conn: sqlite3.Connection, summary_id: int) -> Summary | None:
    raw = conn.execute(f"SELECT {COLUMNS} FROM summary WHERE id = ?", (summary_id,)).fetchone()  # noqa: S608
    return None if raw is None else summary_of(raw)


def is_current(conn: sqlite3.Connection, summary_id: int) -> bool:
    sql = f"SELECT 1 FROM summary WHERE id = ? AND {CURRENT}"  # noqa: S608
    return conn.execute(sql, (summary_id,)).fetchone() is not None


def current(conn: sqlite3.Connection, conversation: str) -> list[Summary]:
    """The conversation's current summaries, oldest range first."""
    sql = f"SELECT {COLUMNS} FROM summary WHERE conversation = ? AND {CURRENT} ORDER BY first_id"  # noqa: S608
    return [summary_of(r) for r in conn.execute(sql, (conversation,))]


def newest_before(
    conn: sqlite3.Connection, conversation: str, before_id: int, limit: int
) -> list[Summary]:
    """The conversation's newest ``limit`` current summaries ending below ``before_id``, newest
    first (the (conversation, last_id) index: flat with the number of summaries)."""
    sql = (
        f"SELECT {COLUMNS} FROM summary WHERE conversation = ? AND last_id < ? AND {CURRENT} "  # noqa: S608
        "ORDER BY last_id DESC LIMIT ?"
    )
    return [summary_of(r) for r in conn.execute(sql, (conversation, before_id, limit))]


def listing(
    conn: sqlite3.Connection, conversation: str | None = None, *, every: bool = False
) -> list[Summary]:
    """Summaries (current ones; ``every``: superseded and tombstoned too), by conversation and
    range."""
    where, params = ("1", []) if every else (CURRENT, [])
    if conversation is not None:
        where += " AND conversation = ?"
        params.append(conversation)
    sql = f"SELECT {COLUMNS} FROM summary WHERE {where} ORDER BY conversation, first_id, id"  # noqa: S608
    return [summary_of(r) for r in conn.execute(sql, params)]


def covered_until(conn: sqlite3.Connection, conversation: str) -> int:
    """The highest log id a current summary of the conversation covers (0: none)."""
    sql = f"SELECT MAX(last_id) FROM summary WHERE conversation = ? AND {CURRENT}"  # noqa: S608
    found = conn.execute(sql, (conversation,)).fetchone()[0]
    return int(found or 0)


def check(conn: sqlite3.Connection, p: Proposal) -> list[LogRow]:
    """The range's rows if memory takes the proposal now; :class:`Refused` with why not."""
    if p.first_id > p.last_id:
        raise Refused(f"an empty range ({p.first_id} > {p.last_id})")
    if not p.text.strip():
        raise Refused("an empty summary")
    every = range_rows(conn, p.conversation, p.first_id, p.last_id)
    rows = [r for r in every if not is_erased(r)]
    if not rows or rows[0].id != p.first_id or rows[-1].id != p.last_id:
        raise Refused(f"the range {p.first_id}..{p.last_id} is not in {p.conversation!r}")
    if p.rows is not None and len(rows) != p.rows:  # rows only ever go by an erasure
        raise Refused("a message of the range was erased since the job read it")
    if p.rows is None and len(rows) != len(every):  # it may have read the erased one
        raise Refused("the range holds an erased message, and the proposal does not say how "
                      "many it read")  # fmt: skip
    if len({r.privacy for r in rows}) > 1:
        raise Refused("the range spans a change of privacy (an audience change)")
    if p.supersedes is not None:
        old = by_id(conn, p.supersedes)
        if old is None or old.conversation != p.conversation or not is_current(conn, old.id):
            raise Refused(f"summary {p.supersedes} is not a current summary of the conversation")
    overlap = conn.execute(
        f"SELECT id FROM summary WHERE conversation = ? AND {CURRENT} "  # noqa: S608
        "AND first_id <= ? AND last_id >= ?",
        (p.conversation, p.last_id, p.first_id),
    ).fetchall()
    others = sorted(int(r[0]) for r in overlap if int(r[0]) != p.supersedes)
    if others:
        raise Refused(f"already covered by summary {others[0]}")
    return rows


def apply(conn: sqlite3.Connection, p: Proposal, now: float | None = None) -> Summary:
    """Insert the proposal (in the caller's write transaction) and return it; the summary
    recorded before under the same job key, unchanged, if there is one. :class:`Refused`."""
    existing = by_key(conn, p.job_key)
    if existing is not None:
        return existing
    rows = check(conn, p)
    first, last = rows[0], rows[-1]
    conn.execute(
        f"INSERT INTO summary ({COLUMNS.removeprefix('id, ')}) "  # noqa: S608
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
        (
            p.conversation, first.channel, first.privacy, p.first_id, p.last_id, len(rows),
            first.ts, last.ts, p.text, p.method, p.job_key, p.supersedes,
            time.time() if now is None else now,
        ),
    )  # fmt: skip
    made = by_key(conn, p.job_key)
    assert made is not None
    return made


def tombstone(conn: sqlite3.Connection, erasure_id: int, log_ids: Sequence[int]) -> list[int]:
    """Blank every summary whose range holds one of these (erased) log rows; the caller holds the
    erasure's grant. Returns the ids blanked (their ranges are derived again from what remains)."""
    hit = covering(conn, log_ids)
    for chunk in chunks(hit):
        conn.execute(
            f"UPDATE summary SET text = '', erased = ? WHERE id IN ({marks(len(chunk))})",  # noqa: S608
            [erasure_id, *chunk],
        )
    return hit


def covering(conn: sqlite3.Connection, log_ids: Iterable[int]) -> list[int]:
    """The summaries not yet blanked whose range holds one of these log rows."""
    hit: set[int] = set()
    for chunk in chunks(sorted(set(log_ids))):
        sql = (
            "SELECT DISTINCT s.id FROM summary AS s "  # noqa: S608
            "JOIN log AS l ON l.conversation = s.conversation "
            f"WHERE l.id IN ({marks(len(chunk))}) AND l.id BETWEEN s.first_id AND s.last_id "
            "AND s.erased IS NULL"
        )
        hit.update(int(r[0]) for r in conn.execute(sql, list(chunk)))
    return sorted(hit)


def erased_since(
    conn: sqlite3.Connection, after: int | None
) -> tuple[int, list[tuple[str, int, float]]]:
    """The newest erasure's id, and the conversations the erasures after ``after`` took rows
    from, each with its newest row's id and time (``after`` None: the id only). A job that read
    such a row proposes a summary memory refuses (:func:`check`): the worker plans the range
    again (worker/derive.py)."""
    newest = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM erasure").fetchone()[0])
    if after is None or newest <= after:
        return newest, []
    ids: set[int] = set()
    for (raw,) in conn.execute("SELECT detail FROM erasure WHERE id > ?", (after,)):
        try:
            detail = json.loads(raw or "{}")
        except ValueError:
            continue
        logged = detail.get("log_ids", []) if isinstance(detail, dict) else []
        ids.update(i for i in logged if isinstance(i, int))
    conversations: set[str] = set()
    for chunk in chunks(sorted(ids)):
        sql = f"SELECT DISTINCT conversation FROM log WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        conversations.update(str(c) for (c,) in conn.execute(sql, list(chunk)))
    out = []
    for conversation in sorted(conversations):
        top, ts = conn.execute(
            "SELECT MAX(id), MAX(recorded_ts) FROM log WHERE conversation = ?", (conversation,)
        ).fetchone()
        if top is not None:
            out.append((conversation, int(top), float(ts or 0.0)))
    return newest, out


def rows_after(
    conn: sqlite3.Connection, conversation: str, after_id: int, limit: int
) -> list[LogRow]:
    """The conversation's rows above ``after_id``, oldest first, erased ones left out."""
    sql = (
        f"SELECT {LOG_COLUMNS} FROM log WHERE conversation = ? AND id > ? AND {NOT_ERASED} "  # noqa: S608
        "ORDER BY id LIMIT ?"
    )
    return [build(tuple(r)) for r in conn.execute(sql, (conversation, after_id, limit))]


def next_uncovered(
    conn: sqlite3.Connection, conversation: str, limit: int
) -> tuple[list[LogRow], bool]:
    """The conversation's oldest run of rows no current summary covers (erased rows left out):
    first what a tombstoned summary covered (derived again from what remains: a complete
    segment, see :func:`reopened`; then True), then what follows the newest summary."""
    found = reopened(conn, conversation)
    if found is not None:
        return found[:limit], True
    return rows_after(conn, conversation, covered_until(conn, conversation), limit), False


def reopened(conn: sqlite3.Connection, conversation: str) -> list[LogRow] | None:
    """What remains of the oldest range whose summary an erasure blanked and no current one
    covers yet: a complete segment, whatever its length (None: there is none)."""
    sql = (
        "SELECT first_id, last_id FROM summary WHERE conversation = ? AND erased IS NOT NULL "
        "ORDER BY first_id"
    )
    for first, last in conn.execute(sql, (conversation,)).fetchall():
        covered = f"SELECT 1 FROM summary WHERE conversation = ? AND {CURRENT} AND first_id <= ? AND last_id >= ?"  # noqa: S608,E501
        if conn.execute(covered, (conversation, last, first)).fetchone() is not None:
            continue
        rows = live_rows(conn, conversation, int(first), int(last))
        if rows:
            return rows
    return None
