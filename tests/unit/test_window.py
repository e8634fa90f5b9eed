"""memory.window: the per-scope history windows give exactly what visible_history gives.

A seeded random run mixes everything that changes what a scope sees: messages in every kind of
conversation, batches read half-way (rows of the open transaction), rolled-back batches (their ids
come back), identity links and unlinks, erasures, a cache invalidation, imports of older history
and a clock that steps back (rows below the top of the log's time order). After
every step each scope's window is compared with a fresh ``visible_history`` read, with a limit
smaller than the history (the window's tail is cut) and one larger.
"""

from __future__ import annotations

import contextlib
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
from memory.commands import apply_atomic as _apply_command
from memory.context import build_context
from memory.erasure import erase
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.import_file import parse_file
from memory.lines import HistoryLines
from memory.privacy import Scope, visible_history
from memory.rows import LogRow
from memory.store import MemoryStore
from memory.window import HistoryWindows
from relaybot.import_parts import command_args
from tests.support.turns import record_turn

# (conversation, sender, privacy)
SPEAKERS = (
    ("cli:local", "me", Privacy.OWNER),
    ("matrix:dm-bob", "@bob:m.org", Privacy.DIRECT),
    ("email:thread-bob", "bob@example.org", Privacy.DIRECT),
    ("matrix:dm-carol", "@carol:m.org", Privacy.DIRECT),
    ("matrix:team", "@alice:m.org", Privacy.GROUP),
    ("matrix:team", "@bob:m.org", Privacy.GROUP),
    ("matrix:team", "@me:m.org", Privacy.GROUP),
)
_n = itertools.count(1)


class Rolled(Exception):
    """Raised inside a batch to roll it back."""


class World:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.identity = Identity(
            OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix")]), "Ada"
        )
        self.entities: dict[str, str] = {}

    def say(self, conversation: str, sender: str, privacy: Privacy) -> None:
        """One message and its reply, in the open transaction."""
        n = next(_n)
        row = record_turn(
            self.store,
            self.identity,
            n,
            conversation=conversation,
            sender=sender,
            text=f"message {n} from {sender}",
            privacy=privacy,
            reply=f"reply {n}",
        )
        if row.entity is not None:
            self.entities[sender] = row.entity

    def command(self, op: str, **args: Any) -> dict[str, Any]:
        context = CommandContext(stream_id=f"{next(_n)}-9", store=self.store)
        with self.store.transaction():
            return commands.apply(context, op, args)

    def scopes(self) -> list[Scope]:
        out = [
            Scope(conversation="cli:local", privacy=Privacy.OWNER),
            Scope(conversation="matrix:team", privacy=Privacy.GROUP),
            Scope(conversation="matrix:nobody", privacy=Privacy.GROUP),
            Scope(conversation="", privacy=Privacy.GROUP),  # sees nothing (fail closed)
        ]
        for conversation, sender, privacy in SPEAKERS:
            if privacy is Privacy.DIRECT and sender in self.entities:
                entity = self.entities[sender]
                out.append(Scope(conversation=conversation, privacy=privacy, entity=entity))
                out.append(Scope(conversation=conversation, privacy=privacy))  # no person known
        return out


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    # small caches, so the windows also meet the SQL paths below them
    with MemoryStore(tmp_path / "memory.sqlite3", cache_rows=16, conversation_rows=8) as store:
        yield World(store)


def context(rows: list[LogRow], ready: HistoryLines | None, budget: int) -> list[dict[str, str]]:
    """The context of a turn answering the newest row, with the window's lines or row by row."""
    return build_context(
        system_prompt="You are relaybot.",
        history=rows,
        current=rows[0],
        budget_tokens=budget,
        assistant_name="relaybot",
        ready=ready,
    )


def check(world: World, windows: list[HistoryWindows]) -> int:
    compared = 0
    for scope in world.scopes():
        for w in windows:
            expected = list(visible_history(world.store, scope, limit=w.limit))
            assert list(w.rows(scope)) == expected, (scope, w.limit)
            rows, ready = w.history(scope, "relaybot")
            assert list(rows) == expected
            for budget in (60, 5_000) if expected else ():
                assert context(expected, ready, budget) == context(expected, None, budget)
            compared += len(expected)
    return compared


def import_older(world: World, rnd: random.Random) -> None:
    """A few messages of a squidbot history, said days ago, imported now (memory import)."""
    lines = []
    for _ in range(rnd.randint(1, 6)):
        conversation, sender, _privacy = rnd.choice(SPEAKERS)
        lines.append(
            json.dumps(
                {
                    "role": rnd.choice(["user", "user", "assistant"]),
                    "content": f"imported {next(_n)}",
                    "timestamp": f"2025-0{rnd.randint(1, 9)}-1{rnd.randint(0, 9)}T10:00:00Z",
                    "channel": conversation.split(":")[0],
                    "sender_id": sender,
                    "conversation": conversation,
                }
            )
        )
    parsed = parse_file(iter(lines), resolver=world.identity.resolver)
    for args in command_args(parsed.items, fmt=parsed.format):
        context = CommandContext(stream_id=f"{next(_n)}-8", store=world.store)
        assert commands.apply(context, "memory.import", args)["ok"]


@contextlib.contextmanager
def clock_back(seconds: float) -> Iterator[None]:
    """time.time() runs ``seconds`` behind while inside."""
    real = time.time
    time.time = lambda: real() - seconds
    try:
        yield
    finally:
        time.time = real


