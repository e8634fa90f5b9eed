"""Scheduled work: reminders and recurring tasks, as memory stores them (tables ``scheduled`` and
``scheduled_runs``, migrations 17 and 18).

An **item** is set in a conversation by a turn (the model's ``schedule`` tool) or by an owner
command, and written here by the one writer (the worker). It keeps where it fires (channel,
session, conversation and that conversation's privacy, copied from where it was set), who set it,
its text, its times (UTC epoch seconds: the first occurrence, a 5-field cron expression in the
owner's zone for a recurring one, an end) and what to do when an occurrence is late. Its
``next_due`` is the one occurrence it waits for; the jobs fire each occurrence as a ``scheduled``
entry whose event id is :func:`event_id` (``schedule:<id>:<occurrence>``), and the worker's dedupe
by event id makes each fire once.

Each occurrence becomes one row of ``scheduled_runs`` (delivered, late or skipped), written with
the item's advance to its next occurrence (:func:`record_run`): the row's key (item, occurrence)
is what makes recording an occurrence happen once, whatever replays. The occurrence's message (the
item's text under a header) goes into the log like any message of its conversation, so its
audience in search and context is that conversation's.

**Zones.** An item records the zone its times were computed in (``zone``, an IANA name; the
owner's zone when it was set or last advanced). A cron expression is read in the owner's zone,
so when ``[owner] timezone`` changes, the worker's scheduling duty (worker/scheduling.py) finds
the active cron items computed in another zone (:func:`in_other_zone`) and moves their
``next_due`` to the cron's next wall time in the new zone (:func:`rezone`). A one-off's time
(``at``, ``in``) is an instant and stays one: an ``at`` without an offset was the owner's wall
time when it was set, and a calendar keeps a meeting's instant when its owner travels.

What changes: ``next_due``, the counts and the status as it fires or ends (``done`` after its last
occurrence, ``cancelled``, ``erased``) and ``enqueued_for`` (which ``next_due`` an rq job exists
for). What never changes is its text, except that an audited erasure blanks it
(memory/schedule_erasure.py; the schema refuses anything else). An item is never deleted.

``created_by`` is the stream id of the turn that set it, or :func:`command_key` of the owner
command's entry (``cmd:<stream id>``: that entry holds the text, so an erasure deletes it from
Redis too, memory/copies.py). Adding is idempotent on (created_by, text, first due, cron): a
replayed turn adds nothing twice.

These functions take the connection and run inside the writer's transaction (or a read-only one:
everything but :func:`add`, :func:`cancel`, :func:`mark_enqueued` and :func:`record_run` reads).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract.messages import Privacy
from memory.errors import ScheduleLimit
from memory.sql import chunks, marks, savepoint

__all__ = [
    "MAX_TEXT",
    "OVERDUE_AFTER",
    "Item",
    "Run",
    "ScheduleLimit",
    "add",
    "cancel",
    "command_key",
    "count_active",
    "count_created_since",
    "due",
    "due_times",
    "event_id",
    "get",
    "health",
    "in_conversation",
    "in_other_zone",
    "listing",
    "mark_enqueued",
    "needs_job",
    "parse_event_id",
    "record_run",
    "rezone",
    "run_of",
    "runs",
    "skipped_since",
]

MAX_TEXT = 2000  # characters of an item's text
OVERDUE_AFTER = 60  # seconds past its due time an active item counts as overdue (health)
SKIPPED_WINDOW = 86400.0  # seconds back the health's count of skipped occurrences reaches
LATE_POLICIES = ("deliver", "skip")
OUTCOMES = ("delivered", "late", "skipped")

COLUMNS = (
    "id, created, created_by, setter_entity, setter, channel, session, conversation, privacy, "
    "text, first_due, cron, until, late, grace, next_due, status, fired, skipped, "
    "last_occurrence, last_outcome, enqueued_for, ended, end_reason, zone"
)
_SELECT = f"SELECT {COLUMNS} FROM scheduled"  # noqa: S608 (constants)
# active items first, by when they are due; then the ended ones, the latest ended first
_ORDER = " ORDER BY status != 'active', next_due, ended DESC, id"
_EVENT = re.compile(r"^schedule:([0-9]{1,18}):(-?[0-9]{1,18})$")


@dataclass(frozen=True)
class Item:
    """One scheduled item, as stored (see the module docstring). Times are UTC epoch seconds."""

    id: int
    created: float
    created_by: str
    setter_entity: str | None
    setter: str
    channel: str
    session: str
    conversation: str
    privacy: str
    text: str
    first_due: int
    cron: str | None
    until: float | None
    late: str
    grace: float
    next_due: int | None
    status: str
    fired: int
    skipped: int
    last_occurrence: int | None
    last_outcome: str | None
    enqueued_for: int | None
    ended: float | None
    end_reason: str | None
    zone: str | None = None  # the IANA zone its times were computed in (None: before migration 18)

    @property
    def active(self) -> bool:
        return self.status == "active"

    @property
    def recurring(self) -> bool:
        return self.cron is not None

    def record(self) -> dict[str, Any]:
        """Every field, for JSON (``relaybot reminders --json``)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Run:
    """What one occurrence of an item became: ``delivered``, ``late`` (delivered, late) or
    ``skipped``; ``stream_id`` is its ``scheduled`` entry, ``at`` when it was recorded."""

    item: int
    occurrence: int
    outcome: str
    stream_id: str
    at: float


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _item(raw: Sequence[Any]) -> Item:
    (id_, created, created_by, setter_entity, setter, channel, session, conversation, privacy,
     text, first_due, cron, until, late, grace, next_due, status, fired, skipped, last_occ,
     last_outcome, enqueued_for, ended, end_reason, zone) = raw  # fmt: skip
    return Item(
        id=int(id_),
        created=float(created),
        created_by=str(created_by),
        setter_entity=_opt_str(setter_entity),
        setter=str(setter),
        channel=str(channel),
        session=str(session),
        conversation=str(conversation),
        privacy=str(privacy),
        text=str(text),
        first_due=int(first_due),
        cron=_opt_str(cron),
        until=_opt_float(until),
        late=str(late),
        grace=float(grace),
        next_due=_opt_int(next_due),
        status=str(status),
        fired=int(fired),
        skipped=int(skipped),
        last_occurrence=_opt_int(last_occ),
        last_outcome=_opt_str(last_outcome),
        enqueued_for=_opt_int(enqueued_for),
        ended=_opt_float(ended),
        end_reason=_opt_str(end_reason),
        zone=_opt_str(zone),
    )


