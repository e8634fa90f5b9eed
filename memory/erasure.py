"""The owner's audited erasure (``memory.erase``, ``relaybot memory erase``): the one exception
to append-only.

In one transaction (a savepoint inside the worker's batch) it inserts the ``erasure_grant`` row,
which is what lets the triggers of memory/schema.py allow UPDATE and DELETE; removes the text of
the matching log rows (``text = ''``, ``extra = {"erased": <erasure id>}``; the FTS index follows
through its triggers); deletes what was derived from them (notes learned from them, and the notes
that supersede those); writes the tombstone in ``erasure`` (target, when, why, counts, the ids in
``detail``); deletes the grant. With ``secure_delete`` on, an FTS ``optimize`` (so no index segment
keeps a deleted word) and a WAL checkpoint after the commit, none of the text stays in the
database files. What it covers, the target's own rows and the replies and notes derived from
them hop by hop (up to a bound), and what the owner may keep, is planned first, read-only, by
memory/erasure_plan.py; the tombstone's ``detail`` names every derived item with its hop and
what it drew on (``derived``), the items kept (``kept``) and the replies the bound left
(``beyond_bound``), never their text.

Quotes: a reply mail keeps the earlier mail it quotes in ``extra.quoted`` (its gateway's quote
parser), a copy of text this erasure removes. A kept row loses its quote (``quoted`` is
dropped, ``quote_erased: <erasure id>`` says why) when it comes after an erased row of the same
conversation, or when its quote holds the text of an erased row anywhere (compared without ``>``
marks, line breaks and case). Its stream entry holds the quote too: the tombstone names these rows
(``quote_ids``, ``quote_keys``) and memory/copies.py adds their entries to what the worker
deletes.

Subjects: an erased mail's subject is repeated by the replies in its thread (``Re: …``): those
rows lose it (memory/subjects.py; the tombstone names them as ``subject_ids``, ``subject_keys``),
and the replies whose model input held such a row are derived from it (erased, as above).

Scheduled items: a conversation's and a person's items, and those set in a turn that goes, end
for good (``erased``, their text blanked) and their occurrences' rows go too
(memory/schedule_erasure.py); the tombstone names them (``scheduled_ids``, ``scheduled_keys``:
id and the turn or command that set them; ``scheduled``: with their hops), and so does the
command's answer (``scheduled``).

Layer 2: the profile facts and capability gaps resting on an erased row (or subject) are blanked
and the runs of their ranges marked (memory/profile_erasure.py: a fact's predecessor whose evidence
survives is current again); the tombstone and the command's answer name them (``facts``,
``gaps``).

A replay (same stream id) returns the tombstone already written; a target with nothing left to
erase is refused without a tombstone. The worker applies it as the owner command ``memory.erase``
(:data:`COMMANDS`); ``relaybot memory erase`` previews it with :func:`plan_erasure` first.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import structlog

from memory import erasure_log, profile_erasure, schedule_erasure, summaries
from memory.command_types import CommandContext, CommandError, Handler
from memory.copies import MIN_TEXT_MATCH, plain
from memory.curated_versions import erase_versions, reached
from memory.erasure_plan import (
    MAX_HOPS,
    TARGET_KINDS,
    ErasurePlan,
    Item,
    parse_keep,
    plan_notes,
)
from memory.erasure_plan import plan_erasure as plan_items
from memory.rows import NOT_ERASED
from memory.sql import chunks, marks, savepoint
from memory.store import MemoryStore
from memory.subjects import drop_subjects

__all__ = [
    "MAX_HOPS",
    "TARGET_KINDS",
    "ErasurePlan",
    "Item",
    "checkpoint_after_erasure",
    "erase",
    "granted",
    "parse_keep",
    "plan_erasure",
    "plan_notes",
    "remove",
    "writing",
]

log = structlog.get_logger(__name__)


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


# -- planning (memory/erasure_plan.py), then the copies a plan leaves elsewhere ---------------


def plan_erasure(
    conn: sqlite3.Connection, kind: str, target: str, keep: Iterable[str] = ()
) -> ErasurePlan:
    """The rows and notes an erasure would remove (memory/erasure_plan.py), and the kept rows
    whose quote of them goes; raises CommandError for a bad target or ``keep``."""
    plan = plan_items(conn, kind, target, keep)
    quotes = _quoting_rows(conn, plan.log_ids)
    plan.quote_ids = sorted(quotes)
    plan.quote_keys = [quotes[i] for i in plan.quote_ids]
    return plan


_NO_QUOTE = "json_set(json_remove(extra, '$.quoted'), '$.quote_erased', ?)"
_QUOTING_COLS = "id, direction, stream_id, conversation, json_extract(extra, '$.quoted')"
_HAS_QUOTE = "json_valid(extra) AND json_extract(extra, '$.quoted') IS NOT NULL"


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
            flat = plain(str(text or ""))
            if len(flat) >= MIN_TEXT_MATCH:
                texts.add(flat)
    erased_set = set(erased)
    found: dict[int, tuple[str, str]] = {}
    quoting = f"SELECT {_QUOTING_COLS} FROM log WHERE {_HAS_QUOTE} AND {NOT_ERASED}"  # noqa: S608
    for id_, d, sid, conversation, quoted in conn.execute(quoting):
        if int(id_) in erased_set or not isinstance(quoted, str) or not quoted:
            continue
        first = first_in.get(str(conversation))
        flat = plain(quoted) if texts else ""
        if (first is not None and int(id_) > first) or any(t in flat for t in texts):
            found[int(id_)] = (str(d), str(sid))
    return found


def remove(
    conn: sqlite3.Connection,
    erasure_id: int,
    log_ids: list[int],
    notes: list[int],
    *,
    quote_ids: Sequence[int] = (),
    subject_ids: Sequence[int] = (),
    scheduled_ids: Sequence[int] = (),
    entities: Sequence[str] = (),
    now: float | None = None,
) -> None:
    """Blank the log rows, drop the quotes of ``quote_ids`` and the subjects of ``subject_ids``,
    delete the notes, and end the scheduled items ``scheduled_ids`` (their text blanked, ended
    at ``now``); the caller holds the grant."""
    marker = json.dumps({"erased": erasure_id}, separators=(",", ":"))
    versions = erase_versions(conn, log_ids)  # MEMORY.md's, read before the rows are blanked
    if versions:
        log.info("memory.erased_curated_versions", erasure=erasure_id, versions=len(versions))
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
    if scheduled_ids:
        schedule_erasure.blank(conn, scheduled_ids, time.time() if now is None else now)
        log.info("memory.erased_scheduled", erasure=erasure_id, items=len(scheduled_ids))
    # a summary of an erased row (or of a mail that repeated an erased subject) is blanked;
    # its range is derived again from what remains
    summaries.tombstone(conn, erasure_id, [*log_ids, *subject_ids])
    # ... and so are the profile facts and capability gaps resting on one (layer 2)
    profile_erasure.cascade(conn, erasure_id, [*log_ids, *subject_ids], entities)


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
    """The command's answer, from the tombstone (a replay answers the same)."""
    try:
        detail = json.loads(raw[6] or "{}")
    except ValueError:
        detail = {}
    if not isinstance(detail, dict):
        detail = {}

    def listed(key: str) -> list[Any]:
        value = detail.get(key)
        return value if isinstance(value, list) else []

    kept = [k for k in listed("kept") if isinstance(k, dict)]
    return {
        "erasure": int(raw[0]),
        "ts": float(raw[1]),
        "kind": str(raw[2]),
        "target": str(raw[3]),
        "log_rows": int(raw[4]),
        "notes": int(raw[5]),
        "derived_replies": len(listed("derived_replies")),
        "derived": [d for d in listed("derived") if isinstance(d, dict)],
        "kept": [f"{k.get('kind')}:{k.get('id')}" for k in kept],
        "hop_bound": detail.get("hop_bound", 1),
        "beyond_bound": listed("beyond_bound"),
        "scheduled": [s for s in listed("scheduled") if isinstance(s, dict)],
        "facts": [i for i in listed("facts") if isinstance(i, int)],
        "gaps": [i for i in listed("gaps") if isinstance(i, int)],
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
    keep: Iterable[str] = (),
    texts: dict[int, list[str]] | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Apply an erasure (see the module docstring), keeping the derived items ``keep``
    (``reply:N``, ``note:N``); idempotent on ``stream_id``. ``texts`` gets the erased rows' texts
    under the erasure's id, as they were (the worker looks for copies of them: memory.copies);
    ``detail`` joins the tombstone's (ids only, never text: a redaction names its event)."""
    conn = store.conn
    reason = reason.strip()
    if not reason:
        raise CommandError("an erasure needs a reason (it is kept in the tombstone)")
    now = time.time() if now is None else now
    with writing(store):
        done = conn.execute(_TOMBSTONE, (stream_id,)).fetchone()
        if done is not None:
            return _tombstone_result(done, replayed=True)
        plan = plan_erasure(conn, kind, target, keep)
        if plan.empty:
            raise CommandError(f"nothing to erase for {kind} {target!r} (already erased?)")
        # MEMORY.md's versions that hold the text go with it (memory/curated_versions.py); the
        # tombstone names them by digest, so an import of an older export leaves them out
        versions = [d for _, d in reached(conn, plan.log_ids)]
        more = {"curated_versions": versions} if versions else {}
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
                    json.dumps({**plan.detail(), **more, **(detail or {})}, separators=(",", ":")),
                    stream_id,
                ),
            )
            erasure_id = int(cur.lastrowid or 0)
            erasure_log.journal(conn, store.path, erasure_id)  # durable before the commit
            if texts is not None:
                texts[erasure_id] = erased_texts(conn, plan.log_ids) + schedule_erasure.texts(
                    conn, plan.scheduled_ids
                )
            remove(
                conn,
                erasure_id,
                plan.log_ids,
                plan.note_ids,
                quote_ids=plan.quote_ids,
                subject_ids=plan.subject_ids,
                scheduled_ids=plan.scheduled_ids,
                entities=plan.entities,
                now=now,
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
        derived=len(plan.items),
        scheduled=len(plan.scheduled_ids),
        facts=len(plan.fact_ids),
        gaps=len(plan.gap_ids),
        kept=len(plan.kept),
        beyond_bound=len(plan.beyond),
    )
    return _tombstone_result(raw, replayed=False)


