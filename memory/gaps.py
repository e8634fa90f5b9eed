"""Capability gaps: where the assistant could not do what someone asked (issue 28).

A gap is about one entity (who asked: the owner or a contact), with a short description, the
capability it needs when the job could name one (``needs``: a tool's name such as
``web_search``), its evidence (log ids, at least one, from the range its job was given), the most
private class of all its evidence (``source_privacy``), how often it was seen (``count``), first
and last seen, and a status: ``open`` or ``closed`` (by the owner, ``memory.gap_close``, or when a
tool that covers it appears: :func:`close_covered`).

Gaps are derived by the profile job and applied by the worker (memory/profile_apply.py): a gap
seen again (the job names it, or the same entity has a gap with the same normalized description)
is merged: its count goes up, its evidence and last seen grow, its audience narrows to the most
private of all, and a closed gap seen again by evidence newer than its closing reopens
(``reopened`` counts how often). A merge that brings no new evidence (a range derived again)
changes nothing. The description is never edited; only an erasure blanks a gap
(memory/profile_erasure.py).

Gaps are the owner's: the CLI (``relaybot memory gaps``) and ``TODO.md`` list them, a turn never
sees them. A gap from a contact's private conversation names the contact and the log ids, which
only the owner can open.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from memory.command_types import CommandContext, CommandError, Handler
from memory.privacy import Scope
from memory.profiles import evidence_shown, most_private, normalized
from memory.rows import LogRow
from memory.sql import chunks, marks

log = structlog.get_logger(__name__)

MAX_DESCRIPTION = 300
MAX_REASON = 300
_NEEDS = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")

COLUMNS = (
    "id, entity, description, needs, source_privacy, count, first_seen, last_seen, status, "
    "closed_reason, reopened, job_key, created, erased, closed_at"
)


@dataclass(frozen=True)
class Gap:
    id: int
    entity: str
    description: str
    needs: str | None
    source_privacy: str
    count: int
    first_seen: float
    last_seen: float
    status: str
    closed_reason: str | None
    reopened: int
    job_key: str
    created: float
    erased: int | None
    evidence: tuple[int, ...]
    closed_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """As the command's answer and ``--json`` show it."""
        out = asdict(self)
        out["evidence"] = list(self.evidence)
        return out


def job_key(run_key: str, index: int) -> str:
    """The idempotency key of the ``index``-th gap of a range's run."""
    return f"{run_key}#g{index}"


def needs_word(raw: object) -> str | None:
    """The capability a job names, as one word (``Web Search`` is ``web_search``); None when
    it names none or something that is not a word."""
    if not isinstance(raw, str):
        return None
    word = "_".join(raw.strip().casefold().replace("-", "_").split())
    return word if _NEEDS.match(word) else None


def _gap(raw: Sequence[Any], evidence: tuple[int, ...]) -> Gap:
    (id_, entity, desc, needs, privacy, count, fs, ls, status, reason, reopened, key, created,
     erased, closed_at) = raw  # fmt: skip
    return Gap(
        int(id_), str(entity), str(desc), None if needs is None else str(needs), str(privacy),
        int(count), float(fs), float(ls), str(status), None if reason is None else str(reason),
        int(reopened), str(key), float(created), None if erased is None else int(erased),
        evidence, None if closed_at is None else float(closed_at),
    )  # fmt: skip


def _evidence(conn: sqlite3.Connection, ids: list[int]) -> dict[int, tuple[int, ...]]:
    out: dict[int, list[int]] = {i: [] for i in ids}
    for chunk in chunks(ids):
        sql = f"SELECT gap, log_id FROM gap_evidence WHERE gap IN ({marks(len(chunk))}) ORDER BY log_id"  # noqa: S608,E501
        for gap, log_id in conn.execute(sql, list(chunk)):
            out[int(gap)].append(int(log_id))
    return {k: tuple(v) for k, v in out.items()}