def event_id(item_id: int, occurrence: int) -> str:
    """The platform event id of an item's occurrence (the worker's dedupe key)."""
    return f"schedule:{int(item_id)}:{int(occurrence)}"


def parse_event_id(value: str) -> tuple[int, int] | None:
    """(item id, occurrence) of an occurrence's event id; None when it is not one."""
    found = _EVENT.match(value)
    return None if found is None else (int(found[1]), int(found[2]))


def command_key(stream_id: str) -> str:
    """``created_by`` of an item an owner command set: ``cmd:<the command's stream id>``."""
    return f"cmd:{stream_id}"


# -- writing (the one writer) ---------------------------------------------------------------------


def _checked_text(text: str) -> str:
    text = text.strip()
    if not text:
        raise ScheduleLimit("a reminder needs a text: say what to remind of")
    if len(text) > MAX_TEXT:
        raise ScheduleLimit(
            f"a reminder's text is at most {MAX_TEXT} characters (this one has {len(text)}): "
            "shorten it"
        )
    return text


def _check_times(first_due: int, until: float | None, late: str, grace: float) -> None:
    if isinstance(first_due, bool) or not isinstance(first_due, int):
        raise ScheduleLimit(f"first_due must be whole epoch seconds, not {first_due!r}")
    if until is not None and until < first_due:
        raise ScheduleLimit("`until` is before the first occurrence: nothing would fire")
    if late not in LATE_POLICIES:
        raise ScheduleLimit(f"late must be one of {', '.join(LATE_POLICIES)}, not {late!r}")
    if not grace >= 0:
        raise ScheduleLimit(f"the grace window must be 0 seconds or more, not {grace!r}")


def _existing(
    conn: sqlite3.Connection, created_by: str, text: str, first_due: int, cron: str | None
) -> Item | None:
    """The item this (created_by, text, first due, cron) added before; an erased one counts
    (its text is blank, so it is found by the rest of its key): a turn replayed after an
    erasure must not bring the erased item back."""
    key = (created_by, first_due, cron or "")
    raw = conn.execute(
        f"{_SELECT} WHERE created_by = ? AND first_due = ? AND coalesce(cron, '') = ? "
        "AND (text = ? OR status = 'erased') ORDER BY status = 'erased', id LIMIT 1",
        (*key, text),
    ).fetchone()
    return None if raw is None else _item(raw)


