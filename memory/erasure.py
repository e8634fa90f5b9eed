"""The owner's audited erasure (``memory.erase``, ``relaybot memory erase``): the one exception
to append-only.

In one transaction (a savepoint inside the worker's batch) it inserts the ``erasure_grant`` row,
which is what lets the triggers of memory/schema.py allow UPDATE and DELETE; removes the text of
the matching log rows (``text = ''``, ``extra = {"erased": <erasure id>}``; the FTS index follows
through its triggers); deletes what was derived from them (notes learned from them, and the notes
that supersede those); writes the tombstone in ``erasure`` (target, when, why, counts, the ids in
``detail``); deletes the grant. With ``secure_delete`` on, an FTS ``optimize`` (so no index segment
keeps a deleted word) and a WAL checkpoint after the commit, none of the text stays in the
database files. What a target covers:

- ``conversation C``: every row of C, both directions, and notes learned in C or kept for C;
- ``entity E`` (an entity id or a handle ``channel:address``): everything that *person* said —
  inbound rows of E and of every entity joined to it by verified links (memory.identity), plus
  rows from before identity existed whose sender is one of their handles — with the replies that
  answered those rows, and notes learned from that person;
- ``id N``: that row, with the reply that answered it if it is a message; notes written in that
  turn.

Quotes: a reply mail keeps the earlier mail it quotes in ``extra.quoted`` (gateways/
email_quote.py), a copy of text this erasure removes. A kept row loses its quote (``quoted`` is
dropped, ``quote_erased: <erasure id>`` says why) when it comes after an erased row of the same
conversation, or when its quote holds the text of an erased row anywhere (compared without ``>``
marks, line breaks and case). Its stream entry holds the quote too: the tombstone names these rows
(``quote_ids``, ``quote_keys``) and memory/copies.py adds their entries to what the worker
deletes.

Subjects: an erased mail's subject is repeated by the replies in its thread (``Re: …``): those
rows lose it (memory/subjects.py; the tombstone names them as ``subject_ids``, ``subject_keys``),
and the replies whose model input held such a row are derived from it (erased, as above).

A replay (same stream id) returns the tombstone already written; a target with nothing left to
erase is refused without a tombstone. The worker applies it as the owner command ``memory.erase``
(:data:`COMMANDS`); ``relaybot memory erase`` previews it with :func:`plan_erasure` first.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from memory import summaries
from memory.command_types import CommandContext, CommandError, Handler
from memory.derived import derived_replies
from memory.identity import handles_of, person_of, resolve_ref
from memory.rows import NOT_ERASED
from memory.sql import chunks, marks, savepoint
from memory.store import MemoryStore
from memory.subjects import drop_subjects, subject_rows

log = structlog.get_logger(__name__)

TARGET_KINDS = ("entity", "conversation", "id")


@contextmanager
def writing(store: MemoryStore) -> Iterator[None]:
    """Inside the worker's batch transaction as it is; else in a transaction of our own.

    The batch's new rows are indexed first, so that an erasure takes their words out of the index
    at once (a row not indexed yet is indexed later with its erased text: migration 7)."""
    if store.conn.in_transaction:
        store.sync_index()
        yield
    elif store.in_batch:
        # SQLite rolled the worker's batch back (disk full, I/O error): a database error, which
        # the worker handles (degraded mode); the commit of the batch reports it too
        raise sqlite3.OperationalError("the memory transaction was rolled back by SQLite")
    else:
        with store.transaction():
            yield


# -- planning -----------------------------------------------------------------------------------


@dataclass
class ErasurePlan:
    """What an erasure of ``kind``/``target`` removes (read-only: the CLI previews it too)."""

    kind: str
    target: str
    entities: list[str] = field(default_factory=list)
    log_ids: list[int] = field(default_factory=list)
    log_keys: list[tuple[str, str]] = field(default_factory=list)
    note_ids: list[int] = field(default_factory=list)
    note_keys: list[str] = field(default_factory=list)
    derived_ids: list[int] = field(default_factory=list)  # replies that drew on the text
    quote_ids: list[int] = field(default_factory=list)  # kept rows whose quote is removed
    quote_keys: list[tuple[str, str]] = field(default_factory=list)
    subject_ids: list[int] = field(default_factory=list)  # kept mails whose subject is removed
    subject_keys: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.log_ids and not self.note_ids

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "log_ids": self.log_ids,
            "log_keys": [list(k) for k in self.log_keys],
            "note_ids": self.note_ids,
            "note_op_keys": self.note_keys,
        }
        if self.derived_ids:
            out["derived_replies"] = self.derived_ids
        if self.quote_ids:
            out["quote_ids"] = self.quote_ids
            out["quote_keys"] = [list(k) for k in self.quote_keys]
        if self.subject_ids:
            out["subject_ids"] = self.subject_ids
            out["subject_keys"] = [list(k) for k in self.subject_keys]
        if self.entities:
            out["entities"] = self.entities
        return out


def plan_erasure(conn: sqlite3.Connection, kind: str, target: str) -> ErasurePlan:
    """The rows and notes an erasure would remove; raises CommandError for a bad target."""
    target = target.strip()
    if kind not in TARGET_KINDS:
        raise CommandError(f"erase what? kind must be one of {', '.join(TARGET_KINDS)}")
    if not target:
        raise CommandError("erase what? the target is empty")
    plan = ErasurePlan(kind=kind, target=target)
    rows: dict[int, tuple[str, str]] = {}  # id -> (direction, stream_id)
    notes_sql: list[tuple[str, list[Any]]] = []
    if kind == "conversation":
        for id_, d, sid in conn.execute(
            f"SELECT id, direction, stream_id FROM log WHERE conversation = ? AND {NOT_ERASED}",  # noqa: S608
            (target,),
        ):
            rows[int(id_)] = (str(d), str(sid))
        notes_sql.append(("source_conversation = ? OR chat = ?", [target, target]))
    elif kind == "id":
        try:
            row_id = int(target)
        except ValueError:
            raise CommandError(f"not a log id: {target!r}") from None
        raw = conn.execute(
            "SELECT direction, stream_id FROM log WHERE id = ?", (row_id,)
        ).fetchone()
        if raw is None:
            raise CommandError(f"there is no log row {row_id}")
        if conn.execute(
            f"SELECT 1 FROM log WHERE id = ? AND {NOT_ERASED}",  # noqa: S608
            (row_id,),
        ).fetchone():
            rows[row_id] = (str(raw[0]), str(raw[1]))
        _add_edits(conn, rows, row_id)
        inbound = [sid for d, sid in rows.values() if d == "in"]
        _add_replies(conn, rows, inbound)
    else:
        plan.entities = _person(conn, target)
        _rows_of_person(conn, plan.entities, rows)
        notes_sql.append((f"source_entity IN ({marks(len(plan.entities))})", plan.entities))
    if kind == "entity":
        _add_replies(conn, rows, [sid for d, sid in rows.values() if d == "in"])
    _turn_notes(notes_sql, {sid for _d, sid in rows.values()})
    plan_notes(conn, plan, notes_sql)
    # the replies whose model input held the text, and the notes written in their turns
    derived = derived_replies(conn, rows, plan.note_ids)
    if derived:
        rows.update({i: ("out", sid) for i, sid in derived.items()})
        _turn_notes(notes_sql, set(derived.values()))
        plan_notes(conn, plan, notes_sql)
    subjects = _subjects(conn, plan, rows, derived, notes_sql)
    plan.subject_ids = sorted(subjects)
    plan.subject_keys = [subjects[i] for i in plan.subject_ids]
    plan.derived_ids = sorted(derived)
    plan.log_ids = sorted(rows)
    plan.log_keys = [rows[i] for i in plan.log_ids]
    quotes = _quoting_rows(conn, plan.log_ids)
    plan.quote_ids = sorted(quotes)
    plan.quote_keys = [quotes[i] for i in plan.quote_ids]
    return plan


def _subjects(
    conn: sqlite3.Connection,
    plan: ErasurePlan,
    rows: dict[int, tuple[str, str]],
    derived: dict[int, str],
    notes_sql: list[tuple[str, list[Any]]],
) -> dict[int, tuple[str, str]]:
    """The kept mails that repeat an erased mail's subject (memory/subjects.py); the replies
    that answered them or whose input held them join ``rows`` and ``derived`` (their model
    input held the subject), with the notes of their turns."""
    subjects = subject_rows(conn, sorted(rows))
    if not subjects:
        return subjects
    answers: dict[int, tuple[str, str]] = {}
    _add_replies(conn, answers, [sid for d, sid in subjects.values() if d == "in"])
    more = {i: sid for i, (_d, sid) in answers.items()}
    more.update(derived_replies(conn, subjects, []))
    more = {i: sid for i, sid in more.items() if i not in rows}
    derived.update(more)
    rows.update({i: ("out", sid) for i, sid in more.items()})
    _turn_notes(notes_sql, set(more.values()))
    plan_notes(conn, plan, notes_sql)
    return subjects


_NO_QUOTE = "json_set(json_remove(extra, '$.quoted'), '$.quote_erased', ?)"
_QUOTING_COLS = "id, direction, stream_id, conversation, json_extract(extra, '$.quoted')"
_HAS_QUOTE = "json_valid(extra) AND json_extract(extra, '$.quoted') IS NOT NULL"
_QUOTE_MARK = re.compile(r"^[ \t>]+", re.M)
_MIN_QUOTED_MATCH = 8  # shorter erased texts ("ok", "yes") would match every quote


def _plain(text: str) -> str:
    """Text as a quote may carry it: without ``>`` marks, line breaks, runs of blanks, case."""
    return " ".join(_QUOTE_MARK.sub("", text).split()).casefold()


def _quoting_rows(conn: sqlite3.Connection, erased: list[int]) -> dict[int, tuple[str, str]]:
    """The kept rows whose ``extra.quoted`` may copy erased text (see the module docstring)."""
    if not erased:
        return {}
    first_in: dict[str, int] = {}  # conversation -> its first erased row
    texts: set[str] = set()
    for chunk in chunks(erased):
        for id_, conversation, text in conn.execute(
            f"SELECT id, conversation, text FROM log WHERE id IN ({marks(len(chunk))})",  # noqa: S608
            list(chunk),
        ):
            conv = str(conversation)
            first_in[conv] = min(first_in.get(conv, int(id_)), int(id_))
            plain = _plain(str(text or ""))
            if len(plain) >= _MIN_QUOTED_MATCH:
                texts.add(plain)
    erased_set = set(erased)
    found: dict[int, tuple[str, str]] = {}
    quoting = f"SELECT {_QUOTING_COLS} FROM log WHERE {_HAS_QUOTE} AND {NOT_ERASED}"  # noqa: S608
    for id_, d, sid, conversation, quoted in conn.execute(quoting):
        if int(id_) in erased_set or not isinstance(quoted, str) or not quoted:
            continue
        first = first_in.get(str(conversation))
        plain = _plain(quoted) if texts else ""
        if (first is not None and int(id_) > first) or any(t in plain for t in texts):
            found[int(id_)] = (str(d), str(sid))
    return found


def _add_edits(conn: sqlite3.Connection, rows: dict[int, tuple[str, str]], row_id: int) -> None:
    """The edits of a message (Matrix ``m.replace``: rows whose ``extra.edit_of`` names its
    event, in its conversation): they repeat its text, so they go with it."""
    sql = (
        "SELECT l.id, l.direction, l.stream_id FROM log AS l JOIN log AS o "  # noqa: S608
        "ON o.id = ? AND l.conversation = o.conversation AND o.event_id != '' "
        "WHERE json_valid(l.extra) AND json_extract(l.extra, '$.edit_of') = o.event_id "
        f"AND l.{NOT_ERASED}"
    )
    found = conn.execute(sql, (row_id,)).fetchall()
    for id_, d, sid in found:
        rows[int(id_)] = (str(d), str(sid))


def _turn_notes(notes_sql: list[tuple[str, list[Any]]], stream_ids: set[str]) -> None:
    """The notes written in these turns."""
    for chunk in chunks(sorted(stream_ids)):
        notes_sql.append((f"stream_id IN ({marks(len(chunk))})", list(chunk)))


def _person(conn: sqlite3.Connection, target: str) -> list[str]:
    try:
        entity = resolve_ref(conn, target)
    except LookupError as exc:
        raise CommandError(str(exc)) from None
    return sorted(person_of(conn, entity))


def _rows_of_person(
    conn: sqlite3.Connection, entities: list[str], rows: dict[int, tuple[str, str]]
) -> None:
    for chunk in chunks(entities):
        for id_, d, sid in conn.execute(
            # on the entity's index (+: never on the direction's, half the log)
            f"SELECT id, direction, stream_id FROM log WHERE +direction = 'in' "  # noqa: S608
            f"AND entity IN ({marks(len(chunk))}) AND {NOT_ERASED}",
            list(chunk),
        ):
            rows[int(id_)] = (str(d), str(sid))
    # rows recorded before senders had entities: matched by the person's handles
    handles = {(h.channel, h.address) for e in entities for h in handles_of(conn, e)}
    if not handles:
        return
    for id_, d, sid, channel, sender in conn.execute(
        f"SELECT id, direction, stream_id, channel, sender FROM log "  # noqa: S608
        f"WHERE entity IS NULL AND direction = 'in' AND {NOT_ERASED}"
    ):
        if (str(channel).strip().casefold(), str(sender).strip().casefold()) in handles:
            rows[int(id_)] = (str(d), str(sid))


def _add_replies(
    conn: sqlite3.Connection, rows: dict[int, tuple[str, str]], stream_ids: list[str]
) -> None:
    """The replies that answered these inbound entries (derived from them)."""
    for sid in stream_ids:
        raw = conn.execute(
            f"SELECT id FROM log WHERE direction = 'out' AND stream_id = ? AND {NOT_ERASED}",  # noqa: S608
            (sid,),
        ).fetchone()
        if raw is not None:
            rows[int(raw[0])] = ("out", sid)


def plan_notes(
    conn: sqlite3.Connection, plan: ErasurePlan, where: list[tuple[str, list[Any]]]
) -> None:
    found: dict[int, str | None] = {}
    for sql, params in where:
        for id_, op_key in conn.execute(f"SELECT id, op_key FROM note WHERE {sql}", params):  # noqa: S608
            found[int(id_)] = op_key
    frontier = list(found)
    while frontier:  # notes that supersede a removed note are versions of it: removed too
        nxt: list[int] = []
        for chunk in chunks(frontier):
            for id_, op_key in conn.execute(
                f"SELECT id, op_key FROM note WHERE supersedes IN ({marks(len(chunk))})",  # noqa: S608
                list(chunk),
            ):
                if int(id_) not in found:
                    found[int(id_)] = op_key
                    nxt.append(int(id_))
        frontier = nxt
    plan.note_ids = sorted(found)
    plan.note_keys = sorted(k for k in found.values() if k)


def remove(
    conn: sqlite3.Connection,
    erasure_id: int,
    log_ids: list[int],
    notes: list[int],
    *,
    quote_ids: Sequence[int] = (),
    subject_ids: Sequence[int] = (),
) -> None:
    """Blank the log rows, drop the quotes of ``quote_ids`` and the subjects of ``subject_ids``,
    and delete the notes; the caller holds the grant."""
    marker = json.dumps({"erased": erasure_id}, separators=(",", ":"))
    for chunk in chunks(log_ids):
        conn.execute(
            f"UPDATE log SET text = '', extra = ? WHERE id IN ({marks(len(chunk))})",  # noqa: S608
            [marker, *chunk],
        )
    for chunk in chunks(list(quote_ids)):
        sql = f"UPDATE log SET extra = {_NO_QUOTE} WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        conn.execute(sql, [erasure_id, *chunk])
    drop_subjects(conn, erasure_id, subject_ids)
    for chunk in chunks(notes):
        conn.execute(f"DELETE FROM note WHERE id IN ({marks(len(chunk))})", list(chunk))  # noqa: S608
    # a summary of an erased row (or of a mail that repeated an erased subject) is blanked;
    # its range is derived again from what remains
    summaries.tombstone(conn, erasure_id, [*log_ids, *subject_ids])


@contextmanager
def granted(conn: sqlite3.Connection, requested_by: str, reason: str, now: float) -> Iterator[None]:
    """The grant that lets the triggers allow changes, for the length of the block only."""
    secure = int(conn.execute("PRAGMA secure_delete").fetchone()[0])
    conn.execute("PRAGMA secure_delete = ON")  # freed space is zeroed, not left readable
    conn.execute("PRAGMA defer_foreign_keys = ON")  # a chain of notes goes in any order
    try:
        conn.execute("DELETE FROM erasure_grant")
        conn.execute(
            "INSERT INTO erasure_grant (id, requested_by, reason, granted_at) VALUES (1, ?, ?, ?)",
            (requested_by, reason, now),
        )
        yield
        # no index segment may keep an erased word (FTS5 deletes are markers until merged)
        conn.execute("INSERT INTO log_fts (log_fts) VALUES ('optimize')")
        conn.execute("INSERT INTO note_fts (note_fts) VALUES ('optimize')")
        conn.execute("INSERT INTO summary_fts (summary_fts) VALUES ('optimize')")
        conn.execute("DELETE FROM erasure_grant")
    finally:
        conn.execute(f"PRAGMA secure_delete = {secure}")
        conn.execute("PRAGMA defer_foreign_keys = OFF")


def checkpoint_after_erasure(store: MemoryStore, wait_ms: int = 200) -> bool:
    """After the commit: move the WAL into the database and truncate it (old frames hold text).
    False when it could not (a reader still holds an old snapshot): the caller tries again. It
    waits for readers at most ``wait_ms``, so a retry never stalls the worker for long."""
    conn = store.conn
    before = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
    try:
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {before}")
    if busy or frames != done:
        log.warning("memory.erasure_checkpoint_incomplete", frames=frames, checkpointed=done)
        return False
    return True


_TOMBSTONE = (
    "SELECT id, ts, target_kind, target, log_rows, notes, detail FROM erasure WHERE stream_id = ?"
)


def _tombstone_result(raw: tuple[Any, ...], *, replayed: bool) -> dict[str, Any]:
    try:
        derived = json.loads(raw[6] or "{}").get("derived_replies", [])
    except (ValueError, AttributeError):
        derived = []
    return {
        "erasure": int(raw[0]),
        "ts": float(raw[1]),
        "kind": str(raw[2]),
        "target": str(raw[3]),
        "log_rows": int(raw[4]),
        "notes": int(raw[5]),
        "derived_replies": len(derived) if isinstance(derived, list) else 0,
        "replayed": replayed,
    }


def erase(
    store: MemoryStore,
    *,
    kind: str,
    target: str,
    reason: str,
    requested_by: str,
    stream_id: str,
    now: float | None = None,
) -> dict[str, Any]:
    """Apply an erasure (see the module docstring); idempotent on ``stream_id``."""
    conn = store.conn
    reason = reason.strip()
    if not reason:
        raise CommandError("an erasure needs a reason (it is kept in the tombstone)")
    now = time.time() if now is None else now
    with writing(store):
        done = conn.execute(_TOMBSTONE, (stream_id,)).fetchone()
        if done is not None:
            return _tombstone_result(done, replayed=True)
        plan = plan_erasure(conn, kind, target)
        if plan.empty:
            raise CommandError(f"nothing to erase for {kind} {target!r} (already erased?)")
        with savepoint(conn, "erasure"), granted(conn, requested_by, reason, now):
            cur = conn.execute(
                "INSERT INTO erasure (ts, requested_by, reason, target_kind, target, log_rows, "
                "notes, detail, stream_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    requested_by,
                    reason,
                    kind,
                    plan.target,
                    len(plan.log_ids),
                    len(plan.note_ids),
                    json.dumps(plan.detail(), separators=(",", ":")),
                    stream_id,
                ),
            )
            erasure_id = int(cur.lastrowid or 0)
            remove(
                conn,
                erasure_id,
                plan.log_ids,
                plan.note_ids,
                quote_ids=plan.quote_ids,
                subject_ids=plan.subject_ids,
            )
        store.invalidate()  # the caches hold the old text
        store.after_commit(lambda: checkpoint_after_erasure(store))
        raw = conn.execute(_TOMBSTONE, (stream_id,)).fetchone()
    log.info(
        "memory.erased",
        erasure=erasure_id,
        kind=kind,
        log_rows=len(plan.log_ids),
        notes=len(plan.note_ids),
    )
    return _tombstone_result(raw, replayed=False)


# -- the owner command (applied by the worker) ----------------------------------------------------


def _cmd_erase(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    kind, target, reason = args.get("kind"), args.get("target"), args.get("reason")
    if not isinstance(kind, str) or not isinstance(target, str) or not isinstance(reason, str):
        raise CommandError("memory.erase takes {kind, target, reason} as strings")
    requested_by = args.get("requested_by")
    return erase(
        ctx.store,
        kind=kind,
        target=target,
        reason=reason,
        requested_by=requested_by if isinstance(requested_by, str) and requested_by else "owner",
        stream_id=ctx.stream_id,
        now=ctx.now,
    )


COMMANDS: dict[str, Handler] = {"memory.erase": _cmd_erase}