def rolled_back_batch(world: World, windows: list[HistoryWindows], rnd: random.Random) -> None:
    with world.store.transaction():
        world.say(*rnd.choice(SPEAKERS))
        check(world, windows)
        raise Rolled


def test_windows_match_visible_history_through_every_kind_of_change(world: World) -> None:
    rnd = random.Random(20261122)
    store = world.store
    windows = [HistoryWindows(store, limit=5), HistoryWindows(store, limit=400)]
    seen = {"steps": 0, "rows": 0, "rollbacks": 0, "links": 0, "erasures": 0, "imports": 0}
    for step in range(260):
        if step % 20 == 19:  # older history imported: rows below the top of the log's order
            import_older(world, rnd)
            seen["imports"] += 1
            seen["rows"] += check(world, windows)
        if step % 37 == 36:  # the clock stepped back: a live row below the top
            with store.transaction(), clock_back(rnd.uniform(1, 5_000)):
                world.say(*rnd.choice(SPEAKERS))
            seen["rows"] += check(world, windows)
        roll = rnd.random()
        if roll < 0.55:
            with store.transaction():
                world.say(*rnd.choice(SPEAKERS))
        elif roll < 0.75:  # a batch, read half-way through
            with store.transaction():
                for _ in range(rnd.randint(1, 4)):
                    world.say(*rnd.choice(SPEAKERS))
                seen["rows"] += check(world, windows)
                world.say(*rnd.choice(SPEAKERS))
        elif roll < 0.85:  # a batch that rolls back after being read
            with pytest.raises(Rolled):
                rolled_back_batch(world, windows, rnd)
            seen["rollbacks"] += 1
        elif roll < 0.92:
            op = rnd.choice(["entities.link", "entities.unlink"])
            world.command(op, a="matrix:@bob:m.org", b="email:bob@example.org")
            seen["links"] += 1
        elif roll < 0.97 and step > 10:
            target = str(rnd.randint(1, store.last_row().id))  # type: ignore[union-attr]
            erase(
                store,
                kind="id",
                target=target,
                reason="test",
                requested_by="owner",
                stream_id=f"{next(_n)}-7",
            )
            seen["erasures"] += 1
        else:
            store.invalidate()  # as an import does
        seen["rows"] += check(world, windows)
        seen["steps"] += 1
    assert seen["rollbacks"] > 5 and seen["links"] > 5 and seen["erasures"] > 3
    assert seen["imports"] > 10
    assert seen["rows"] > 10_000  # the comparisons saw real histories, not empty ones


def test_an_erased_text_leaves_the_window(world: World) -> None:
    windows = HistoryWindows(world.store, limit=50)
    with world.store.transaction():
        world.say("matrix:dm-bob", "@bob:m.org", Privacy.DIRECT)
    scope = Scope(
        conversation="matrix:dm-bob", privacy=Privacy.DIRECT, entity=world.entities["@bob:m.org"]
    )
    first = windows.rows(scope)[-1]
    assert first.text.startswith("message")
    erase(
        world.store,
        kind="id",
        target=str(first.id),
        reason="asked",
        requested_by="owner",
        stream_id="99999-0",
    )
    assert all(not r.text.startswith("message") for r in windows.rows(scope))


def test_a_window_needs_a_positive_limit(world: World) -> None:
    with pytest.raises(ValueError, match="positive"):
        HistoryWindows(world.store, limit=0)


def test_an_import_inside_a_batch_reaches_the_windows(tmp_path: Path) -> None:
    """An owner's import applied in the worker's batch puts rows among the batch's own (not in
    the caches): the windows read inside and after that batch still show them."""
    with MemoryStore(tmp_path / "memory.sqlite3") as store:  # the worker's cache sizes
        imported_in_a_batch(World(store), tmp_path)


def imported_in_a_batch(world: World, tmp_path: Path) -> None:
    store = world.store
    scope = Scope(conversation="matrix:team", privacy=Privacy.GROUP)
    windows = HistoryWindows(store, limit=400)
    with store.transaction():
        world.say("matrix:team", "@alice:m.org", Privacy.GROUP)
    windows.rows(scope)
    item = {
        "record": {
            "type": "log", "direction": "in", "stream_id": "imported-1", "kind": "message",
            "channel": "matrix", "session": "matrix:team", "conversation": "matrix:team",
            "sender": "@alice:m.org", "is_owner": False, "privacy": "group",
            "text": "IMPORTED ROW", "event_id": "evi", "recorded_ts": 1.0,
        }
    }  # fmt: skip
    with store.transaction():  # one batch: a turn, the import command, another turn
        world.say("matrix:team", "@alice:m.org", Privacy.GROUP)
        ctx = CommandContext(stream_id="77-0", store=store)
        assert _apply_command(store, ctx, "memory.import", {"items": [item]})["ok"]
        world.say("matrix:team", "@alice:m.org", Privacy.GROUP)
        assert list(windows.rows(scope)) == list(visible_history(store, scope, limit=400))
    with store.transaction():  # the next batch
        world.say("matrix:team", "@alice:m.org", Privacy.GROUP)
        got = list(windows.rows(scope))
    assert got == list(visible_history(store, scope, limit=400))
    assert "IMPORTED ROW" in [r.text for r in got]