def add(
    conn: sqlite3.Connection,
    *,
    created: float,
    created_by: str,
    setter_entity: str | None,
    setter: str,
    channel: str,
    session: str,
    conversation: str,
    privacy: str,
    text: str,
    first_due: int,
    cron: str | None,
    until: float | None,
    late: str,
    grace: float,
    zone: str | None,
) -> tuple[Item, bool]:
    """Store a new active item due first at ``first_due``, its times computed in ``zone`` (the
    owner's, an IANA name: see the module docstring); (the item, True). Idempotent on
    (created_by, text, first due, cron): a replay returns (the item stored before, False).
    :class:`ScheduleLimit` for what memory does not store (an empty or too long text, a bad
    late policy, an ``until`` before the first occurrence). The caller has checked the times
    and the limits (worker/schedule_rules.py, the tools)."""
    text = _checked_text(text)
    _check_times(first_due, until, late, grace)
    if privacy not in {p.value for p in Privacy}:
        raise ScheduleLimit(f"not a conversation's privacy class: {privacy!r}")
    if not created_by:
        raise ScheduleLimit("an item needs the stream id of the turn or command that set it")
    with savepoint(conn, "schedule_add"):
        found = _existing(conn, created_by, text, first_due, cron)
        if found is not None:
            return found, False
        cur = conn.execute(
            "INSERT INTO scheduled (created, created_by, setter_entity, setter, channel, "
            "session, conversation, privacy, text, first_due, cron, until, late, grace, "
            "next_due, status, zone) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?)",
            (created, created_by, setter_entity, setter, channel, session, conversation,
             privacy, text, first_due, cron, until, late, grace, first_due, zone),
        )  # fmt: skip
        item = get(conn, int(cur.lastrowid or 0))
    if item is None:  # pragma: no cover (just inserted)
        raise sqlite3.IntegrityError("a scheduled item was not stored")
    return item, True


def cancel(
    conn: sqlite3.Connection,
    item_id: int,
    *,
    conversation: str | None,
    now: float,
    reason: str,
) -> Item | None:
    """End the active item ``item_id`` (``cancelled``, with ``reason``); the item as it is now,
    or None when there is no active item of that id (in ``conversation`` when given: a tool
    cancels only its own conversation's items)."""
    sql = (
        "UPDATE scheduled SET status = 'cancelled', next_due = NULL, ended = ?, end_reason = ? "
        "WHERE id = ? AND status = 'active'"
    )
    params: list[Any] = [now, reason or "cancelled", item_id]
    if conversation is not None:
        sql += " AND conversation = ?"
        params.append(conversation)
    if conn.execute(sql, params).rowcount != 1:
        return None
    return get(conn, item_id)


def rezone(
    conn: sqlite3.Connection,
    item_id: int,
    *,
    was: int,
    next_due: int | None,
    zone: str,
    now: float,
) -> bool:
    """A recurring item computed in another zone, moved to ``next_due`` in ``zone`` (the
    owner's now; worker/scheduling.py computes it): only while it is active and still waits for
    ``was`` (the due time it was computed from), so an item that fired in between is left as it
    is. ``None``, or a ``next_due`` past its ``until``, ends it (``done``: no occurrence is left).
    Whether it changed."""
    item = get(conn, item_id)
    if item is None or not item.active or item.next_due != was or not item.recurring:
        return False
    if next_due is not None and item.until is not None and next_due > item.until:
        next_due = None
    if next_due is None:
        sql = (
            "UPDATE scheduled SET next_due = NULL, status = 'done', ended = ?, "
            "end_reason = ?, zone = ? WHERE id = ? AND status = 'active' AND next_due = ?"
        )
        params: tuple[Any, ...] = (now, f"no occurrence left in {zone}", zone, item_id, was)
    else:
        sql = (
            "UPDATE scheduled SET next_due = ?, zone = ? "
            "WHERE id = ? AND status = 'active' AND next_due = ?"
        )
        params = (next_due, zone, item_id, was)
    return conn.execute(sql, params).rowcount == 1


def mark_enqueued(conn: sqlite3.Connection, pairs: Sequence[tuple[int, int]]) -> None:
    """Record that an rq job exists for each (item id, next_due); an item that moved on since
    (its next_due is another) is left as it is, so it is enqueued again."""
    conn.executemany(
        "UPDATE scheduled SET enqueued_for = ? WHERE id = ? AND status = 'active' AND next_due = ?",
        [(due_at, item_id, due_at) for item_id, due_at in pairs],
    )


