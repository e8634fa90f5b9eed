"""Full-text indexing by the writer (migration 6): a batch's rows go into ``log_fts`` in one
statement, and the index stays exactly the log's text through commits, rollbacks, searches inside
the batch, failed commands (savepoints) and erasures of rows that are not indexed yet.

``integrity-check`` with rank 1 compares the FTS5 index with the content table row by row, so it
fails on a row missing from the index, indexed twice, or indexed with other text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from contract.messages import InboundMessage, Privacy
from memory import commands, erasure
from memory.commands import CommandContext
from memory.commands import apply_atomic as _apply_command
from memory.erasure import erase
from memory.privacy import Scope
from memory.schema import LATEST_VERSION
from memory.search import SearchQuery, search
from memory.store import MemoryStore

OWNER = Scope(conversation="cli:a", privacy=Privacy.OWNER)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def say(store: MemoryStore, n: int, text: str) -> None:
    msg = InboundMessage(
        channel="cli",
        session="cli:a",
        conversation="cli:a",
        sender="owner",
        privacy=Privacy.OWNER,
        text=text,
        event_id=f"e{n}",
        ts=1_790_000_000.0 + n,
    )
    store.append_inbound(msg, f"{n}-0", is_owner=True)


def indexed(store: MemoryStore, word: str) -> list[int]:
    sql = "SELECT rowid FROM log_fts WHERE log_fts MATCH ? ORDER BY rowid"
    return [r[0] for r in store.conn.execute(sql, (word,))]


def check_index(store: MemoryStore) -> None:
    store.conn.execute("INSERT INTO log_fts (log_fts, rank) VALUES ('integrity-check', 1)")


def found(store: MemoryStore, word: str) -> list[str]:
    return [h.row.text for h in search(store, OWNER, SearchQuery(text=word)).hits]


def test_the_insert_trigger_is_gone_and_the_update_delete_ones_stay(store: MemoryStore) -> None:
    triggers = {
        r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    }
    assert "log_fts_insert" not in triggers
    assert {"log_fts_update", "log_fts_delete"} <= triggers
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION >= 7
    assert mark(store) == 0


def mark(store: MemoryStore) -> int:
    return int(store.conn.execute("SELECT indexed_to FROM fts_state").fetchone()[0])


def raw_insert(store: MemoryStore, n: int, text: str) -> None:
    """A row written without the index code: by a worker of an older release still running
    during an upgrade, or by ours killed between the row and its indexing."""
    store.conn.execute(
        "INSERT INTO log (direction, stream_id, kind, channel, session, conversation, sender, "
        "entity, is_owner, privacy, text, event_id, recorded_ts) VALUES "
        "('in', ?, 'message', 'cli', 'cli:a', 'cli:a', 'owner', 'owner', 1, 'owner', ?, 'e', 1.0)",
        (f"{n}-0", text),
    )


def test_rows_written_without_the_index_code_are_indexed_by_the_next_sync(
    store: MemoryStore,
) -> None:
    say(store, 1, "first lemur")
    raw_insert(store, 2, "second lemur, from an older worker")
    raw_insert(store, 3, "third lemur, its indexing never ran")
    assert indexed(store, "lemur") == [1]
    assert found(store, "lemur")  # a search indexes what is missing first
    assert indexed(store, "lemur") == [1, 2, 3] and mark(store) == 3
    store.sync_index()  # nothing left: indexing again adds nothing
    with store.transaction():
        say(store, 4, "fourth lemur")
    assert indexed(store, "lemur") == [1, 2, 3, 4] and mark(store) == 4
    check_index(store)


def test_erasing_a_row_not_indexed_yet_keeps_the_index_whole(store: MemoryStore) -> None:
    say(store, 1, "keep this gecko")
    raw_insert(store, 2, "erase this zanzibarquux gecko")
    # an older worker's erasure does not sync first: the trigger must not touch the index
    with erasure.granted(store.conn, "owner", "test", 1.0):
        store.conn.execute("UPDATE log SET text = '' WHERE id = 2")
    store.sync_index()  # (before it, the index lacks row 2: integrity-check would say so)
    assert indexed(store, "zanzibarquux") == [] and indexed(store, "gecko") == [1]
    check_index(store)


def test_a_read_only_store_does_not_index(store: MemoryStore) -> None:
    raw_insert(store, 1, "a wombat")
    with MemoryStore(store.path, readonly=True) as ro:
        ro.sync_index()
    assert indexed(store, "wombat") == [] and mark(store) == 0


def test_a_row_appended_outside_a_transaction_is_indexed_at_once(store: MemoryStore) -> None:
    say(store, 1, "alpaca grazing")
    assert indexed(store, "alpaca") == [1]
    check_index(store)


def test_a_batch_is_indexed_at_commit_and_searchable_inside_it(store: MemoryStore) -> None:
    say(store, 1, "before the batch: walrus")
    with store.transaction():
        for n in range(2, 12):
            say(store, n, f"walrus number {n}")
        assert indexed(store, "walrus") == [1]  # not yet: one statement at commit
        # ... but a search inside the batch sees the batch (it indexes first)
        assert len(found(store, "walrus")) == 10  # the search's default limit
        say(store, 12, "walrus after the search")
    assert indexed(store, "walrus") == list(range(1, 13))
    check_index(store)


def test_a_rolled_back_batch_leaves_the_index_as_it_was(store: MemoryStore) -> None:
    say(store, 1, "kept narwhal")

    def batch_that_fails() -> None:
        with store.transaction():
            say(store, 2, "lost narwhal")
            found(store, "narwhal")  # indexed inside the transaction, then rolled back with it
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        batch_that_fails()
    assert indexed(store, "narwhal") == [1]
    check_index(store)
    say(store, 3, "next narwhal")  # the same ids again: indexed once
    assert indexed(store, "narwhal") == [1, 2]
    check_index(store)


def test_a_failed_command_keeps_the_earlier_rows_of_the_batch_indexed(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails_after_a_search(*_args: object) -> dict[str, object]:
        found(store, "ocelot")  # indexes inside the command's savepoint...
        raise sqlite3.OperationalError("disk I/O error")  # ...which is then rolled back

    monkeypatch.setattr(commands, "apply", fails_after_a_search)
    with store.transaction():
        say(store, 1, "ocelot one")
        with pytest.raises(sqlite3.OperationalError):
            _apply_command(store, cast(CommandContext, None), "op", {})
        say(store, 2, "ocelot two")
    assert indexed(store, "ocelot") == [1, 2]
    check_index(store)


def test_erasing_a_row_of_the_open_batch_keeps_the_index_whole(store: MemoryStore) -> None:
    with store.transaction():
        say(store, 1, "keep this quokka")
        say(store, 2, "erase this zanzibarquux quokka")
        erase(
            store,
            kind="id",
            target="2",
            reason="test",
            requested_by="owner",
            stream_id="9-0",
        )
        say(store, 3, "a later quokka")
    assert indexed(store, "zanzibarquux") == []
    assert indexed(store, "quokka") == [1, 3]
    check_index(store)
