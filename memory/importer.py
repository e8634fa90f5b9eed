"""``memory.import``, applied by the worker: records from an export or a squidbot history.

The command line reads and checks the file (memory/import_file.py) and sends its records as
``memory.import`` commands, each small enough for one stream entry (relaybot/import_parts.py).
Here they are applied one by one, each in its own savepoint, so a bad record is reported by its
line number and the others go on. A record too large for one entry arrives as ``stage`` parts
followed by an item naming them: the parts are held in memory (:data:`MAX_STAGED_CHARS` at most)
until that item joins them and checks their hash.

Duplicates are "present", never errors: log rows by ``(direction, stream_id)``, entities by id,
handles by ``(channel, address)``, links by stream id or their whole content, notes by
``op_key`` or their whole content, tombstones by stream id or target and time, reply marks by
``(reply_id, status)``. Ids are kept when they are free at the end of their table (so a fresh
home gets the exporter's ids), else new ones are given. An imported tombstone is applied again
to the rows it names (memory/erasure.py), so an erasure survives an export and an import into an
older copy. A conversation summary comes in when its range is the same rows here (a home that
kept the exporter's ids), else it is left out (``derived`` in the result: the jobs derive the
conversation again). Profile facts and capability gaps (layer 2) are always left out
(``derived``): the jobs derive them again from the imported log. MEMORY.md's versions are known
by their digest and time; one that an erasure here erased stays out.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from memory import erasure_log, schedule_erasure
from memory.command_types import CommandContext, CommandError, Handler
from memory.erasure import (
    ErasurePlan,
    checkpoint_after_erasure,
    granted,
    plan_notes,
    remove,
    writing,
)
from memory.identity import OWNER, handle_entity, normalize_address, resolve_ref
from memory.identity_writer import create_handle, ensure_owner
from memory.records import (
    CuratedVersionRecord,
    EntityRecord,
    ErasureRecord,
    GapRecord,
    HandleRecord,
    LinkRecord,
    LogRecord,
    NoteRecord,
    ProfileFactRecord,
    Record,
    ReplyStatusRecord,
    SummaryRecord,
    parse_record,
)
from memory.rows import NOT_ERASED
from memory.sql import chunks, marks, savepoint
from memory.store import MemoryStore
from memory.tombstones import Tombstones

log = structlog.get_logger(__name__)

MAX_STAGED_CHARS = 64_000_000  # staged parts of oversized import records held by the worker

# -- staged parts of oversized records ---------------------------------------------------------

# pieces of oversized records, by key, until the item naming them arrives (memory only: if the
# worker restarts in between, that record is reported as incomplete and a re-import sends it)
_STAGED: dict[str, dict[int, str]] = {}


def _stage(args: dict[str, Any]) -> dict[str, Any]:
    stage = args.get("stage")
    if not isinstance(stage, dict):
        raise CommandError("stage must be an object")
    key, index, count, text = (stage.get(k) for k in ("key", "index", "count", "text"))
    if not (
        isinstance(key, str)
        and isinstance(index, int)
        and isinstance(count, int)
        and isinstance(text, str)
        and 0 <= index < count
    ):
        raise CommandError("stage takes {key, index, count, text}")
    held = sum(len(t) for parts in _STAGED.values() for t in parts.values())
    while _STAGED and held + len(text) > MAX_STAGED_CHARS:
        oldest = next(iter(_STAGED))
        held -= sum(len(t) for t in _STAGED.pop(oldest).values())
    _STAGED.setdefault(key, {})[index] = text
    return {"staged": index, "of": count}


def _unstage(item: dict[str, Any]) -> dict[str, Any]:
    staged = item["staged"]
    key = staged.get("key") if isinstance(staged, dict) else None
    parts = _STAGED.pop(key, {}) if isinstance(key, str) else {}
    count = staged.get("count") if isinstance(staged, dict) else None
    if not isinstance(count, int) or sorted(parts) != list(range(count)):
        raise ValueError(
            "parts of this record are missing (did the worker restart during the import?); "
            "import the file again"
        )
    text = "".join(parts[i] for i in range(count))
    if hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() != staged.get("sha256"):
        raise ValueError("the parts of this record do not add up (hash mismatch)")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("a staged record is not an object")
    return data


# -- applying records --------------------------------------------------------------------------


class Present(Exception):
    """The record is already in memory."""


class Derived(Exception):
    """A derived record (a summary, a profile fact, a gap) left out: it is derived here again."""


@dataclass
class ImportResult:
    added: dict[str, int] = field(default_factory=dict)
    present: dict[str, int] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    erased: int = 0  # records (among the present) that an erasure here had erased
    derived: int = 0  # summaries, facts and gaps left out: derived again from the imported log
    # the senders of the imported messages: "channel / address" -> {"entity", "how"}, where how
    # is "owner" (an owner alias or a mapping to the owner), "mapped" (a mapping), "known" (a
    # handle memory knew), "new" (an entity of its own, made now) or "conflict" (mapped, but the
    # handle belongs to another entity already: kept there)
    handles: dict[str, dict[str, str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        handles = dict(sorted(self.handles.items())[:MAX_HANDLES_REPORTED])
        return {
            "added": self.added,
            "present": self.present,
            "rejected": self.rejected,
            "erased": self.erased,
            "derived": self.derived,
            "handles": handles,
            "handles_more": max(0, len(self.handles) - len(handles)),
        }


MAX_HANDLES_REPORTED = 200  # per command: the result travels back in one reply


# records present already are left as they are (ON CONFLICT / OR IGNORE): "present"
_INSERT_ENTITY = (
    "INSERT INTO entity (id, kind, name, created_ts) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_INSERT_HANDLE = (
    "INSERT INTO handle (channel, address, entity, display, first_seen) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_INSERT_REPLY_STATUS = (
    "INSERT OR IGNORE INTO reply_status (reply_id, status, at, detail) VALUES (?, ?, ?, ?)"
)


def _note_content(rec: NoteRecord) -> tuple[Any, ...]:
    """What makes a note the same note: the columns of :data:`Importer._NOTE_MATCH`, in order."""
    return (
        rec.note_type,
        rec.topic,
        rec.text,
        rec.scope,
        rec.visibility,
        rec.chat,
        rec.role,
        rec.team,
        rec.project,
        rec.source_conversation,
        rec.source_privacy.value if rec.source_privacy else None,
        rec.source_entity,
        rec.author,
        rec.created_ts,
    )


class Importer:
    """Applies import items to the writer's store (see the module docstring)."""

    def __init__(
        self, store: MemoryStore, *, owner_name: str = "owner", journal: bool = True
    ) -> None:
        self.store = store
        self.journal = journal  # journal imported tombstones (memory/erasure_log.py)
        self.conn = store.conn
        self.owner_name = owner_name
        self.result = ImportResult()
        self.log_added = False
        self.tombstones = Tombstones.read(self.conn)  # what was erased here stays erased

    def apply(self, items: list[Any]) -> ImportResult:
        for n, item in enumerate(items):
            line = item.get("line") if isinstance(item, dict) else None
            line = line if isinstance(line, int) else None
            try:
                if not isinstance(item, dict):
                    raise ValueError("an import item must be an object")
                if "staged" in item:
                    item = _unstage(item)  # noqa: PLW2901 (the staged item replaces its stub)
                record = parse_record(item.get("record"))
                with savepoint(self.conn, "import_record"):
                    self._apply(record, item)
                self.result.added[record.type] = self.result.added.get(record.type, 0) + 1
            except Derived:
                self.result.derived += 1
            except Present as exc:
                kind = str(exc)
                self.result.present[kind] = self.result.present.get(kind, 0) + 1
            except (ValueError, sqlite3.IntegrityError, UnicodeEncodeError) as exc:
                why = str(exc) if not isinstance(exc, UnicodeEncodeError) else "not valid Unicode"
                self.result.rejected.append({"line": line, "index": n, "reason": why})
        if self.log_added:
            # indexed in the import's own transaction: `relaybot memory search` finds what was
            # imported as soon as the command answers (the worker's lazy indexing, at its next
            # idle moment, never came when a zero-config import stopped its worker at once)
            self.store.sync_index()
            self.store.invalidate()  # rows appeared behind the caches' back
        return self.result

    def _apply(self, record: Record, item: dict[str, Any]) -> None:
        if isinstance(record, LogRecord):
            map_to = item.get("map_to")
            self._log(
                record,
                identify=bool(item.get("identify")),
                map_to=map_to if isinstance(map_to, str) and map_to else None,
            )
        elif isinstance(record, EntityRecord):
            params: tuple[Any, ...] = (record.id, record.kind, record.name, record.created_ts)
            self._insert_or_present(record, _INSERT_ENTITY, params)
        elif isinstance(record, HandleRecord):
            self._need_entities(record.entity)
            address = record.address.strip().casefold()
            params = (record.channel, address, record.entity, record.display, record.first_seen)
            self._insert_or_present(record, _INSERT_HANDLE, params)
        elif isinstance(record, LinkRecord):
            self._link(record)
        elif isinstance(record, NoteRecord):
            self._note(record, item.get("supersedes_ref"))
        elif isinstance(record, ErasureRecord):
            self._erasure(record)
        elif isinstance(record, ReplyStatusRecord):
            params = (record.reply_id, record.status, record.at, record.detail)
            self._insert_or_present(record, _INSERT_REPLY_STATUS, params)
        elif isinstance(record, SummaryRecord):
            self._summary(record)
        elif isinstance(record, ProfileFactRecord | GapRecord):
            raise Derived  # layer 2: derived again here from the imported log
        elif isinstance(record, CuratedVersionRecord):
            self._curated_version(record)

    def _summary(self, rec: SummaryRecord) -> None:
        """A summary whose range is the same rows here (a home that kept the exporter's ids);
        else it is left out (``derived``): the jobs derive the conversation again."""
        if self._exists("summary", "job_key = ?", (rec.job_key,)):
            raise Present("summary")
        rows = self.conn.execute(
            "SELECT count(*), min(id), max(id) FROM log WHERE conversation = ? AND id BETWEEN ? "
            "AND ?",
            (rec.conversation, rec.first_id, rec.last_id),
        ).fetchone()
        if (int(rows[0]), rows[1], rows[2]) != (rec.rows, rec.first_id, rec.last_id):
            raise Derived
        supersedes = rec.supersedes
        if supersedes is not None and not self._exists("summary", "id = ?", (supersedes,)):
            supersedes = None
        self.conn.execute(
            "INSERT INTO summary (id, conversation, channel, privacy, first_id, last_id, rows, "
            "first_ts, last_ts, text, method, job_key, supersedes, erased, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._free_id("summary", rec.id), rec.conversation, rec.channel, rec.privacy,
                rec.first_id, rec.last_id, rec.rows, rec.first_ts, rec.last_ts, rec.text,
                rec.method, rec.job_key, supersedes, rec.erased, rec.created,
            ),
        )  # fmt: skip

    def _curated_version(self, rec: CuratedVersionRecord) -> None:
        if rec.sha256 in self.tombstones.curated:
            self.result.erased += 1
            raise Present("curated_version")
        if self._exists("curated_version", "sha256 = ? AND ts = ?", (rec.sha256, rec.ts)):
            raise Present("curated_version")
        self.conn.execute(
            "INSERT INTO curated_version (ts, text, sha256, cause, stream_id) "
            "VALUES (?, ?, ?, ?, ?)",
            (rec.ts, rec.text, rec.sha256, rec.cause, rec.stream_id),
        )

    def _insert_or_present(self, record: Record, sql: str, params: Sequence[Any]) -> None:
        if self.conn.execute(sql, params).rowcount != 1:
            raise Present(record.type)

    def _exists(self, table: str, where: str, params: Sequence[Any]) -> bool:
        sql = f"SELECT 1 FROM {table} WHERE {where}"  # noqa: S608 (constants)
        return self.conn.execute(sql, params).fetchone() is not None

    def _recorded(
        self, table: str, stream_id: str | None, where: str, params: Sequence[Any]
    ) -> bool:
        """Whether ``table`` holds the record already: written by the same entry (its stream
        id), or with the same content (``where``)."""
        return (
            stream_id is not None and self._exists(table, "stream_id = ?", (stream_id,))
        ) or self._exists(table, where, params)

    def _need_entities(self, *entities: str) -> None:
        for entity in entities:
            if not self._exists("entity", "id = ?", (entity,)):
                raise ValueError(f"entity {entity!r} is not in memory (nor earlier in the file)")

    def _free_id(self, table: str, wanted: int | None) -> int | None:
        """``wanted`` if it lies beyond every id in ``table`` (ids stay in time order)."""
        if wanted is None:
            return None
        top = self.conn.execute(f"SELECT max(id) FROM {table}").fetchone()[0]  # noqa: S608
        return wanted if top is None or wanted > int(top) else None

    def _log(self, rec: LogRecord, *, identify: bool, map_to: str | None = None) -> None:
        same = self.conn.execute(
            "SELECT conversation, sender, text, extra FROM log WHERE direction = ? "
            "AND stream_id = ?",
            (rec.direction, rec.stream_id),
        ).fetchone()
        if same is not None:
            conversation, sender, text, extra = same
            erased = str(extra).startswith('{"erased":') or (
                rec.text == "" and rec.extra.get("erased") is not None
            )
            if erased or (conversation, sender, text) == (rec.conversation, rec.sender, rec.text):
                self.result.erased += int(erased and bool(rec.text))
                raise Present("log")
            raise ValueError(
                f"another message with stream id {rec.stream_id} ({rec.direction}) is already "
                "in memory (from another installation?): not imported"
            )
        if rec.is_owner and rec.entity not in (None, "owner"):
            raise ValueError("an owner row must have the entity 'owner'")
        if not rec.is_owner and rec.entity == "owner":
            raise ValueError("only the owner's rows may have the entity 'owner'")
        entity = rec.entity
        how = ""
        if identify and rec.direction == "in" and entity is None:
            entity, how = self._identify(rec, map_to)
        cur = self.conn.execute(
            "INSERT INTO log (id, direction, stream_id, kind, channel, session, conversation, "
            "sender, sender_name, entity, is_owner, privacy, text, event_id, reply_id, "
            "platform_ts, recorded_ts, extra) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._free_id("log", rec.id),
                rec.direction,
                rec.stream_id,
                rec.kind,
                rec.channel,
                rec.session,
                rec.conversation,
                rec.sender,
                rec.sender_name,
                entity,
                1 if rec.is_owner else 0,
                rec.privacy.value,
                rec.text,
                rec.event_id,
                rec.reply_id,
                rec.platform_ts,
                # its place in the log's time order; a message from the future would stay the
                # newest of every context for years: it is recorded now instead
                min(rec.recorded_ts, time.time()),
                json.dumps(rec.extra, separators=(",", ":"), ensure_ascii=False)
                if rec.extra
                else "{}",
            ),
        )
        if cur.rowcount != 1:
            raise Present("log")
        self.log_added = True
        if how and entity is not None:
            # the first line of a handle tells how it was found ("new" stays "new")
            key = f"{rec.channel} / {rec.sender}"
            self.result.handles.setdefault(key, {"entity": entity, "how": how})

    def _identify(self, rec: LogRecord, map_to: str | None) -> tuple[str | None, str]:
        """The sender's entity and how it was found: the owner; the entity ``map_to`` names
        (the handle is recorded under it unless it belongs to another entity already); else the
        handle's entity, created on first sight like a live message's."""
        if rec.is_owner:
            ensure_owner(self.conn, self.owner_name, rec.recorded_ts)
            return "owner", "owner"
        known = handle_entity(self.conn, rec.channel, rec.sender)
        if map_to is not None:
            try:
                target = resolve_ref(self.conn, map_to)
            except LookupError as exc:
                raise ValueError(
                    f"cannot map {rec.channel}:{rec.sender} to {map_to}: {exc}"
                ) from None
            if target == OWNER:
                raise ValueError("a handle mapped to the owner is the owner's (internal error)")
            if known is not None:
                return known, "mapped" if known == target else "conflict"
            self.conn.execute(
                _INSERT_HANDLE,
                (
                    normalize_address(rec.channel),
                    normalize_address(rec.sender),
                    target,
                    rec.sender_name.strip(),
                    rec.recorded_ts,
                ),
            )
            return target, "mapped"
        if known is not None:
            return known, "known"
        try:
            entity = create_handle(
                self.conn,
                rec.channel,
                rec.sender,
                display=rec.sender_name,
                now=rec.recorded_ts,
            )
        except ValueError:
            return None, ""
        return entity, "new"

    def _link(self, rec: LinkRecord) -> None:
        if rec.a >= rec.b:
            raise ValueError("a link names its entities in order (a < b)")
        self._need_entities(rec.a, rec.b)
        if self._recorded(
            "entity_link",
            rec.stream_id,
            "a = ? AND b = ? AND status = ? AND actor = ? AND ts = ?",
            (rec.a, rec.b, rec.status, rec.actor, rec.ts),
        ):
            raise Present("entity_link")
        newer = self.conn.execute(
            "SELECT status FROM entity_link WHERE a = ? AND b = ? AND ts > ? LIMIT 1",
            (rec.a, rec.b, rec.ts),
        ).fetchone()
        if newer is not None:  # appending it would make an old state the current one
            raise ValueError(f"older than this pair's link state here ({newer[0]}): not applied")
        self.conn.execute(
            "INSERT INTO entity_link (id, a, b, status, reason, actor, ts, stream_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._free_id("entity_link", rec.id),
                rec.a,
                rec.b,
                rec.status,
                rec.reason,
                rec.actor,
                rec.ts,
                rec.stream_id,
            ),
        )

    _NOTE_MATCH = (
        "SELECT id FROM note WHERE type = ? AND topic = ? AND text = ? AND scope = ? "
        "AND visibility = ? AND chat IS ? AND role IS ? AND team IS ? AND project IS ? "
        "AND source_conversation IS ? AND source_privacy IS ? AND source_entity IS ? "
        "AND author = ? AND created_ts = ?"
    )

    def _find_note(self, rec: NoteRecord) -> int | None:
        if rec.op_key is not None:
            raw = self.conn.execute(
                "SELECT id FROM note WHERE op_key = ?", (rec.op_key,)
            ).fetchone()
            if raw is not None:
                return int(raw[0])
        raw = self.conn.execute(self._NOTE_MATCH, _note_content(rec)).fetchone()
        return None if raw is None else int(raw[0])

    def _note(self, rec: NoteRecord, ref: object) -> None:
        if self._find_note(rec) is not None:
            raise Present("note")
        if self.tombstones.erased_note(rec):
            self.result.erased += 1
            raise Present("note")
        supersedes = None
        if rec.supersedes is not None:
            old = parse_record(ref) if ref is not None else None
            if not isinstance(old, NoteRecord):
                raise ValueError(f"supersedes note {rec.supersedes}, which is not in the file")
            supersedes = self._find_note(old)
            if supersedes is None:
                raise ValueError("the note it supersedes is not in memory")
        self.conn.execute(
            "INSERT INTO note (type, topic, text, scope, visibility, chat, role, team, project, "
            "source_conversation, source_privacy, source_entity, author, created_ts, "
            "id, supersedes, stream_id, op_key) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *_note_content(rec),
                self._free_id("note", rec.id),
                supersedes,
                rec.stream_id,
                rec.op_key,
            ),
        )

    def _erasure(self, rec: ErasureRecord) -> None:
        if self._recorded(
            "erasure",
            rec.stream_id,
            "ts = ? AND target_kind = ? AND target = ?",
            (rec.ts, rec.target_kind, rec.target),
        ):
            raise Present("erasure")
        cur = self.conn.execute(
            "INSERT INTO erasure (id, ts, requested_by, reason, target_kind, target, log_rows, "
            "notes, detail, stream_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._free_id("erasure", rec.id),
                rec.ts,
                rec.requested_by,
                rec.reason,
                rec.target_kind,
                rec.target,
                rec.log_rows,
                rec.notes,
                json.dumps(rec.detail, separators=(",", ":")),
                rec.stream_id,
            ),
        )
        erasure_id = int(cur.lastrowid or 0)
        if self.journal:
            erasure_log.journal(self.conn, self.store.path, erasure_id)
        self._reapply(erasure_id, rec)
        self.tombstones.add(rec.target_kind, rec.target, json.dumps(rec.detail))

    def _kept(self, keys: Any) -> list[int]:
        """The ids of the rows not erased here that these ``[direction, stream id]`` name."""
        ids: list[int] = []
        for key in keys if isinstance(keys, list) else []:
            if isinstance(key, list) and len(key) == 2:
                raw = self.conn.execute(
                    f"SELECT id FROM log WHERE direction = ? AND stream_id = ? AND {NOT_ERASED}",  # noqa: S608
                    (str(key[0]), str(key[1])),
                ).fetchone()
                if raw is not None:
                    ids.append(int(raw[0]))
        return ids

    def _reapply(self, erasure_id: int, rec: ErasureRecord) -> None:
        """Erase here what the imported tombstone erased there (by stream ids and op keys)."""
        op_keys = rec.detail.get("note_op_keys")
        log_ids = self._kept(rec.detail.get("log_keys"))
        plan = ErasurePlan(kind=rec.target_kind, target=rec.target)
        wanted = [k for k in op_keys if isinstance(k, str)] if isinstance(op_keys, list) else []
        where = [(f"op_key IN ({marks(len(c))})", list(c)) for c in chunks(wanted)]
        if where:
            plan_notes(self.conn, plan, where)
        subject_ids = self._kept(rec.detail.get("subject_keys"))
        quote_ids = self._kept(rec.detail.get("quote_keys"))
        scheduled = schedule_erasure.by_keys(self.conn, rec.detail.get("scheduled_keys"))
        if not (log_ids or plan.note_ids or subject_ids or quote_ids or scheduled):
            return
        with granted(self.conn, rec.requested_by, rec.reason, time.time()):
            remove(
                self.conn, erasure_id, sorted(log_ids), plan.note_ids,
                quote_ids=quote_ids, subject_ids=subject_ids, scheduled_ids=scheduled,
            )  # fmt: skip
        self.log_added = True  # cached rows may hold the text
        self.store.after_commit(lambda: checkpoint_after_erasure(self.store))
        log.info("memory.erasure_reapplied", erasure=erasure_id, log_rows=len(log_ids))


def reapply_erasure(store: MemoryStore, rec: ErasureRecord) -> bool:
    """Write the tombstone ``rec`` here and erase what it erased there, as an imported one is
    (a restore's journalled erasures: memory/backup.py); False when this database holds it
    already. Not journalled again: it comes from the journal."""
    try:
        Importer(store, journal=False)._erasure(rec)
    except Present:
        return False
    return True


def _cmd_import(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    if "stage" in args:
        return _stage(args)
    items = args.get("items")
    if not isinstance(items, list):
        raise CommandError("memory.import takes {format, items: [...]}")
    with writing(ctx.store):
        result = Importer(ctx.store, owner_name=ctx.owner_name).apply(items)
    log.info(
        "memory.imported",
        added=sum(result.added.values()),
        present=sum(result.present.values()),
        rejected=len(result.rejected),
    )
    return result.as_dict()


COMMANDS: dict[str, Handler] = {"memory.import": _cmd_import}