def erased_texts(conn: sqlite3.Connection, log_ids: Sequence[int]) -> list[str]:
    """The texts of these rows (read before they are blanked)."""
    out: list[str] = []
    for chunk in chunks(list(log_ids)):
        sql = f"SELECT text FROM log WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        out += [str(t) for (t,) in conn.execute(sql, list(chunk)) if t]
    return out


# -- the owner command (applied by the worker) ----------------------------------------------------


def _cmd_erase(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    kind, target, reason = args.get("kind"), args.get("target"), args.get("reason")
    if not isinstance(kind, str) or not isinstance(target, str) or not isinstance(reason, str):
        raise CommandError("memory.erase takes {kind, target, reason} as strings")
    requested_by = args.get("requested_by")
    keep = args.get("keep", [])
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise CommandError("memory.erase takes keep as a list of strings (reply:N, note:N)")
    return erase(
        ctx.store,
        kind=kind,
        target=target,
        reason=reason,
        requested_by=requested_by if isinstance(requested_by, str) and requested_by else "owner",
        stream_id=ctx.stream_id,
        now=ctx.now,
        keep=keep,
        texts=ctx.erased_texts,
    )


COMMANDS: dict[str, Handler] = {"memory.erase": _cmd_erase}


def any_erasure(store: MemoryStore) -> bool:
    """Whether memory has ever erased anything (the erasure table has a row)."""
    return store.conn.execute("SELECT 1 FROM erasure LIMIT 1").fetchone() is not None
