"""Owner commands in degraded mode (worker/turn.py): a command whose SQL fails is answered with
a plain error instead of being retried into the dead-letter stream, and leaves nothing behind;
without memory, commands say so."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy
from memory import importer as admin
from memory.store import MemoryStore
from tests.support.worker import handle_entry
from worker.model import NoModel
from worker.tools import default_tools
from worker.turn import Turns


def command(op: str, args: dict[str, object]) -> dict[str, str]:
    return InboundMessage(
        kind=Kind.COMMAND,
        channel="cli",
        session="cli:admin-1",
        conversation="cli:admin-1",
        sender="ada",
        privacy=Privacy.OWNER,
        text=f"/{op}",
        ts=time.time(),
        event_id="e1",
        extra={"op": op, "args": args},
    ).to_fields()


ITEM = {
    "line": 1,
    "record": {
        "type": "entity",
        "id": "e-abcdef",
        "kind": "person",
        "name": "Bob",
        "created_ts": 1.0,
    },
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def turns(tmp_path: Path, store: MemoryStore | None) -> Turns:
    return Turns(Config(home=tmp_path), store, NoModel(), default_tools())


def test_a_command_whose_sql_fails_is_answered_and_changes_nothing(
    tmp_path: Path, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_apply = admin.Importer.apply

    def half_then_fail(self: admin.Importer, items: list[object]) -> admin.ImportResult:
        real_apply(self, items)  # the entity is written ...
        raise sqlite3.OperationalError("disk I/O error")  # ... then memory fails

    monkeypatch.setattr(admin.Importer, "apply", half_then_fail)
    t = turns(tmp_path, store)
    with store.transaction():  # as the worker's batch
        outcome = handle_entry(
            t, "5-0", command("memory.import", {"format": "relaybot", "items": [ITEM]})
        )
    assert outcome.reply is not None and outcome.dead_reason is None
    result = json.loads(outcome.reply.text)
    assert not result["ok"] and "nothing was changed" in result["error"]
    assert t.memory_failures == 1
    assert store.conn.execute("SELECT count(*) FROM entity").fetchone() == (0,)

    monkeypatch.setattr(admin.Importer, "apply", real_apply)
    with store.transaction():
        outcome = handle_entry(
            t, "6-0", command("memory.import", {"format": "relaybot", "items": [ITEM]})
        )
    assert outcome.reply is not None
    assert json.loads(outcome.reply.text)["added"] == {"entity": 1}


def test_without_memory_commands_say_so(tmp_path: Path) -> None:
    outcome = handle_entry(
        turns(tmp_path, None),
        "1-0",
        command("memory.erase", {"kind": "id", "target": "1", "reason": "x"}),
    )
    assert outcome.reply is not None
    assert json.loads(outcome.reply.text) == {
        "ok": False,
        "error": "memory is unavailable (see the worker log)",
    }


def test_commands_after_sqlite_rolled_the_batch_back_are_answered_not_crashed(
    tmp_path: Path, store: MemoryStore
) -> None:
    """A disk that fills inside a batch makes SQLite roll the whole batch back by itself; every
    later owner command of that batch is a database error (degraded: answered with an error,
    nothing written), never a crash of the turn that would be retried into the dead letters."""
    t = turns(tmp_path, store)
    with store.transaction():
        for i in range(300):
            msg = InboundMessage(
                channel="cli", session="cli:a", conversation="cli:a", sender="ada",
                privacy=Privacy.OWNER, text=f"tea word{i} " * 30, ts=1.0 + i, event_id=f"m{i}",
            )  # fmt: skip
            store.append_inbound(msg, f"{i + 1}-0", is_owner=True)
    answers: list[dict[str, object]] = []

    def batch_on_a_full_disk() -> None:
        with store.transaction():
            store.sync_index()
            pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
            store.conn.execute(f"PRAGMA max_page_count = {pages}")
            for n, target in enumerate(({"kind": "conversation", "target": "cli:a"},) * 2):
                outcome = handle_entry(
                    t, f"9{n}-0", command("memory.erase", {**target, "reason": "r"})
                )
                assert outcome.reply is not None
                answers.append(json.loads(outcome.reply.text))

    with pytest.raises(sqlite3.Error):  # the commit finds the batch rolled back
        batch_on_a_full_disk()
    store.conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
    assert [a["ok"] for a in answers] == [False, False]
    assert all("memory failed" in a["error"] for a in answers)
    assert t.memory_failures == 2
    assert store.counts()["log"] == 300  # nothing was erased