def record_run(
    conn: sqlite3.Connection,
    item_id: int,
    occurrence: int,
    *,
    outcome: str,
    stream_id: str,
    at: float,
    next_due: int | None,
    zone: str | None = None,
) -> bool:
    """Record what ``occurrence`` became and advance the item to ``next_due`` (None: that was
    its last, it is ``done``; a ``next_due`` past the item's ``until`` ends it too), computed in
    ``zone`` (recorded with it; None keeps the item's). False, and
    nothing changed, when that occurrence was recorded already (a replay). ValueError when the
    item is not active, ``occurrence`` is not the one it waits for (a stale occurrence), or
    ``next_due`` is not a later occurrence of a recurring item."""
    if outcome not in OUTCOMES:
        raise ValueError(f"an occurrence's outcome is one of {', '.join(OUTCOMES)}")
    with savepoint(conn, "schedule_run"):
        if run_of(conn, item_id, occurrence) is not None:
            return False
        item = get(conn, item_id)
        if item is None or not item.active:
            raise ValueError(f"scheduled item #{item_id} is not active: nothing to advance")
        if occurrence != item.next_due:
            raise ValueError(
                f"scheduled item #{item_id} waits for {item.next_due}, not {occurrence}: stale"
            )
        if next_due is not None and (next_due <= occurrence or not item.recurring):
            raise ValueError(f"no next occurrence {next_due} after {occurrence} for #{item_id}")
        if next_due is not None and item.until is not None and next_due > item.until:
            next_due = None
        conn.execute(
            "INSERT INTO scheduled_runs (item, occurrence, outcome, stream_id, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (item_id, occurrence, outcome, stream_id, at),
        )
        skipped = outcome == "skipped"
        ended = (at, "last occurrence") if next_due is None else (None, None)
        conn.execute(
            "UPDATE scheduled SET fired = fired + ?, skipped = skipped + ?, last_occurrence = ?, "
            "last_outcome = ?, next_due = ?, status = ?, ended = ?, end_reason = ?, "
            "zone = coalesce(?, zone) WHERE id = ?",
            (0 if skipped else 1, 1 if skipped else 0, occurrence, outcome, next_due,
             "done" if next_due is None else "active", *ended, zone, item_id),
        )  # fmt: skip
    return True


# -- reading ------------------------------------------------------------------------------------


def get(conn: sqlite3.Connection, item_id: int) -> Item | None:
    raw = conn.execute(f"{_SELECT} WHERE id = ?", (item_id,)).fetchone()
    return None if raw is None else _item(raw)


def in_conversation(
    conn: sqlite3.Connection, conversation: str, *, include_ended: bool = False
) -> list[Item]:
    """The items of one conversation (the ``scheduled`` tool's view): active ones by when they
    are due, then (``include_ended``) the ended ones, the latest first."""
    where = "" if include_ended else " AND status = 'active'"
    sql = f"{_SELECT} WHERE conversation = ?{where}{_ORDER}"
    return [_item(r) for r in conn.execute(sql, (conversation,))]


def listing(conn: sqlite3.Connection, *, include_ended: bool = False) -> list[Item]:
    """Every item (the owner's view, ``relaybot reminders``), in the order of
    :func:`in_conversation`."""
    where = "" if include_ended else " WHERE status = 'active'"
    return [_item(r) for r in conn.execute(f"{_SELECT}{where}{_ORDER}")]


def count_active(conn: sqlite3.Connection, *, setter: str) -> int:
    """How many active items ``setter`` (a handle) has (the per-sender cap)."""
    raw = conn.execute(
        "SELECT count(*) FROM scheduled WHERE setter = ? AND status = 'active'", (setter,)
    ).fetchone()
    return int(raw[0])


def count_created_since(conn: sqlite3.Connection, *, setter: str, since: float) -> int:
    """How many items ``setter`` set since ``since``, ended ones too (the per-hour cap)."""
    raw = conn.execute(
        "SELECT count(*) FROM scheduled WHERE setter = ? AND created >= ?", (setter, since)
    ).fetchone()
    return int(raw[0])