def _select(
    conn: sqlite3.Connection, where: str, params: Sequence[Any], order: str = "id"
) -> list[Gap]:
    sql = f"SELECT {COLUMNS} FROM capability_gaps WHERE {where} ORDER BY {order}"  # noqa: S608
    raws = conn.execute(sql, list(params)).fetchall()
    evidence = _evidence(conn, [int(r[0]) for r in raws])
    return [_gap(r, evidence[int(r[0])]) for r in raws]


def by_id(conn: sqlite3.Connection, gap_id: int) -> Gap | None:
    found = _select(conn, "id = ?", (gap_id,))
    return found[0] if found else None


def by_key(conn: sqlite3.Connection, key: str) -> Gap | None:
    found = _select(conn, "job_key = ?", (key,))
    return found[0] if found else None


def of_entities(conn: sqlite3.Connection, entities: Collection[str]) -> list[Gap]:
    """These entities' gaps, open or closed (not erased), oldest first: what a range's job is
    shown to name a gap seen again."""
    out: list[Gap] = []
    for chunk in chunks(sorted(set(entities))):
        where = f"entity IN ({marks(len(chunk))}) AND erased IS NULL"
        out += _select(conn, where, list(chunk))
    return sorted(out, key=lambda g: g.id)


def shown(conn: sqlite3.Connection, scope: Scope, gap: Gap) -> bool:
    """Whether ``scope`` may be shown every row the gap rests on: only such gaps are named to a
    range's job (a group's job must not read, and copy into a gap of its own, what Bob asked in
    his DM); a gap itself is shown to the owner alone."""
    return gap.erased is None and evidence_shown(conn, scope, gap.evidence)


def listing(conn: sqlite3.Connection, include_closed: bool = False) -> list[Gap]:
    """The open gaps (``include_closed``: the closed ones too, after them), the most recently
    seen first; erased ones never (they are blank)."""
    where = "erased IS NULL" + ("" if include_closed else " AND status = 'open'")
    return _select(conn, where, (), order="status = 'closed', last_seen DESC, id")


def signature(conn: sqlite3.Connection) -> str:
    """A digest that changes whenever a gap does (made, seen again, closed, reopened, erased):
    whether ``TODO.md`` must be written again."""
    digest = hashlib.sha256()
    for raw in conn.execute(
        "SELECT id, status, count, last_seen, reopened, needs, erased, closed_reason "
        "FROM capability_gaps ORDER BY id"
    ):
        digest.update(repr(tuple(raw)).encode())
    evidence = conn.execute("SELECT count(*) FROM gap_evidence").fetchone()[0]
    digest.update(f"/{evidence}".encode())
    return digest.hexdigest()[:32]


def same_as(conn: sqlite3.Connection, entity: str, description: str) -> Gap | None:
    """The entity's gap (not erased) with the same normalized description, if there is one."""
    want = normalized(description)
    if not want:
        return None
    for gap in _select(conn, "entity = ? AND erased IS NULL", (entity,)):
        if normalized(gap.description) == want:
            return gap
    return None


def add(
    conn: sqlite3.Connection,
    *,
    entity: str,
    description: str,
    needs: str | None,
    evidence: Sequence[LogRow],
    key: str,
    now: float,
) -> Gap:
    """A new open gap seen once (the caller checked it: memory/profile_apply.py)."""
    seen = [r.ts for r in evidence]
    cursor = conn.execute(
        "INSERT INTO capability_gaps (entity, description, needs, source_privacy, count, "
        "first_seen, last_seen, status, reopened, job_key, created) "
        "VALUES (?, ?, ?, ?, 1, ?, ?, 'open', 0, ?, ?)",
        (entity, description, needs, most_private(r.privacy for r in evidence), min(seen),
         max(seen), key, now),
    )  # fmt: skip
    gap_id = int(cursor.lastrowid or 0)
    conn.executemany(
        "INSERT INTO gap_evidence (gap, log_id) VALUES (?, ?)", [(gap_id, r.id) for r in evidence]
    )
    made = by_id(conn, gap_id)
    assert made is not None
    return made


