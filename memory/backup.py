"""Backing memory up while the worker runs, and putting a backup back: the application's entry
point (``relaybot backup``, ``relaybot restore``; relaybot/cli_backup.py packs the archive).

- :func:`snapshot`: one consistent copy of the database, taken by ``VACUUM INTO`` on a read-only
  connection (one read transaction: WAL lets the worker go on writing; the copy is compacted, so
  no free page of it keeps an erased word), checked (``PRAGMA integrity_check``) and made 0600.
  The journal of erasures (memory/erasure_log.py) is read *after* the copy: every erasure the
  copy may lack is in it.
- :func:`restore`: the restored database is prepared beside the live one (``<stem>.restoring``),
  brought to this code's schema, and every erasure the backup does not hold is applied to it
  again — from the journal, and from the tombstones of the database it replaces when that one
  still opens — as an imported tombstone is (memory/importer.py: by the erased rows' stream ids,
  the notes' op keys, the quotes and subjects, the summaries, MEMORY.md's versions). Its WAL is
  checkpointed into it, then the live database (with its ``-wal`` and ``-shm``) is moved aside to
  a new ``<stem>.replaced-<UTC time>.sqlite3`` (never over another: each restore keeps its own)
  and the prepared one takes its place (``os.replace``). The caller makes sure no worker runs
  (it holds the worker lease meanwhile).
- :func:`forget_replaced`: a backup deletes each kept database it covers (every message of it is
  in the backup's copy: imported back, or never newer); it keeps the others and says so.

Only the worker writes the live database; a restore writes a copy no one else has open yet, while
no worker runs, as the worker's own migrations do.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from memory import curated_versions, erasure_log
from memory.curated import KEEP_MAX_BYTES, read_curated, write_curated
from memory.erasure import checkpoint_after_erasure
from memory.errors import CuratedError, MemoryFailure, MemoryUnavailable, translated
from memory.importer import reapply_erasure
from memory.records import ErasureRecord
from memory.rows import NOT_ERASED
from memory.schema import LATEST_VERSION, check_version, migrate, schema_version
from memory.store import MemoryStore
from memory.tombstones import read_records

log = structlog.get_logger(__name__)

REPLACED = ".replaced"
RESTORING = ".restoring.sqlite3"
_SIDE = ("-wal", "-shm", "-journal")


def replaced_path(db_path: Path, now: float | None = None) -> Path:
    """A new path where a restore keeps the database it replaced:
    ``<stem>.replaced-<UTC time>.sqlite3`` (``-2``, ``-3``... when that one exists)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = f"{db_path.stem}{REPLACED}-{stamp}"
    path, n = db_path.with_name(f"{base}.sqlite3"), 1
    while any(os.path.lexists(f"{path}{s}") for s in ("", *_SIDE)):
        n += 1
        path = db_path.with_name(f"{base}-{n}.sqlite3")
    return path


def replaced_databases(db_path: Path) -> list[Path]:
    """Every database a restore kept beside ``db_path``, oldest first (an earlier relaybot's
    ``<stem>.replaced.sqlite3`` included)."""
    start = len(db_path.stem + REPLACED)

    def order(path: Path) -> tuple[str, int]:  # -<stamp>, then -<stamp>-2, -<stamp>-3...
        stamp, _, n = path.name[start : -len(".sqlite3")].lstrip("-").partition("-")
        return stamp, int(n) if n.isdigit() else 1

    return sorted(db_path.parent.glob(f"{db_path.stem}{REPLACED}*.sqlite3"), key=order)


@dataclass(frozen=True)
class Snapshot:
    path: Path
    schema_version: int
    log_rows: int
    erasures: int  # tombstones in the copy


def snapshot(db_path: Path, dest: Path) -> Snapshot:
    """Copy the live database at ``db_path`` to ``dest`` (which must not exist) consistently,
    while the worker writes; :class:`MemoryUnavailable` when it cannot (SQLite's text)."""
    with translated():
        if not db_path.exists():
            raise sqlite3.OperationalError(f"no memory database at {db_path}")
        uri = db_path.resolve().as_uri() + "?mode=ro"
        src = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            src.execute("PRAGMA busy_timeout = 5000")
            check_version(schema_version(src))
            src.execute("VACUUM INTO ?", (str(dest),))
        finally:
            src.close()
        os.chmod(dest, 0o600)
        return _checked(dest)


