"""Context and search follow the messages' time, not the order rows were inserted (issue 13).

What broke: imported history (``memory import``, older messages inserted later) was placed after
newer messages in the context, and a large import pushed the recent conversation out of the
window altogether, because history was read by row id.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import Privacy
from memory import commands
from memory.commands import CommandContext
from memory.context import build_context
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.import_file import parse_file
from memory.privacy import Scope, visible_history
from memory.search import SearchQuery, search
from memory.store import MemoryStore
from memory.window import HistoryWindows
from relaybot.import_parts import command_args
from tests.support.turns import record_turn

OWNER = Scope(conversation="cli:local", privacy=Privacy.OWNER)
RESOLVER = OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix")])
_n = itertools.count(1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3", cache_rows=16, conversation_rows=8) as store:
        yield store


def say(store: MemoryStore, text: str, conversation: str = "cli:local", sender: str = "me") -> None:
    privacy = Privacy.OWNER if conversation.startswith("cli:") else Privacy.DIRECT
    with store.transaction():
        record_turn(
            store,
            Identity(RESOLVER, "Ada"),
            next(_n),
            conversation=conversation,
            sender=sender,
            text=text,
            privacy=privacy,
            reply=f"re: {text}",
        )


def squid(content: str, day: int, sender: str = "me", channel: str = "matrix") -> str:
    return json.dumps(
        {
            "role": "user",
            "content": content,
            "timestamp": f"2025-03-{day:02d}T09:00:00Z",
            "channel": channel,
            "sender_id": sender,
            "conversation": "matrix:old-dm" if sender == "@me:m.org" else None,
        }
    )


def import_lines(store: MemoryStore, lines: list[str]) -> dict[str, Any]:
    parsed = parse_file(iter(lines), resolver=RESOLVER)
    assert not parsed.rejected, parsed.rejected
    added = 0
    for args in command_args(parsed.items, fmt=parsed.format):
        result = commands.apply(CommandContext(f"{next(_n)}-5", store), "memory.import", args)
        assert result["ok"] and not result["rejected"], result
        added += result["added"].get("log", 0)
    return {"added": added}


def history_texts(store: MemoryStore, scope: Scope = OWNER, limit: int = 400) -> list[str]:
    """The scope's history, oldest first, as the context shows it."""
    return [r.text for r in visible_history(store, scope, limit=limit)][::-1]


def test_imported_older_history_comes_before_newer_messages(store: MemoryStore) -> None:
    say(store, "today's question")
    import_lines(store, [squid(f"old note {d}", d, "@me:m.org") for d in (1, 2, 3)])
    assert history_texts(store) == [
        "old note 1",
        "old note 2",
        "old note 3",
        "today's question",
        "re: today's question",
    ]
    rows = list(visible_history(store, OWNER, limit=400))
    messages = build_context(
        system_prompt="You are relaybot.",
        history=rows,
        current=rows[0],
        budget_tokens=5_000,
        assistant_name="relaybot",
    )
    system = messages[0]["content"]
    assert system.index("old note 3") < system.index("today's question")
    assert system.index("old note 1") < system.index("old note 2") < system.index("old note 3")


def test_a_large_import_does_not_push_the_recent_talk_out_of_the_window(
    store: MemoryStore,
) -> None:
    windows = HistoryWindows(store, limit=20)
    say(store, "yesterday")
    say(store, "today")
    assert [r.text for r in windows.rows(OWNER)][:2] == ["re: today", "today"]
    import_lines(store, [squid(f"archive {d}", d % 28 + 1, "@me:m.org") for d in range(60)])
    rows = windows.rows(OWNER)
    assert list(rows) == list(visible_history(store, OWNER, limit=20))
    assert [r.text for r in rows][:4] == ["re: today", "today", "re: yesterday", "yesterday"]
    # and the next live message goes on top, through the window's fast path
    say(store, "tomorrow")
    assert [r.text for r in windows.rows(OWNER)][:2] == ["re: tomorrow", "tomorrow"]
    assert list(windows.rows(OWNER)) == list(visible_history(store, OWNER, limit=20))


def test_a_direct_scope_merges_its_streams_in_time_order(store: MemoryStore) -> None:
    say(store, "bob, live", conversation="matrix:dm-bob", sender="@bob:m.org")
    bob = store.recent(1, conversation="matrix:dm-bob")[0]
    entity = store.conn.execute(
        "SELECT entity FROM log WHERE sender = '@bob:m.org' LIMIT 1"
    ).fetchone()[0]
    # what Bob said long ago, elsewhere, imported now
    import_lines(store, [squid("bob, long ago", 5, "@bob:m.org")])
    scope = Scope(conversation=bob.conversation, privacy=Privacy.DIRECT, entity=entity)
    texts = history_texts(store, scope)
    assert texts.index("bob, long ago") < texts.index("bob, live")


def test_a_row_recorded_below_the_top_drops_the_windows(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    windows = HistoryWindows(store, limit=10)
    say(store, "first")
    assert windows.rows(OWNER)[0].text == "re: first"
    generation = store.generation
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)  # the clock stepped back an hour
    say(store, "from the past")
    monkeypatch.setattr(time, "time", real)
    assert store.generation > generation
    assert list(windows.rows(OWNER)) == list(visible_history(store, OWNER, limit=10))
    assert history_texts(store) == ["from the past", "re: from the past", "first", "re: first"]


def test_an_imported_message_from_the_future_is_recorded_at_the_import(store: MemoryStore) -> None:
    line = json.dumps(
        {
            "role": "user",
            "content": "from 2099",
            "timestamp": "2099-01-01T00:00:00Z",
            "channel": "matrix",
            "sender_id": "@me:m.org",
        }
    )
    import_lines(store, [line])
    say(store, "now")
    assert history_texts(store)[0] == "from 2099"  # not the newest forever


def test_search_in_time_order_puts_imported_messages_by_their_time(store: MemoryStore) -> None:
    say(store, "the kettle is broken again")
    import_lines(store, [squid(f"kettle story {d}", d, "@me:m.org") for d in range(1, 20)])
    result = search(store, OWNER, SearchQuery(text="kettle", order="time", limit=4))
    assert [h.row.text for h in result.hits] == [
        "re: the kettle is broken again",
        "the kettle is broken again",
        "kettle story 19",
        "kettle story 18",
    ]
    # and the message before an imported one is the one before it in time
    (story,) = [h for h in result.hits if h.row.text == "kettle story 19"]
    assert story.before is not None and story.before.text == "kettle story 18"


def test_search_in_time_order_equals_sorting_every_match(store: MemoryStore) -> None:
    """Whichever way it reads (the newest matches by id, or the wider window after an import),
    time order gives the newest matches in the log's order, as sorting every match would."""
    rng = random.Random(13)
    for round_ in range(6):
        for _ in range(rng.randint(5, 30)):
            say(store, f"tea {rng.choice(['green', 'black'])} {next(_n)}")
        if round_ % 2:
            days = rng.sample(range(1, 28), rng.randint(3, 20))
            import_lines(
                store, [squid(f"tea archive {d} {next(_n)}", d, "@me:m.org") for d in days]
            )
        for limit in (1, 3, 10):
            result = search(store, OWNER, SearchQuery(text="tea", order="time", limit=limit))
            every = [
                r for r in visible_history(store, OWNER, limit=100_000) if "tea" in r.text.split()
            ]  # newest first in the log's order: the newest `limit` are the answer
            want = sorted(every[:limit], key=lambda r: (r.ts, r.id), reverse=True)
            assert [h.row.id for h in result.hits] == [r.id for r in want], (round_, limit)