def merge(
    conn: sqlite3.Connection, gap: Gap, evidence: Sequence[LogRow], needs: str | None
) -> tuple[Gap, bool]:
    """``gap`` seen again with this evidence (see the module docstring); the gap as it is now
    and whether anything changed (no new evidence: a range derived again, nothing to do)."""
    new = [r for r in evidence if r.id not in set(gap.evidence)]
    if not new:
        return gap, False
    last = max(gap.last_seen, *(r.ts for r in new))
    privacy = most_private([gap.source_privacy, *(r.privacy for r in new)])
    # a closed gap reopens when it comes back: evidence newer than its closing
    reopen = gap.status == "closed" and max(r.ts for r in new) > (gap.closed_at or 0.0)
    conn.execute(
        "UPDATE capability_gaps SET count = count + 1, last_seen = ?, source_privacy = ?, "
        "needs = COALESCE(needs, ?), status = CASE WHEN ? THEN 'open' ELSE status END, "
        "closed_reason = CASE WHEN ? THEN NULL ELSE closed_reason END, "
        "closed_at = CASE WHEN ? THEN NULL ELSE closed_at END, reopened = reopened + ? "
        "WHERE id = ?",
        (last, privacy, needs, reopen, reopen, reopen, int(reopen), gap.id),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO gap_evidence (gap, log_id) VALUES (?, ?)",
        [(gap.id, r.id) for r in new],
    )
    if reopen:
        log.info("gap.reopened", gap=gap.id)
    made = by_id(conn, gap.id)
    assert made is not None
    return made, True


def close(conn: sqlite3.Connection, gap_id: int, reason: str, now: float) -> Gap | str:
    """Close an open gap (``reason``: why, kept); a closed one is returned as it is (a command
    replayed); the reason when there is no such gap."""
    gap = by_id(conn, gap_id)
    if gap is None or gap.erased is not None:
        return f"there is no gap {gap_id}"
    if gap.status == "closed":
        return gap
    why = " ".join(reason.split())[:MAX_REASON] or "closed by the owner"
    conn.execute(
        "UPDATE capability_gaps SET status = 'closed', closed_reason = ?, closed_at = ? "
        "WHERE id = ?",
        (why, now, gap_id),
    )
    log.info("gap.closed", gap=gap_id)
    made = by_id(conn, gap_id)
    assert made is not None
    return made


def close_covered(conn: sqlite3.Connection, tool_names: Iterable[str], now: float) -> list[int]:
    """Close the open gaps whose ``needs`` names one of these tools ("covered by the tool
    NAME"); the ids closed."""
    tools = {w for w in (needs_word(t) for t in tool_names) if w is not None}
    closed: list[int] = []
    for chunk in chunks(sorted(tools)):
        sql = (
            "SELECT id, needs FROM capability_gaps WHERE status = 'open' AND erased IS NULL "  # noqa: S608
            f"AND needs IN ({marks(len(chunk))}) ORDER BY id"
        )
        for gap_id, needs in conn.execute(sql, list(chunk)).fetchall():
            done = close(conn, int(gap_id), f"covered by the tool {needs}", now)
            if not isinstance(done, str):
                closed.append(int(gap_id))
    return sorted(closed)


# -- the owner command (applied by the worker) ----------------------------------------------------


def _cmd_close(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    gap_id, why = args.get("id"), args.get("why", "")
    if isinstance(gap_id, bool) or not isinstance(gap_id, int) or not 0 < gap_id < 2**62:
        raise CommandError("memory.gap_close takes {id: a gap's number, why: text}")
    if not isinstance(why, str) or len(why) > 2000 or any("\ud800" <= c <= "\udfff" for c in why):
        raise CommandError("memory.gap_close takes why as text (at most 2000 characters)")
    done = close(ctx.store.conn, gap_id, why, ctx.now)
    if isinstance(done, str):
        raise CommandError(done)
    return {"gap": done.as_dict()}


COMMANDS: dict[str, Handler] = {"memory.gap_close": _cmd_close}