def _checked(path: Path) -> Snapshot:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
    try:
        problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError(f"the copy fails its integrity check: {problems[:3]}")
        version = schema_version(conn)
        if version == 0:
            raise sqlite3.DatabaseError(f"{path} is not a memory database")
        check_version(version)
        if version == LATEST_VERSION and (odd := _foreign_objects(conn)):
            raise sqlite3.DatabaseError(
                f"{path} holds schema objects memory does not make ({', '.join(odd[:3])}): "
                "not a relaybot backup as it was taken"
            )
        rows = int(conn.execute("SELECT count(*) FROM log").fetchone()[0])
        erasures = int(conn.execute("SELECT count(*) FROM erasure").fetchone()[0])
    finally:
        conn.close()
    return Snapshot(path, version, rows, erasures)


def _objects(conn: sqlite3.Connection) -> set[tuple[str, str, str]]:
    return {
        (str(kind), str(name), " ".join(str(sql or "").split()))
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master")
        if not str(name).startswith("sqlite_stat")  # SQLite's own statistics (PRAGMA optimize)
    }


def _foreign_objects(conn: sqlite3.Connection) -> list[str]:
    """The tables, indexes, triggers and views of ``conn`` that memory's own schema (at the
    latest version) does not have as they are: a crafted copy's extra trigger (one that deletes
    the log) would otherwise be restored, and every write refused after it."""
    fresh = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(fresh)
        expected = _objects(fresh)
    finally:
        fresh.close()
    return sorted(f"{kind} {name}" for kind, name, _sql in _objects(conn) - expected)


def check(path: Path) -> Snapshot:
    """A database file (from a backup) checked: integrity, memory's schema, a version this code
    reads; :class:`MemoryUnavailable` when it is not one."""
    with translated():
        return _checked(path)


@dataclass
class Restored:
    reapplied: list[int] = field(default_factory=list)  # tombstone ids written again here
    erasures_known: int = 0  # journalled or in the replaced database
    replaced: Path | None = None  # the database moved aside (None: there was none)
    replaced_unreadable: str | None = None  # why its tombstones could not be read
    journal_unreadable: int = 0
    newer_rows: int = 0  # rows the replaced database holds that the backup does not
    curated_error: str | None = None  # MEMORY.md could not be put back
    # the databases earlier restores kept, with the messages each holds that the restored one
    # does not (-1: it did not open)
    earlier: list[tuple[Path, int]] = field(default_factory=list)

    @property
    def erasures_incomplete(self) -> bool:
        """A journal line did not parse and no replaced database told what it recorded: an
        erasure made after the backup may not have been applied again."""
        return bool(self.journal_unreadable) and (
            self.replaced is None or self.replaced_unreadable is not None
        )


def _known_erasures(live: Path, out: Restored) -> tuple[list[ErasureRecord], set[str]]:
    """Every erasure the live database's side knows of (the journal, then its tombstones), and
    the stream ids of its log rows (to count what the backup does not hold)."""
    journal = erasure_log.read(live)
    out.journal_unreadable = journal.unreadable
    records = list(journal.records)
    stream_ids: set[str] = set()
    if live.exists():
        try:
            with MemoryStore(live, readonly=True) as old:
                records += read_records(old.conn)
                stream_ids = _row_keys(old, kept_only=True)
        except (MemoryFailure, sqlite3.Error) as exc:
            out.replaced_unreadable = str(exc)
    return _unique(records), stream_ids


def _row_keys(store: MemoryStore, *, kept_only: bool = False) -> set[str]:
    """Every log row by what names it: its direction and stream id (``kept_only``: not the
    erased ones, which hold nothing to bring back)."""
    where = f" WHERE {NOT_ERASED}" if kept_only else ""
    sql = f"SELECT direction || ' ' || stream_id FROM log{where}"  # noqa: S608
    return {str(k) for (k,) in store.conn.execute(sql)}


def _missing_from(path: Path, present: set[str]) -> int:
    """How many messages the database at ``path`` holds (not erased) that are not in
    ``present``; -1 when it does not open."""
    try:
        with MemoryStore(path, readonly=True) as db:
            return len(_row_keys(db, kept_only=True) - present)
    except (MemoryFailure, sqlite3.Error):
        return -1


def _unique(records: list[ErasureRecord]) -> list[ErasureRecord]:
    """One record per erasure (by its stream id), oldest first."""
    seen: set[str] = set()
    unique: list[ErasureRecord] = []
    for rec in sorted(records, key=lambda r: r.ts):
        key = rec.stream_id or f"{rec.ts}:{rec.target_kind}:{rec.target}"
        if key not in seen:
            seen.add(key)
            unique.append(rec)
    return unique


