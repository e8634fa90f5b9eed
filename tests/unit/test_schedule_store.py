"""Scheduled items in memory (memory/schedule.py, migration 17): adding (idempotent on the turn
that set it), cancelling (scoped to a conversation), the rq bookkeeping (needs_job,
mark_enqueued), recording each occurrence once, the health, the listing order, and the read-only
view the application gets (memory.view)."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memory import schedule
from memory.backup import check, snapshot
from memory.errors import MemoryRefused, ScheduleLimit
from memory.schedule import Item
from memory.schema import LATEST_VERSION, MIGRATIONS, migrate, schema_version, statements
from memory.store import MemoryStore
from memory.view import MemoryView

T0 = 1_800_000_000
_sid = itertools.count(1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def add(store: MemoryStore, **over: Any) -> tuple[Item, bool]:
    fields: dict[str, Any] = {
        "created": float(T0),
        "created_by": f"{next(_sid)}-0",
        "setter_entity": "owner",
        "setter": "ada",
        "channel": "cli",
        "session": "cli:home",
        "conversation": "cli:home",
        "privacy": "owner",
        "text": "water the plants",
        "first_due": T0 + 3600,
        "cron": None,
        "until": None,
        "late": "deliver",
        "grace": 900.0,
        "zone": "UTC",
        **over,
    }
    with store.transaction():
        return schedule.add(store.conn, **fields)


# -- adding ---------------------------------------------------------------------------------


def test_add_stores_an_active_item_due_at_its_first_occurrence(store: MemoryStore) -> None:
    item, added = add(store, text="  call mum  ", cron="0 9 * * *", until=T0 + 86400 * 30.0)
    assert added and item.active and item.recurring
    assert item.text == "call mum" and item.next_due == item.first_due == T0 + 3600
    assert (item.fired, item.skipped, item.enqueued_for, item.ended) == (0, 0, None, None)
    assert schedule.get(store.conn, item.id) == item
    assert item.record()["text"] == "call mum" and item.record()["status"] == "active"


def test_add_is_idempotent_on_created_by_text_first_due_and_cron(store: MemoryStore) -> None:
    first, added = add(store, created_by="7-0", text="a")
    assert added
    again, added_again = add(store, created_by="7-0", text="a", created=float(T0 + 5))
    assert (again, added_again) == (first, False)  # a replayed turn adds nothing twice
    # any part of the key different: another item
    others = [
        add(store, created_by="8-0", text="a"),
        add(store, created_by="7-0", text="b"),
        add(store, created_by="7-0", text="a", first_due=T0 + 7200),
        add(store, created_by="7-0", text="a", cron="0 9 * * *"),
    ]
    assert all(added for _, added in others)
    assert len({i.id for i, _ in others} | {first.id}) == 5
    # the same recurring item again: found too (cron is part of the key, NULL or not)
    assert add(store, created_by="7-0", text="a", cron="0 9 * * *")[1] is False
    assert store.conn.execute("SELECT count(*) FROM scheduled").fetchone()[0] == 5


def test_the_database_refuses_a_second_copy_of_an_item(store: MemoryStore) -> None:
    item, _ = add(store, created_by="9-0")
    with pytest.raises(sqlite3.IntegrityError):
        store.conn.execute(
            "INSERT INTO scheduled (created, created_by, setter, channel, session, conversation, "
            "privacy, text, first_due, late, grace, next_due, status) "
            "SELECT created, created_by, setter, channel, session, conversation, privacy, text, "
            "first_due, late, grace, next_due, status FROM scheduled WHERE id = ?",
            (item.id,),
        )


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"text": "   "}, "needs a text"),
        ({"text": "x" * (schedule.MAX_TEXT + 1)}, "at most"),
        ({"late": "later"}, "late must be"),
        ({"grace": -1.0}, "grace"),
        ({"until": float(T0)}, "until"),
        ({"privacy": "public"}, "privacy"),
        ({"created_by": ""}, "stream id"),
        ({"first_due": 1.5}, "whole epoch seconds"),
    ],
)
def test_add_refuses_what_memory_does_not_store(
    store: MemoryStore, over: dict[str, Any], says: str
) -> None:
    with pytest.raises(ScheduleLimit, match=says) as err:
        add(store, **over)
    assert isinstance(err.value, MemoryRefused) and "\n" not in str(err.value)
    assert store.conn.execute("SELECT count(*) FROM scheduled").fetchone()[0] == 0


def test_an_items_text_changes_only_under_an_erasure(store: MemoryStore) -> None:
    item, _ = add(store)
    with pytest.raises(sqlite3.IntegrityError, match="keeps its text"):
        store.conn.execute("UPDATE scheduled SET text = 'other' WHERE id = ?", (item.id,))
    with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
        store.conn.execute("DELETE FROM scheduled WHERE id = ?", (item.id,))
    # every other column may change as it fires (the text stays as it was)
    store.conn.execute("UPDATE scheduled SET fired = 1 WHERE id = ?", (item.id,))
    # a status without a due time (or the reverse) is refused
    with pytest.raises(sqlite3.IntegrityError):
        store.conn.execute("UPDATE scheduled SET status = 'done' WHERE id = ?", (item.id,))


# -- cancelling -----------------------------------------------------------------------------


def test_cancel_is_scoped_to_a_conversation_when_one_is_given(store: MemoryStore) -> None:
    item, _ = add(store, conversation="matrix:dm-bob", channel="matrix", privacy="direct")
    with store.transaction():
        assert schedule.cancel(
            store.conn, item.id, conversation="matrix:room", now=T0 + 1, reason="asked"
        ) is None  # fmt: skip
    still = schedule.get(store.conn, item.id)
    assert still is not None and still.active
    with store.transaction():
        done = schedule.cancel(
            store.conn, item.id, conversation="matrix:dm-bob", now=T0 + 2, reason="asked"
        )
    assert done is not None and done.status == "cancelled" and done.next_due is None
    assert (done.ended, done.end_reason) == (T0 + 2, "asked")
    with store.transaction():  # no longer active: nothing to cancel
        assert schedule.cancel(store.conn, item.id, conversation=None, now=T0, reason="x") is None
        assert schedule.cancel(store.conn, 999, conversation=None, now=T0, reason="x") is None


def test_the_owner_cancels_in_any_conversation(store: MemoryStore) -> None:
    item, _ = add(store, conversation="matrix:room", channel="matrix", privacy="group")
    with store.transaction():
        done = schedule.cancel(store.conn, item.id, conversation=None, now=T0, reason="owner")
    assert done is not None and done.status == "cancelled"


# -- the rq bookkeeping ---------------------------------------------------------------------


def test_needs_job_until_marked_enqueued_for_its_next_due(store: MemoryStore) -> None:
    late, _ = add(store, first_due=T0 + 500)
    soon, _ = add(store, first_due=T0 + 100, cron="*/10 * * * *")
    ended, _ = add(store, first_due=T0 + 50)
    with store.transaction():
        schedule.cancel(store.conn, ended.id, conversation=None, now=T0, reason="x")
    assert schedule.needs_job(store.conn) == [(soon.id, T0 + 100), (late.id, T0 + 500)]
    assert schedule.needs_job(store.conn, limit=1) == [(soon.id, T0 + 100)]
    with store.transaction():
        # a stale pair (the item moved on since it was read) marks nothing
        schedule.mark_enqueued(store.conn, [(soon.id, T0 + 100), (late.id, T0 + 499)])
    assert schedule.needs_job(store.conn) == [(late.id, T0 + 500)]
    with store.transaction():
        schedule.record_run(
            store.conn, soon.id, T0 + 100, outcome="delivered", stream_id="1-1", at=T0 + 101,
            next_due=T0 + 200,
        )  # fmt: skip
    # advanced: its new next_due needs a job of its own
    assert schedule.needs_job(store.conn) == [(soon.id, T0 + 200), (late.id, T0 + 500)]


def test_due_and_due_times(store: MemoryStore) -> None:
    a, _ = add(store, first_due=T0 + 10)
    b, _ = add(store, first_due=T0 + 10)
    c, _ = add(store, first_due=T0 + 20)
    add(store, first_due=T0 + 30)
    assert [i.id for i in schedule.due(store.conn, T0 + 20)] == [a.id, b.id, c.id]
    assert schedule.due(store.conn, T0 + 9) == []
    # only the seconds whose job was made: an item still waiting for one is not "lost"
    assert schedule.due_times(store.conn, T0 + 25) == []
    with store.transaction():
        schedule.mark_enqueued(store.conn, [(a.id, T0 + 10), (c.id, T0 + 20)])
    assert schedule.due_times(store.conn, T0 + 25) == [T0 + 10, T0 + 20]


# -- recording occurrences ------------------------------------------------------------------


def run(store: MemoryStore, item: Item, occ: int, nxt: int | None, outcome: str = "delivered",
        at: float | None = None) -> bool:  # fmt: skip
    with store.transaction():
        return schedule.record_run(
            store.conn, item.id, occ, outcome=outcome, stream_id=f"{occ}-0",
            at=float(occ + 1) if at is None else at, next_due=nxt,
        )  # fmt: skip


def test_an_occurrence_is_recorded_once(store: MemoryStore) -> None:
    item, _ = add(store, cron="0 * * * *", first_due=T0 + 3600)
    assert run(store, item, T0 + 3600, T0 + 7200) is True
    assert run(store, item, T0 + 3600, T0 + 7200) is False  # a replay changes nothing
    now = schedule.get(store.conn, item.id)
    assert now is not None
    assert (now.fired, now.skipped, now.next_due, now.status) == (1, 0, T0 + 7200, "active")
    assert (now.last_occurrence, now.last_outcome) == (T0 + 3600, "delivered")
    assert schedule.run_of(store.conn, item.id, T0 + 3600) == "delivered"
    assert schedule.run_of(store.conn, item.id, T0 + 7200) is None
    assert run(store, item, T0 + 7200, T0 + 10800, outcome="skipped") is True
    assert run(store, item, T0 + 10800, T0 + 14400, outcome="late") is True
    now = schedule.get(store.conn, item.id)
    assert now is not None and (now.fired, now.skipped) == (2, 1)
    ledger = schedule.runs(store.conn, [item.id])[item.id]
    assert [(r.occurrence, r.outcome, r.stream_id) for r in ledger] == [
        (T0 + 3600, "delivered", f"{T0 + 3600}-0"),
        (T0 + 7200, "skipped", f"{T0 + 7200}-0"),
        (T0 + 10800, "late", f"{T0 + 10800}-0"),
    ]
    with pytest.raises(sqlite3.IntegrityError, match="ledger"):
        store.conn.execute("UPDATE scheduled_runs SET outcome = 'late'")
    with pytest.raises(sqlite3.IntegrityError, match="ledger"):
        store.conn.execute("DELETE FROM scheduled_runs")


def test_a_one_off_is_done_after_its_occurrence(store: MemoryStore) -> None:
    item, _ = add(store)
    assert run(store, item, item.first_due, None, at=T0 + 3601.5)
    done = schedule.get(store.conn, item.id)
    assert done is not None and done.status == "done" and done.next_due is None
    assert (done.ended, done.end_reason) == (T0 + 3601.5, "last occurrence")
    assert run(store, item, item.first_due, None) is False  # replayed after it ended
    assert schedule.needs_job(store.conn) == [] and schedule.due(store.conn, T0 * 2) == []


def test_a_next_occurrence_past_until_ends_the_item(store: MemoryStore) -> None:
    item, _ = add(store, cron="0 9 * * *", until=float(T0 + 3600 + 86400 - 1))
    assert run(store, item, T0 + 3600, T0 + 3600 + 86400)
    ended = schedule.get(store.conn, item.id)
    assert ended is not None and ended.status == "done" and ended.next_due is None


def test_recording_refuses_what_cannot_be(store: MemoryStore) -> None:
    item, _ = add(store)
    with pytest.raises(ValueError, match="outcome"):
        run(store, item, item.first_due, None, outcome="fired")
    with pytest.raises(ValueError, match="no next occurrence"):
        run(store, item, item.first_due, item.first_due + 60)  # a one-off has none
    recurring, _ = add(store, cron="0 * * * *")
    with pytest.raises(ValueError, match="no next occurrence"):
        run(store, recurring, recurring.first_due, recurring.first_due)
    with pytest.raises(ValueError, match="stale"):  # not the occurrence it waits for
        run(store, recurring, recurring.first_due - 3600, recurring.first_due)
    with store.transaction():
        schedule.cancel(store.conn, item.id, conversation=None, now=T0, reason="x")
    with pytest.raises(ValueError, match="not active"):
        run(store, item, item.first_due, None)
    assert store.conn.execute("SELECT count(*) FROM scheduled_runs").fetchone()[0] == 0


# -- counting, health, listing --------------------------------------------------------------


def test_counts_by_setter(store: MemoryStore) -> None:
    add(store, setter="@bob:m.org", created=float(T0))
    gone, _ = add(store, setter="@bob:m.org", created=float(T0 + 10))
    add(store, setter="@bob:m.org", created=float(T0 + 20))
    add(store, setter="ada", created=float(T0 + 20))
    with store.transaction():
        schedule.cancel(store.conn, gone.id, conversation=None, now=T0, reason="x")
    assert schedule.count_active(store.conn, setter="@bob:m.org") == 2
    assert schedule.count_created_since(store.conn, setter="@bob:m.org", since=T0 + 10) == 2
    assert schedule.count_created_since(store.conn, setter="@bob:m.org", since=T0) == 3
    assert schedule.count_active(store.conn, setter="@carol:m.org") == 0


def test_health(store: MemoryStore) -> None:
    empty = schedule.health(store.conn, T0, grace=900)
    assert empty == {"active": 0, "next_due": None, "overdue": 0, "oldest_overdue": None,
                     "beyond_grace": 0, "skipped_24h": 0}  # fmt: skip
    add(store, first_due=T0 - 3600)  # overdue, beyond the grace window
    add(store, first_due=T0 - 120)  # overdue, within it
    add(store, first_due=T0 - 30)  # due, not overdue yet
    add(store, first_due=T0 + 60)
    ended, _ = add(store, first_due=T0 - 7200)
    with store.transaction():
        schedule.cancel(store.conn, ended.id, conversation=None, now=T0, reason="x")
    assert schedule.health(store.conn, T0, grace=900) == {
        "active": 4,
        "next_due": T0 - 3600,
        "overdue": 2,
        "oldest_overdue": T0 - 3600,
        "beyond_grace": 1,
        "skipped_24h": 0,
    }


def test_health_counts_the_occurrences_skipped_in_the_last_day(store: MemoryStore) -> None:
    # late = "skip" says nothing in the conversation: the owner learns of it from the health
    daily, _ = add(store, first_due=T0 - 3 * 86400, cron="0 9 * * *", late="skip")
    once, _ = add(store, first_due=T0 - 600, late="skip")
    fired, _ = add(store, first_due=T0 - 300)
    with store.transaction():
        conn = store.conn
        # two days ago (outside the window), an hour ago, and a one-off now
        schedule.record_run(conn, daily.id, T0 - 3 * 86400, outcome="skipped", stream_id="1-0",
                            at=T0 - 2 * 86400, next_due=T0 - 2 * 86400 + 60)  # fmt: skip
        schedule.record_run(conn, daily.id, T0 - 2 * 86400 + 60, outcome="skipped",
                            stream_id="2-0", at=T0 - 3600, next_due=T0 + 86400)  # fmt: skip
        schedule.record_run(conn, once.id, T0 - 600, outcome="skipped", stream_id="3-0",
                            at=T0 - 10, next_due=None)  # fmt: skip
        schedule.record_run(conn, fired.id, T0 - 300, outcome="late", stream_id="4-0",
                            at=T0 - 5, next_due=None)  # fmt: skip
    health = schedule.health(store.conn, T0, grace=900)
    assert health["skipped_24h"] == 2
    assert health["active"] == 1  # the skipped one-off is done: it still counts as skipped
    assert schedule.health(store.conn, T0 + 86400, grace=900)["skipped_24h"] == 0


def test_listing_order(store: MemoryStore) -> None:
    c, _ = add(store, first_due=T0 + 300, conversation="matrix:room")
    a, _ = add(store, first_due=T0 + 100)
    b, _ = add(store, first_due=T0 + 200, conversation="matrix:room")
    old_end, _ = add(store, first_due=T0 + 400)
    new_end, _ = add(store, first_due=T0 + 500, conversation="matrix:room")
    with store.transaction():
        schedule.cancel(store.conn, old_end.id, conversation=None, now=T0 + 1, reason="x")
        schedule.cancel(store.conn, new_end.id, conversation=None, now=T0 + 2, reason="x")
    ids = [i.id for i in schedule.listing(store.conn)]
    assert ids == [a.id, b.id, c.id]  # active ones by when they are due
    every = [i.id for i in schedule.listing(store.conn, include_ended=True)]
    assert every == [a.id, b.id, c.id, new_end.id, old_end.id]  # then the latest ended first
    room = schedule.in_conversation(store.conn, "matrix:room")
    assert [i.id for i in room] == [b.id, c.id]
    room_all = schedule.in_conversation(store.conn, "matrix:room", include_ended=True)
    assert [i.id for i in room_all] == [b.id, c.id, new_end.id]
    assert schedule.in_conversation(store.conn, "matrix:nowhere", include_ended=True) == []


def test_event_ids() -> None:
    assert schedule.event_id(12, T0) == f"schedule:12:{T0}"
    assert schedule.parse_event_id(f"schedule:12:{T0}") == (12, T0)
    for other in ("schedule:12", "schedule:x:1", "$abc:m.org", f"schedule:12:{T0}:9", ""):
        assert schedule.parse_event_id(other) is None
    assert schedule.command_key("5-0") == "cmd:5-0"


# -- the application's read-only view, and the schema across versions -----------------------


def test_the_view_reads_items_runs_and_health(store: MemoryStore) -> None:
    a, _ = add(store, first_due=T0 + 100)
    b, _ = add(store, first_due=T0 + 50)
    run(store, b, T0 + 50, None)
    with MemoryView(store.path) as view:
        assert [i.id for i in view.scheduled()] == [a.id]
        assert [i.id for i in view.scheduled(include_ended=True)] == [a.id, b.id]
        assert view.scheduled_item(b.id) == schedule.get(store.conn, b.id)
        assert view.scheduled_item(999) is None
        runs = view.scheduled_runs([a.id, b.id])
        assert list(runs) == [b.id] and runs[b.id][0].outcome == "delivered"
        health = view.schedule_health(T0 + 200, 900)
        assert health["active"] == 1 and health["overdue"] == 1


def _database_at(path: Path, version: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS:
        if migration.version > version:
            break
        for stmt in statements(migration.sql):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {migration.version}")
    conn.close()


def test_a_database_of_the_previous_version_gains_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    _database_at(path, 16)
    with MemoryStore(path) as store:
        assert schema_version(store.conn) == LATEST_VERSION >= 17
        item, added = add(store)
        assert added and schedule.listing(store.conn) == [item]


def test_a_backup_with_items_passes_the_restore_check(store: MemoryStore, tmp_path: Path) -> None:
    add(store)
    copy = snapshot(store.path, tmp_path / "copy.sqlite3")
    assert copy.schema_version == LATEST_VERSION
    assert check(copy.path).schema_version == LATEST_VERSION  # no schema object is foreign
    # and an older backup (before the tables) is still one: the restore migrates it
    old = tmp_path / "old.sqlite3"
    _database_at(old, 16)
    assert check(old).schema_version == 16


def test_an_item_records_its_zone_and_rezone_moves_only_what_still_waits(
    store: MemoryStore,
) -> None:
    daily, _ = add(store, first_due=T0, cron="0 9 * * *", zone="Europe/Berlin")
    once, _ = add(store, first_due=T0 + 60, conversation="cli:other")
    assert daily.zone == "Europe/Berlin"
    assert [i.id for i in schedule.in_other_zone(store.conn, "America/New_York")] == [daily.id]
    assert schedule.in_other_zone(store.conn, "Europe/Berlin") == []  # a one-off is never in it
    with store.transaction():
        # it fired meanwhile (waits for another time now): left as it is
        assert not schedule.rezone(store.conn, daily.id, was=T0 - 5, next_due=T0 + 7,
                                   zone="America/New_York", now=T0)  # fmt: skip
        assert not schedule.rezone(store.conn, once.id, was=T0 + 60, next_due=T0 + 7,
                                   zone="America/New_York", now=T0)  # fmt: skip
        assert schedule.rezone(store.conn, daily.id, was=T0, next_due=T0 + 6 * 3600,
                               zone="America/New_York", now=T0)  # fmt: skip
    moved = schedule.get(store.conn, daily.id)
    assert moved is not None and (moved.next_due, moved.zone) == (T0 + 6 * 3600, "America/New_York")
    assert schedule.in_other_zone(store.conn, "America/New_York") == []
    with store.transaction():  # the advance records the zone it computed in
        schedule.record_run(store.conn, daily.id, T0 + 6 * 3600, outcome="delivered",
                            stream_id="1-0", at=T0 + 6 * 3600, next_due=T0 + 30 * 3600,
                            zone="Asia/Tokyo")  # fmt: skip
    assert schedule.get(store.conn, daily.id).zone == "Asia/Tokyo"  # type: ignore[union-attr]


def test_migration_18_adds_the_zone_to_items_stored_before(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    for migration in MIGRATIONS[:17]:
        for stmt in statements(migration.sql):
            conn.execute(stmt)
    conn.execute(
        "INSERT INTO scheduled (created, created_by, setter, channel, session, conversation, "
        "privacy, text, first_due, cron, late, grace, next_due, status) VALUES "
        f"(1, 'x', 'ada', 'cli', 'cli:t', 'cli:t', 'owner', 'old', {T0}, '0 9 * * *', "
        f"'deliver', 60, {T0}, 'active')"
    )
    conn.execute("PRAGMA user_version = 17")
    assert migrate(conn) == LATEST_VERSION >= 18
    (item,) = schedule.listing(conn)
    assert item.zone is None and item.next_due == T0
    conn.close()