def needs_job(conn: sqlite3.Connection, limit: int = 1000) -> list[tuple[int, int]]:
    """(item id, next_due) of the active items no rq job was made for at their ``next_due``,
    the soonest first."""
    sql = (
        "SELECT id, next_due FROM scheduled WHERE status = 'active' "
        "AND (enqueued_for IS NULL OR enqueued_for != next_due) ORDER BY next_due, id LIMIT ?"
    )
    return [(int(i), int(d)) for i, d in conn.execute(sql, (limit,))]


def in_other_zone(conn: sqlite3.Connection, zone: str, limit: int = 1000) -> list[Item]:
    """The active recurring items whose times were computed in a zone other than ``zone`` (or
    in an unrecorded one), the soonest first."""
    sql = (
        f"{_SELECT} WHERE status = 'active' AND cron IS NOT NULL "
        "AND (zone IS NULL OR zone != ?) ORDER BY next_due, id LIMIT ?"
    )
    return [_item(r) for r in conn.execute(sql, (zone, limit))]


def due(conn: sqlite3.Connection, upto: int) -> list[Item]:
    """The active items due at or before ``upto``, the soonest first."""
    sql = f"{_SELECT} WHERE status = 'active' AND next_due <= ? ORDER BY next_due, id"
    return [_item(r) for r in conn.execute(sql, (upto,))]


def due_times(conn: sqlite3.Connection, upto: int) -> list[int]:
    """The distinct ``next_due`` of the active items due at or before ``upto`` whose rq job
    was made (one rq job fires every item due in the same second; an item still waiting for
    its job is :func:`needs_job`'s, not lost)."""
    sql = (
        "SELECT DISTINCT next_due FROM scheduled WHERE status = 'active' AND next_due <= ? "
        "AND enqueued_for = next_due ORDER BY next_due"
    )
    return [int(d) for (d,) in conn.execute(sql, (upto,))]


def run_of(conn: sqlite3.Connection, item_id: int, occurrence: int) -> str | None:
    """What ``occurrence`` of the item became (None: not recorded)."""
    raw = conn.execute(
        "SELECT outcome FROM scheduled_runs WHERE item = ? AND occurrence = ?",
        (item_id, occurrence),
    ).fetchone()
    return None if raw is None else str(raw[0])


def runs(conn: sqlite3.Connection, item_ids: Sequence[int]) -> dict[int, list[Run]]:
    """The recorded occurrences of these items, oldest first (items without any are left out)."""
    out: dict[int, list[Run]] = {}
    for chunk in chunks(list(item_ids)):
        sql = (
            "SELECT item, occurrence, outcome, stream_id, at FROM scheduled_runs "  # noqa: S608
            f"WHERE item IN ({marks(len(chunk))}) ORDER BY item, occurrence"
        )
        for item, occ, outcome, sid, at in conn.execute(sql, list(chunk)):
            out.setdefault(int(item), []).append(
                Run(int(item), int(occ), str(outcome), str(sid), float(at))
            )
    return out


def health(conn: sqlite3.Connection, now: float, *, grace: float) -> dict[str, Any]:
    """The scheduler's health as memory sees it: ``active`` items, the soonest ``next_due``,
    ``overdue`` (active, due more than :data:`OVERDUE_AFTER` seconds ago: no occurrence fired
    for them) and the ``oldest_overdue`` due time, and ``beyond_grace``: how many of those are
    later than ``grace`` (their occurrence will be late, or skipped); ``skipped_24h``: the
    occurrences skipped (``late = "skip"``) in the last :data:`SKIPPED_WINDOW` seconds, which
    nothing said in their conversations."""
    overdue_before = now - OVERDUE_AFTER
    raw = conn.execute(
        "SELECT count(*), min(next_due), sum(next_due < ?), min(CASE WHEN next_due < ? "
        "THEN next_due END), sum(next_due < ?) FROM scheduled WHERE status = 'active'",
        (overdue_before, overdue_before, now - grace),
    ).fetchone()
    return {
        "active": int(raw[0]),
        "next_due": _opt_int(raw[1]),
        "overdue": int(raw[2] or 0),
        "oldest_overdue": _opt_int(raw[3]),
        "beyond_grace": int(raw[4] or 0),
        "skipped_24h": skipped_since(conn, now - SKIPPED_WINDOW),
    }


def skipped_since(conn: sqlite3.Connection, since: float) -> int:
    """How many occurrences were skipped (recorded) since ``since``."""
    raw = conn.execute(
        "SELECT count(*) FROM scheduled_runs WHERE outcome = 'skipped' AND at >= ?", (since,)
    ).fetchone()
    return int(raw[0])
