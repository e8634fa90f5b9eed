"""Layer 0, the log: schema, append-only enforcement, idempotent appends, the recent() cache."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.messages import InboundMessage, Kind, Privacy, Reply, ReplyKind
from memory.caches import _SQL
from memory.rows import LogRow, order_key
from memory.schema import LATEST_VERSION, SchemaError, migrate, statements
from memory.store import MemoryStore


def key_of(store: MemoryStore, row_id: int) -> tuple[float, int]:
    """The order key of row ``row_id`` (memory.rows.order_key); above every row if there is none."""
    raw = store.conn.execute("SELECT recorded_ts FROM log WHERE id = ?", (row_id,)).fetchone()
    return (float("inf"), row_id) if raw is None else (float(raw[0]), row_id)


def inbound(
    i: int,
    *,
    conversation: str = "cli:local",
    channel: str = "cli",
    sender: str = "me",
    privacy: Privacy = Privacy.OWNER,
    text: str | None = None,
    extra: dict[str, object] | None = None,
) -> InboundMessage:
    return InboundMessage(
        kind=Kind.MESSAGE,
        channel=channel,
        session=f"{channel}-session",
        conversation=conversation,
        sender=sender,
        sender_name=sender.title(),
        privacy=privacy,
        text=f"message {i}" if text is None else text,
        ts=1_795_000_000.0 + i,
        event_id=f"event-{i}",
        extra=extra or {},
    )


def reply_to(stream_id: str, *, conversation: str = "cli:local", text: str = "ok") -> Reply:
    return Reply(
        reply_id=f"reply-{stream_id}",
        answers=stream_id,
        kind=ReplyKind.REPLY,
        channel="cli",
        session="cli-session",
        conversation=conversation,
        in_reply_to="event",
        text=text,
        created=1_795_000_100.0,
    )


def sid(i: int) -> str:
    return f"1795000000000-{i}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.sqlite3"


@pytest.fixture
def store(db_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(db_path) as s:
        yield s


def raw(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(db_path, isolation_level=None)


def fill(store: MemoryStore, n: int, conversations: tuple[str, ...] = ("a", "b", "c")) -> None:
    with store.transaction():
        for i in range(n):
            conv = conversations[i % len(conversations)]
            store.append_inbound(inbound(i, conversation=conv), sid(i), is_owner=i % 2 == 0)
            if i % 3 == 0:
                store.append_reply(reply_to(sid(i), conversation=conv), sender="relaybot",
                                   privacy=Privacy.OWNER)  # fmt: skip


# -- schema ----------------------------------------------------------------------------------


def test_schema_version_wal_and_pragmas(store: MemoryStore, db_path: Path) -> None:
    conn = store._conn
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    with raw(db_path) as other:  # WAL is persistent: any connection sees it
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_synchronous_from_argument(db_path: Path) -> None:
    with MemoryStore(db_path, synchronous="full") as s:
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    with pytest.raises(ValueError, match="synchronous"):
        MemoryStore(db_path, synchronous="FAST; DROP TABLE log")


def test_migrations_apply_once(db_path: Path) -> None:
    MemoryStore(db_path).close()
    with raw(db_path) as conn:
        assert migrate(conn) == LATEST_VERSION  # nothing pending: a no-op
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"log", "erasure_grant", "reply_status"} <= tables
    MemoryStore(db_path).close()  # reopening is fine


def test_newer_schema_is_refused(db_path: Path) -> None:
    MemoryStore(db_path).close()
    with raw(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    with pytest.raises(SchemaError, match="newer"):
        MemoryStore(db_path)
    with pytest.raises(SchemaError, match="newer"):
        MemoryStore(db_path, readonly=True)


def test_statement_splitter_keeps_trigger_bodies() -> None:
    script = (
        "CREATE TABLE t (x);\nCREATE TRIGGER tr BEFORE DELETE ON t BEGIN SELECT 1; SELECT 2; END;"
    )
    parts = statements(script)
    assert len(parts) == 2
    assert parts[1].endswith("END;")


# -- append-only, enforced by the database -----------------------------------------------------


def test_update_and_delete_refused_by_the_database(store: MemoryStore, db_path: Path) -> None:
    row = store.append_inbound(inbound(1), sid(1), is_owner=True)
    store.mark_reply("r1", "delivered")
    with raw(db_path) as conn:
        with pytest.raises(sqlite3.IntegrityError, match="log is append-only: UPDATE"):
            conn.execute("UPDATE log SET text = 'rewritten' WHERE id = ?", (row.id,))
        with pytest.raises(sqlite3.IntegrityError, match="log is append-only: DELETE"):
            conn.execute("DELETE FROM log")
        with pytest.raises(sqlite3.IntegrityError, match="reply_status is append-only"):
            conn.execute("UPDATE reply_status SET detail = 'x'")
        with pytest.raises(sqlite3.IntegrityError, match="reply_status is append-only"):
            conn.execute("DELETE FROM reply_status")
    assert store.recent(10)[-1] == row


def test_replace_or_upsert_cannot_rewrite_a_row(store: MemoryStore, db_path: Path) -> None:
    row = store.append_inbound(inbound(1, text="original"), sid(1), is_owner=True)
    with raw(db_path) as conn:
        # REPLACE would delete the old row without firing delete triggers, and an upsert would
        # update it: a write to an existing key is a no-op instead.
        conn.execute(
            "INSERT OR REPLACE INTO log (direction, stream_id, kind, channel, session, "
            "conversation, sender, is_owner, privacy, text, event_id, recorded_ts) VALUES "
            "('in', ?, 'message', 'cli', 's', 'c', 'x', 0, 'owner', 'forged', 'e', 0)",
            (sid(1),),
        )
        conn.execute(
            "INSERT OR REPLACE INTO log (id, direction, stream_id, kind, channel, session, "
            "conversation, sender, is_owner, privacy, text, event_id, recorded_ts) VALUES "
            "(?, 'in', 'other', 'message', 'cli', 's', 'c', 'x', 0, 'owner', 'forged', 'e', 0)",
            (row.id,),
        )
        conn.execute(
            "INSERT INTO log (direction, stream_id, kind, channel, session, conversation, "
            "sender, is_owner, privacy, text, event_id, recorded_ts) VALUES "
            "('in', ?, 'message', 'cli', 's', 'c', 'x', 0, 'owner', 'y', 'e', 0) "
            "ON CONFLICT DO UPDATE SET text = 'forged'",
            (sid(1),),
        )
        texts = [r[0] for r in conn.execute("SELECT text FROM log")]
    assert texts == ["original"]


def test_an_erasure_grant_is_the_only_way_to_delete(store: MemoryStore, db_path: Path) -> None:
    """The hook a future audited erasure will use: the triggers stand down while a grant exists."""
    store.append_inbound(inbound(1), sid(1), is_owner=True)
    with raw(db_path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO erasure_grant (id, requested_by, reason, granted_at) "
            "VALUES (1, 'owner', 'test', 0)"
        )
        conn.execute("DELETE FROM log")
        conn.execute("DELETE FROM erasure_grant")
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM log").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM erasure_grant").fetchone()[0] == 0


# -- appends -----------------------------------------------------------------------------------


def test_append_inbound_records_every_field(store: MemoryStore) -> None:
    msg = inbound(7, channel="matrix", sender="@alice:example.org", privacy=Privacy.DIRECT,
                  conversation="matrix:room1", extra={"reply_to": "$x", "n": 1})  # fmt: skip
    before = time.time()
    row = store.append_inbound(msg, sid(7), is_owner=False)
    assert row.direction == "in"
    assert row.inbound
    assert row.stream_id == sid(7)
    assert (row.kind, row.channel, row.session) == ("message", "matrix", "matrix-session")
    assert (row.conversation, row.sender, row.sender_name) == (
        "matrix:room1",
        "@alice:example.org",
        "@Alice:Example.Org",
    )
    assert row.entity is None
    assert row.is_owner is False
    assert row.privacy == "direct"
    assert row.text == "message 7"
    assert row.event_id == "event-7"
    assert row.reply_id is None
    assert row.platform_ts == msg.ts
    assert row.ts == msg.ts
    assert row.recorded_ts >= before
    assert row.extra_data == {"reply_to": "$x", "n": 1}
    assert store.recent(1) == [row]
    owner = store.append_inbound(inbound(8), sid(8), is_owner=True)
    assert owner.is_owner is True
    assert owner.entity == "owner"


def test_replaying_inbound_adds_nothing(store: MemoryStore, db_path: Path) -> None:
    first = store.append_inbound(inbound(1), sid(1), is_owner=True)
    again = store.append_inbound(inbound(1, text="a replay never rewrites"), sid(1), is_owner=True)
    assert again == first
    with store.transaction():
        assert store.append_inbound(inbound(1), sid(1), is_owner=True) == first
        second = store.append_inbound(inbound(2), sid(2), is_owner=True)
        assert store.append_inbound(inbound(2), sid(2), is_owner=True) == second
    store.close()
    with MemoryStore(db_path) as reopened:
        assert reopened.append_inbound(inbound(1), sid(1), is_owner=True) == first
        assert reopened.counts() == {"log": 2, "inbound": 2, "outbound": 0}
        assert reopened.recent(10) == [second, first]


def test_replaying_a_reply_adds_nothing(store: MemoryStore) -> None:
    store.append_inbound(inbound(1), sid(1), is_owner=True)
    assert store.recorded_reply(sid(1)) is None
    reply = reply_to(sid(1), text="hello back")
    out = store.append_reply(reply, sender="relaybot", privacy=Privacy.OWNER)
    assert (out.direction, out.stream_id, out.event_id, out.reply_id) == (
        "out",
        sid(1),
        reply.reply_id,
        reply.reply_id,
    )
    assert (out.sender, out.is_owner, out.kind, out.platform_ts) == (
        "relaybot",
        False,
        "reply",
        reply.created,
    )
    assert store.append_reply(reply, sender="relaybot", privacy=Privacy.OWNER) == out
    assert store.recorded_reply(sid(1)) == out
    assert store.counts() == {"log": 2, "inbound": 1, "outbound": 1}


def test_last_inserted_names_only_a_row_inserted_now(store: MemoryStore) -> None:
    # the worker skips its replay lookup for an inbound row inserted just now (memory never saw
    # the entry, so nothing answered it): a replay of the same entry must not look inserted,
    # nor an erased row's entry (erasure empties rows, it never deletes them)
    first = store.append_inbound(inbound(1), sid(1), is_owner=True)
    assert store.last_inserted is first
    again = store.append_inbound(inbound(1), sid(1), is_owner=True)
    assert again == first and store.last_inserted is None
    out = store.append_reply(reply_to(sid(1)), sender="relaybot", privacy=Privacy.OWNER)
    assert store.last_inserted is out
    store.append_reply(reply_to(sid(1)), sender="relaybot", privacy=Privacy.OWNER)
    assert store.last_inserted is None


def test_mark_reply_is_append_only_and_idempotent(store: MemoryStore) -> None:
    store.mark_reply("r1", "delivered", "to @a")
    first = store.reply_marks("r1")
    store.mark_reply("r1", "delivered", "again")
    store.mark_reply("r1", "expired")
    marks = store.reply_marks("r1")
    assert set(marks) == {"delivered", "expired"}
    assert marks["delivered"] == first["delivered"]
    with pytest.raises(ValueError, match="status"):
        store.mark_reply("r1", "lost")


def test_text_that_utf8_cannot_encode_is_stored_replaced(store: MemoryStore) -> None:
    reply = reply_to(sid(1), text="bad \ud800 surrogate")
    row = store.append_reply(reply, sender="relaybot", privacy=Privacy.OWNER)
    assert row.text == "bad \ufffd surrogate"
    assert store.recorded_reply(sid(1)) == row


# -- transactions ------------------------------------------------------------------------------


def test_transaction_commits_many_appends_at_once(store: MemoryStore, db_path: Path) -> None:
    with store.transaction():
        for i in range(5):
            store.append_inbound(inbound(i), sid(i), is_owner=True)
        assert len(store.recent(10)) == 5  # visible to the writer before commit
        with raw(db_path) as other:
            assert other.execute("SELECT count(*) FROM log").fetchone()[0] == 0
    with raw(db_path) as other:
        assert other.execute("SELECT count(*) FROM log").fetchone()[0] == 5


def test_rollback_leaves_log_and_cache_untouched(store: MemoryStore) -> None:
    kept = store.append_inbound(inbound(0), sid(0), is_owner=True)

    def failing_batch() -> None:
        with store.transaction():
            store.append_inbound(inbound(1), sid(1), is_owner=True)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_batch()
    assert store.recent(10) == [kept]
    assert store.counts()["log"] == 1
    again = store.append_inbound(inbound(1), sid(1), is_owner=True)  # a retry succeeds
    assert store.recent(10) == [again, kept]
    assert store.recent(10) == store.recent(10, before=(again.recorded_ts, again.id + 1))


def test_transactions_do_not_nest(store: MemoryStore) -> None:
    with store.transaction():
        nested = store.transaction()
        with pytest.raises(RuntimeError, match="nest"):
            nested.__enter__()


# -- recent(): the cache and the SQL agree ---------------------------------------------------


def test_recent_from_cache_equals_recent_from_sql(db_path: Path) -> None:
    with MemoryStore(db_path, cache_rows=16) as cached:
        fill(cached, 60)
        with MemoryStore(db_path, cache_rows=0) as uncached:
            reader = MemoryStore(db_path, readonly=True)
            assert cached._caches._rows is not None
            assert len(cached._caches._rows) == 16
            assert cached._caches._lo == order_key(cached._caches._rows[0])
            assert uncached._caches._rows is None
            assert reader._caches._rows is None
            newest = cached.recent(1)[0].id
            ids = (newest, newest - 10, 30, 3, 1)
            keys = [None, (float("inf"), 0), *(key_of(uncached, i) for i in ids)]
            for limit in (1, 5, 16, 17, 40, 200):
                for conversation in (None, "a", "b", "nope"):
                    for before in keys:
                        args = {"conversation": conversation, "before": before}
                        expected = uncached.recent(limit, **args)  # type: ignore[arg-type]
                        assert cached.recent(limit, **args) == expected  # type: ignore[arg-type]
                        assert reader.recent(limit, **args) == expected  # type: ignore[arg-type]
            every = uncached.recent(1000)
            assert [r.id for r in every] == sorted((r.id for r in every), reverse=True)
            assert len(every) == 80
            reader.close()
    with MemoryStore(db_path, cache_rows=16) as reopened:  # the cache is filled at open
        assert reopened.recent(30, conversation="b") == [r for r in every if r.conversation == "b"]
        assert reopened.recent(30) == every[:30]


def test_small_log_is_served_entirely_from_cache(store: MemoryStore) -> None:
    fill(store, 10)
    assert store._caches._lo is None
    store._caches._select = None  # type: ignore[assignment,method-assign]  # any SQL read would fail
    assert len(store.recent(100)) == 14
    assert all(r.conversation == "b" for r in store.recent(100, conversation="b"))


def test_recent_queries_use_indexes_never_a_sort(store: MemoryStore) -> None:
    """Every read of the log's order (recorded_ts, id) walks an index: the log's, the
    conversation's or the sender's (issue 13: by the messages' time, not by id, and as fast)."""
    for (conversation, entity, below, above), sql in _SQL.items():
        params = (["a"] if conversation or entity else []) + [1.0, 1.0, 5] * (below + above)
        plan = " ".join(
            str(r[-1]) for r in store._conn.execute(f"EXPLAIN QUERY PLAN {sql}", (*params, 10))
        )
        assert "TEMP B-TREE" not in plan, (sql, plan)
        if conversation:
            assert "log_conversation_time" in plan, plan
        elif entity:
            assert "log_entity_time" in plan, plan
        else:
            assert "log_time" in plan, plan


def test_counts_and_last_row(store: MemoryStore) -> None:
    assert store.counts() == {"log": 0, "inbound": 0, "outbound": 0}
    assert store.last_row() is None
    fill(store, 6)
    assert store.counts() == {"log": 8, "inbound": 6, "outbound": 2}
    last = store.last_row()
    assert last is not None
    assert last.stream_id == sid(5)


# -- read-only -----------------------------------------------------------------------------------


def test_readonly_store_reads_but_cannot_write(store: MemoryStore, db_path: Path) -> None:
    row = store.append_inbound(inbound(1), sid(1), is_owner=True)
    with MemoryStore(db_path, readonly=True) as reader:
        assert reader.recent(5) == [row]
        later = store.append_inbound(inbound(2), sid(2), is_owner=True)
        assert reader.recent(5) == [later, row]  # no cache: sees the writer's commits
        with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only|query_only"):
            reader.append_inbound(inbound(3), sid(3), is_owner=True)
        with pytest.raises(sqlite3.OperationalError):
            reader.mark_reply("r", "delivered")
    assert store.counts()["log"] == 2


def test_readonly_store_needs_an_existing_database(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="no memory database"):
        MemoryStore(tmp_path / "missing.sqlite3", readonly=True)
    sqlite3.connect(tmp_path / "empty.sqlite3").close()
    with pytest.raises(SchemaError, match="no memory schema"):
        MemoryStore(tmp_path / "empty.sqlite3", readonly=True)


# -- corrupt rows --------------------------------------------------------------------------------


def _insert_raw(conn: sqlite3.Connection, stream_id: str, *, extra: str, is_owner: object) -> None:
    conn.execute(
        "INSERT INTO log (direction, stream_id, kind, channel, session, conversation, sender, "
        "is_owner, privacy, text, event_id, recorded_ts, extra) VALUES "
        "('in', ?, 'message', 'cli', 's', 'a', 'x', ?, 'owner', 't', 'e', 4e9, ?)",  # the newest
        (stream_id, is_owner, extra),
    )


def test_corrupt_rows_are_skipped_and_counted(db_path: Path) -> None:
    with MemoryStore(db_path) as s:
        fill(s, 3, conversations=("a",))
    with raw(db_path) as conn:
        _insert_raw(conn, "bad-json", extra="{not json", is_owner=0)
        _insert_raw(conn, "bad-type", extra="{}", is_owner="yes")
        _insert_raw(conn, "not-object", extra="[1, 2]", is_owner=1)
    with MemoryStore(db_path, cache_rows=0) as s:
        rows = s.recent(100)
        assert s.corrupt_rows == 3
        assert {r.stream_id for r in rows} == {sid(0), sid(1), sid(2)}
        assert len(s.recent(100, conversation="a")) == 4
        assert s.corrupt_rows == 3  # counted once per row, however often it is read
    with MemoryStore(db_path, cache_rows=4) as s:  # the cache fill skips them too
        assert s.corrupt_rows == 3
        assert len(s.recent(4)) == 4  # reads on past the corrupt rows into SQL
        assert s.recent(4) == MemoryStore(db_path, readonly=True).recent(4)


def test_corrupt_rows_do_not_shorten_a_page(db_path: Path) -> None:
    with MemoryStore(db_path) as s:
        s.append_inbound(inbound(0), sid(0), is_owner=True)
        s.append_inbound(inbound(1), sid(1), is_owner=True)
    with raw(db_path) as conn:
        for i in range(5):
            _insert_raw(conn, f"bad-{i}", extra="nope", is_owner=0)
    with MemoryStore(db_path, cache_rows=0) as s:
        assert [r.stream_id for r in s.recent(2)] == [sid(1), sid(0)]
        assert s.corrupt_rows == 5


def test_a_replay_onto_a_corrupt_row_is_an_error_not_a_duplicate(db_path: Path) -> None:
    MemoryStore(db_path).close()
    with raw(db_path) as conn:
        _insert_raw(conn, sid(1), extra="nope", is_owner=1)
    with MemoryStore(db_path) as s:
        with pytest.raises(sqlite3.DatabaseError, match="corrupt"):
            s.append_inbound(inbound(1), sid(1), is_owner=True)
        assert s.counts()["log"] == 1


def test_logrow_extra_is_raw_json(store: MemoryStore) -> None:
    row = store.append_inbound(inbound(1, extra={"k": "ü"}), sid(1), is_owner=True)
    assert json.loads(row.extra) == {"k": "ü"}
    assert isinstance(row, LogRow)
    assert hash(row) == hash(store.recent(1)[0])


def test_close_is_idempotent_and_rolls_back(db_path: Path) -> None:
    s = MemoryStore(db_path)
    ctx = s.transaction()
    ctx.__enter__()
    s.append_inbound(inbound(1), sid(1), is_owner=True)
    s.close()
    s.close()
    with MemoryStore(db_path) as again:
        assert again.counts()["log"] == 0


def test_throughput_is_in_the_right_order(store: MemoryStore) -> None:
    """Not a benchmark: a guard against an accidental O(n) per append (the aim is 10k msg/s)."""
    msgs = [inbound(i) for i in range(3000)]
    replies = [reply_to(sid(i)) for i in range(3000)]
    started = time.perf_counter()
    for start in range(0, 3000, 100):
        with store.transaction():
            for i in range(start, start + 100):
                store.append_inbound(msgs[i], sid(i), is_owner=True)
                store.recorded_reply(sid(i))
                store.append_reply(replies[i], sender="relaybot", privacy=Privacy.OWNER)
                store.recent(50)
    assert time.perf_counter() - started < 3.0


def test_conversation_cache_always_agrees_with_sql(db_path: Path) -> None:
    """Random appends over many conversations, in committed and rolled-back batches, with a small
    cache and LRU: every conversation query equals what a fresh read-only (SQL) store returns."""
    import random

    rng = random.Random(7)
    convs = [f"room-{k}" for k in range(12)]
    writer = MemoryStore(db_path, cache_rows=16, conversation_rows=8, conversations=4)
    n = 0
    try:
        for _batch in range(60):
            rollback = rng.random() < 0.2
            try:
                with writer.transaction():
                    for _ in range(rng.randint(1, 12)):
                        conv = rng.choice(convs)
                        writer.append_inbound(inbound(n, conversation=conv), sid(n), is_owner=False)
                        n += 1
                        probe = rng.choice(convs)  # a read in the middle of the transaction
                        writer.recent(rng.randint(1, 20), conversation=probe)
                    if rollback:
                        raise RuntimeError("roll back this batch")
            except RuntimeError:
                pass
            reader = MemoryStore(db_path, readonly=True)
            try:
                for conv in convs:
                    for limit in (1, 5, 30):
                        before = rng.choice([None, key_of(reader, rng.randint(1, max(2, n)))])
                        got = writer.recent(limit, conversation=conv, before=before)
                        want = reader.recent(limit, conversation=conv, before=before)
                        assert [r.id for r in got] == [r.id for r in want], (conv, limit, before)
            finally:
                reader.close()
    finally:
        writer.close()


def test_entity_cache_always_agrees_with_sql(db_path: Path) -> None:
    """The per-sender cache (direct scopes see what that person said elsewhere) equals SQL."""
    import random

    rng = random.Random(11)
    people = [f"e-{k}" for k in range(9)]
    writer = MemoryStore(db_path, cache_rows=16, conversation_rows=8, conversations=4)
    n = 0
    try:
        for _batch in range(50):
            try:
                with writer.transaction():
                    for _ in range(rng.randint(1, 10)):
                        who = rng.choice(people)
                        msg = inbound(n, conversation=f"room-{rng.randint(0, 5)}", sender=who,
                                      privacy=Privacy.GROUP)  # fmt: skip
                        writer.append_inbound(msg, sid(n), is_owner=False, entity=who)
                        if rng.random() < 0.3:
                            writer.append_reply(reply_to(sid(n)), sender="relaybot",
                                                privacy=Privacy.GROUP)  # fmt: skip
                        n += 1
                        writer.recent_of_entity(rng.choice(people), rng.randint(1, 20))
                    if rng.random() < 0.2:
                        raise RuntimeError("roll back this batch")
            except RuntimeError:
                pass
            reader = MemoryStore(db_path, readonly=True)
            try:
                for who in people:
                    for limit in (1, 5, 30):
                        before = rng.choice([None, key_of(reader, rng.randint(1, max(2, 2 * n)))])
                        got = writer.recent_of_entity(who, limit, before=before)
                        want = reader.recent_of_entity(who, limit, before=before)
                        assert [r.id for r in got] == [r.id for r in want], (who, limit, before)
            finally:
                reader.close()
    finally:
        writer.close()