def restore(
    backup_db: Path,
    live: Path,
    *,
    curated: tuple[Path, str] | None = None,
    journal: Path | None = None,
) -> Restored:
    """Put the database file ``backup_db`` (checked with :func:`check`) in place of ``live``,
    with every later erasure applied again (see the module docstring). ``curated``: MEMORY.md's
    path and the backup's text, written once the database is in place (what the file held is
    kept as a version first). ``journal``: the backup's erasure journal, put in place when the
    live one is gone (a home rebuilt from the backup)."""
    out = Restored()
    records, live_ids = _known_erasures(live, out)
    with translated():
        if journal is not None and not erasure_log.journal_path(live).exists():
            _copy_private(journal, erasure_log.journal_path(live))
            records = _unique([*erasure_log.read(live).records, *records])
        out.erasures_known = len(records)
        staged = live.with_name(live.stem + RESTORING)
        _remove(staged)
        _copy_private(backup_db, staged)
        restored_ids = _prepare(staged, records, curated, out)
        out.newer_rows = len(live_ids - restored_ids)
        out.earlier = [(p, _missing_from(p, restored_ids)) for p in replaced_databases(live)]
        _swap(staged, live, out)
    if curated is not None:
        try:
            write_curated(curated[0], curated[1])
        except CuratedError as exc:
            out.curated_error = str(exc)
    log.info(
        "memory.restored",
        reapplied=len(out.reapplied),
        erasures_known=out.erasures_known,
        replaced=str(out.replaced) if out.replaced else None,
    )
    return out


def _copy_private(source: Path, target: Path) -> None:
    """``source`` copied to the new file ``target`` (0600), fsynced."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh, source.open("rb") as src:
        while block := src.read(1 << 20):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())


def _prepare(
    staged: Path,
    records: list[ErasureRecord],
    curated: tuple[Path, str] | None,
    out: Restored,
) -> set[str]:
    """The staged copy brought to this schema, MEMORY.md as it is kept as a version, every
    erasure applied again, no free page or WAL left; returns the stream ids of its rows."""
    store = MemoryStore(staged, cache_rows=0)  # migrates an older backup up to this code
    try:
        with store.transaction():
            if curated is not None:  # kept before the erasures: they reach it too
                before = read_curated(curated[0], max_bytes=KEEP_MAX_BYTES)
                text = before.text if before.error is None else ""
                curated_versions.written(store.conn, text, curated[1], "restore")
            for rec in records:
                erasure_id = _reapply(store, rec)
                if erasure_id is not None:
                    out.reapplied.append(erasure_id)
        if out.reapplied:
            store.conn.execute("PRAGMA secure_delete = ON")
            store.conn.execute("VACUUM")  # no free page keeps an erased word
        checkpoint_after_erasure(store, wait_ms=5000)
        return _row_keys(store)
    finally:
        store.close()


def _swap(staged: Path, live: Path, out: Restored) -> None:
    """The live database (with its -wal and -shm) moved aside, the staged one in its place."""
    _remove_side(staged)
    if live.exists():
        out.replaced = replaced_path(live)  # a new name: never over a kept database
        for suffix in ("", *_SIDE):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{live}{suffix}", f"{out.replaced}{suffix}")
    os.replace(staged, live)
    _fsync_dir(live.parent)


def _reapply(store: MemoryStore, rec: ErasureRecord) -> int | None:
    """The tombstone written again for ``rec`` (None: the backup holds it already)."""
    if not reapply_erasure(store, rec):
        return None
    raw = store.conn.execute("SELECT max(id) FROM erasure").fetchone()
    return int(raw[0]) if raw and raw[0] is not None else None


@dataclass
class Forgotten:
    deleted: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, int]] = field(default_factory=list)  # messages not covered (-1: unread)


def forget_replaced(db_path: Path, copy: Path) -> Forgotten:
    """At a backup whose copy of memory is ``copy``: delete each database a restore kept whose
    every message (not erased) is in the copy; keep the others (and those that do not open)."""
    out = Forgotten()
    kept = replaced_databases(db_path)
    if not kept:
        return out
    with translated(), MemoryStore(copy, readonly=True) as db:
        present = _row_keys(db)
    for path in kept:
        missing = _missing_from(path, present)
        if missing == 0:
            _remove(path)
            out.deleted.append(path)
        else:
            out.kept.append((path, missing))
    return out


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    _remove_side(path)


def _remove_side(path: Path) -> None:
    for suffix in _SIDE:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


journal_path = erasure_log.journal_path

__all__ = [
    "Forgotten",
    "MemoryUnavailable",
    "Restored",
    "Snapshot",
    "check",
    "forget_replaced",
    "journal_path",
    "replaced_databases",
    "replaced_path",
    "restore",
    "snapshot",
]
