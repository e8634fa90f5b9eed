"""The privacy rule without a person (no entity, no links): it fails closed, only the owner's
scope sees across conversations. The rule with persons is in test_privacy_rule.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage, Privacy
from memory.privacy import PAGE_ROWS, Scope, visible_history
from memory.rows import LogRow
from memory.store import MemoryStore

CONVERSATIONS = {
    "cli:local": Privacy.OWNER,
    "matrix:dm-alice": Privacy.DIRECT,
    "matrix:dm-bob": Privacy.DIRECT,
    "matrix:team": Privacy.GROUP,
}


def fill(store: MemoryStore, n: int) -> None:
    names = list(CONVERSATIONS)
    with store.transaction():
        for i in range(n):
            conversation = names[i % len(names)]
            msg = InboundMessage(
                channel="cli" if conversation == "cli:local" else "matrix",
                session="s",
                conversation=conversation,
                sender="me" if conversation == "cli:local" else f"@u{i % 3}:m.org",
                privacy=CONVERSATIONS[conversation],
                text=f"secret {i} in {conversation}",
                ts=1_795_000_000.0 + i,
                event_id=f"e{i}",
            )
            store.append_inbound(msg, f"{i}-0", is_owner=conversation == "cli:local")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3", cache_rows=50) as s:
        fill(s, 400)
        yield s


def test_owner_scope_sees_everything_newest_first(store: MemoryStore) -> None:
    rows = list(visible_history(store, Scope("cli:local", Privacy.OWNER, "owner"), limit=1000))
    assert rows == store.recent(1000)
    assert len(rows) == 400
    assert {r.conversation for r in rows} == set(CONVERSATIONS)


@pytest.mark.parametrize(
    ("conversation", "privacy"),
    [("matrix:dm-alice", Privacy.DIRECT), ("matrix:team", Privacy.GROUP)],
)
def test_other_scopes_see_only_their_own_conversation(
    store: MemoryStore, conversation: str, privacy: Privacy
) -> None:
    rows = list(visible_history(store, Scope(conversation, privacy, None), limit=1000))
    assert len(rows) == 100
    assert {r.conversation for r in rows} == {conversation}
    assert rows == store.recent(1000, conversation=conversation)


def test_a_direct_scope_never_sees_another_conversation(store: MemoryStore) -> None:
    rows = visible_history(store, Scope("matrix:dm-bob", Privacy.DIRECT, None), limit=1000)
    texts = " ".join(r.text for r in rows)
    assert "matrix:dm-bob" in texts
    for other in ("cli:local", "matrix:dm-alice", "matrix:team"):
        assert other not in texts


@pytest.mark.parametrize("privacy", ["public", "", "OWNER", None])
def test_an_unknown_privacy_sees_nothing(store: MemoryStore, privacy: Any) -> None:
    assert list(visible_history(store, Scope("matrix:dm-alice", privacy, None), limit=100)) == []


def test_a_scope_without_a_conversation_sees_nothing(store: MemoryStore) -> None:
    assert list(visible_history(store, Scope("", Privacy.DIRECT, None), limit=100)) == []


def test_limit_and_before_id(store: MemoryStore) -> None:
    owner = Scope("cli:local", Privacy.OWNER, None)
    assert list(visible_history(store, owner, limit=0)) == []
    assert list(visible_history(store, owner, limit=300)) == store.recent(300)
    middle = store.recent(200)[-1]
    key = (middle.recorded_ts, middle.id)
    below = list(visible_history(store, owner, limit=1000, before=key))
    assert below == store.recent(1000, before=key)
    assert all((r.recorded_ts, r.id) < key for r in below)


class CountingStore:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.calls: list[int] = []

    def recent(self, limit: int, **kwargs: Any) -> list[LogRow]:
        self.calls.append(limit)
        return self.store.recent(limit, **kwargs)


def test_history_is_read_lazily_in_pages(store: MemoryStore) -> None:
    spy = CountingStore(store)
    rows = visible_history(spy, Scope("x", Privacy.OWNER, None), limit=1000)  # type: ignore[arg-type]
    assert spy.calls == []  # nothing read until asked
    first = list(itertools.islice(rows, 10))
    assert spy.calls == [PAGE_ROWS]
    assert first == store.recent(10)
    rest = list(rows)
    assert len(first) + len(rest) == 400
    assert spy.calls == [PAGE_ROWS, PAGE_ROWS, PAGE_ROWS, PAGE_ROWS]
