"""The owner's scheduling commands (issue 27, worker/schedule_commands.py): ``schedule.add`` and
``schedule.cancel`` as the worker applies them (``relaybot reminders add|cancel``), with the
worker built as ``relaybot worker`` builds it (worker/main.py ``build_consumer``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy
from memory.store import MemoryStore
from memory.writer import schedule
from tests.support.worker import handle_entry
from worker.main import build_consumer
from worker.model import NoModel
from worker.schedule_commands import session_name
from worker.turn import Turns


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def worker_turns(tmp_path: Path, store: MemoryStore, **schedule_keys: Any) -> Turns:
    cfg = Config(home=tmp_path, owner={"name": "Ada", "timezone": "Europe/Berlin"},
                 schedule=schedule_keys)  # fmt: skip
    return build_consumer(cfg, fakeredis.FakeRedis(), model=NoModel(), store=store).turns


def sid(offset_s: float = 0.0) -> str:
    return f"{int((time.time() + offset_s) * 1000)}-0"


def command(turns: Turns, op: str, args: dict[str, Any], stream_id: str | None = None,
            *, channel: str = "cli") -> dict[str, Any]:  # fmt: skip
    msg = InboundMessage(
        kind=Kind.COMMAND, channel=channel, session=f"{channel}:admin-1",
        conversation=f"{channel}:admin-1", sender="ada", privacy=Privacy.OWNER, text=f"/{op}",
        ts=time.time(), event_id="e1", extra={"op": op, "args": args},
    )  # fmt: skip
    outcome = handle_entry(turns, stream_id or sid(), msg.to_fields(), channel=channel)
    assert outcome.reply is not None, outcome
    return dict(json.loads(outcome.reply.text))


def record_message(turns: Turns, *, session: str, conversation: str, privacy: Privacy) -> None:
    """A message of a session, as memory records one (its newest row names where it is)."""
    channel = session.split(":", 1)[0]
    msg = InboundMessage(channel=channel, session=session, conversation=conversation,
                         sender="@bob:m.org", privacy=privacy, text="hi", ts=time.time(),
                         event_id=f"ev-{conversation}")  # fmt: skip
    with turns.memory.write():
        turns.memory.record_inbound(msg, sid())
    turns.memory.settle()


def items(store: MemoryStore) -> list[schedule.Item]:
    return schedule.listing(store.conn, include_ended=True)


def test_add_in_a_terminal_session_and_cancel(tmp_path: Path, store: MemoryStore) -> None:
    turns = worker_turns(tmp_path, store)
    done = command(turns, "schedule.add", {"text": "call mum", "in": "2h", "session": "work"})
    assert done["ok"] and done["created"], done
    item = done["item"]
    assert (item["channel"], item["session"], item["conversation"], item["privacy"]) == (
        "cli",
        "cli:work",
        "cli:work",
        "owner",
    )
    assert item["setter"] == "cli:ada" and item["setter_entity"] == "owner"
    assert item["created_by"].startswith("cmd:")
    assert done["recurrence"] == "once" and done["next"].endswith(("+01:00", "+02:00"))
    gone = command(turns, "schedule.cancel", {"id": item["id"]})
    assert gone["ok"] and gone["item"]["status"] == "cancelled", gone
    assert items(store)[0].end_reason is not None and "owner" in items(store)[0].end_reason


def test_a_replayed_command_adds_and_cancels_once(tmp_path: Path, store: MemoryStore) -> None:
    turns = worker_turns(tmp_path, store, owner_max_items=1)
    entry = sid()
    args = {"text": "call mum", "in": "2h", "session": "cli:work"}
    first = command(turns, "schedule.add", args, entry)
    time.sleep(0.01)
    again = command(turns, "schedule.add", args, entry)  # at the cap: the replay is no new one
    assert first["ok"] and first["created"] and again["ok"] and not again["created"], again
    assert again["item"]["id"] == first["item"]["id"] and len(items(store)) == 1
    cancel = sid(1)
    assert command(turns, "schedule.cancel", {"id": 1}, cancel)["ok"]
    assert command(turns, "schedule.cancel", {"id": 1}, cancel)["ok"]  # the same entry again
    other = command(turns, "schedule.cancel", {"id": 1}, sid(2))  # another cancel: refused
    assert other == {"ok": False, "error": "reminder #1 is cancelled already: nothing to cancel "
                     "(relaybot reminders --all shows it)"}  # fmt: skip


def test_a_session_of_another_channel_fires_in_its_newest_conversation(
    tmp_path: Path, store: MemoryStore
) -> None:
    turns = worker_turns(tmp_path, store)
    record_message(turns, session="matrix:!room:m.org", conversation="matrix:!room:m.org#g",
                   privacy=Privacy.GROUP)  # fmt: skip
    done = command(turns, "schedule.add", {"text": "standup", "every": "0 9 * * 1-5",
                                           "session": "matrix:!room:m.org"})  # fmt: skip
    assert done["ok"], done
    item = done["item"]
    assert (item["channel"], item["conversation"], item["privacy"]) == (
        "matrix",
        "matrix:!room:m.org#g",
        "group",
    )
    assert item["cron"] == "0 9 * * 1-5" and done["recurrence"] != "once"
    assert " until " not in done["recurrence"]
    asked = {"text": "sprint standup", "every": "0 9 * * 1-5", "until": "30d",
             "session": "matrix:!room:m.org"}  # fmt: skip
    until = command(turns, "schedule.add", asked)
    assert until["ok"] and " until 20" in until["recurrence"], until  # as `reminders` shows it


def test_without_a_session_the_newest_terminal_chat(tmp_path: Path, store: MemoryStore) -> None:
    turns = worker_turns(tmp_path, store)
    missing = command(turns, "schedule.add", {"text": "x", "in": "1h"})
    assert not missing["ok"] and "no terminal chat session" in missing["error"], missing
    msg = InboundMessage(channel="cli", session="cli:ada-1a2b3c", conversation="cli:ada-1a2b3c",
                         sender="ada", privacy=Privacy.OWNER, text="hi", ts=time.time(),
                         event_id="ev1")  # fmt: skip
    with turns.memory.write():
        turns.memory.record_inbound(msg, sid())
    turns.memory.settle()
    done = command(turns, "schedule.add", {"text": "x", "in": "1h"})
    assert done["ok"] and done["item"]["session"] == "cli:ada-1a2b3c", done


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"text": "x", "in": "1h", "session": "matrix:!nowhere:m.org"}, "unknown session"),
        ({"text": "x", "at": "someday", "session": "w"}, ""),
        ({"text": "x", "at": "2020-01-01T09:00", "session": "w"}, ""),
        ({"text": "x", "every": "* * * * * *", "session": "w"}, ""),
        ({"text": "", "in": "1h", "session": "w"}, "text"),
        ({"text": "x", "in": "1h", "late": "never", "session": "w"}, "late"),
        ({"text": 5, "in": "1h", "session": "w"}, "text must be a string"),
    ],
)
def test_what_cannot_be_set_is_one_line_and_sets_nothing(
    tmp_path: Path, store: MemoryStore, args: dict[str, Any], says: str
) -> None:
    result = command(worker_turns(tmp_path, store), "schedule.add", args)
    assert result["ok"] is False and says in result["error"], result
    assert "\n" not in result["error"]
    assert items(store) == []


def test_cancel_of_an_unknown_id_says_so(tmp_path: Path, store: MemoryStore) -> None:
    turns = worker_turns(tmp_path, store)
    assert command(turns, "schedule.cancel", {"id": 42}) == {
        "ok": False, "error": "there is no reminder #42 (relaybot reminders lists them)"
    }  # fmt: skip
    assert not command(turns, "schedule.cancel", {"id": "x"})["ok"]


def test_scheduling_turned_off_refuses_add_but_not_cancel(
    tmp_path: Path, store: MemoryStore
) -> None:
    on = worker_turns(tmp_path, store)
    assert command(on, "schedule.add", {"text": "x", "in": "1h", "session": "w"})["ok"]
    off = worker_turns(tmp_path, store, enabled=False)
    refused = command(off, "schedule.add", {"text": "y", "in": "1h", "session": "w"})
    assert not refused["ok"] and "turned off" in refused["error"]
    assert command(off, "schedule.cancel", {"id": 1})["ok"]


def test_only_the_owners_terminal_may_send_them(tmp_path: Path, store: MemoryStore) -> None:
    turns = worker_turns(tmp_path, store)
    outcome = handle_entry(turns, sid(), InboundMessage(
        kind=Kind.COMMAND, channel="matrix", session="matrix:x", conversation="matrix:x",
        sender="@eve:m.org", privacy=Privacy.OWNER, text="/schedule.add", ts=time.time(),
        event_id="e1", extra={"op": "schedule.add", "args": {"text": "x", "in": "1h"}},
    ).to_fields(), channel="matrix")  # fmt: skip
    assert outcome.dead_reason is not None and items(store) == []


def test_session_names() -> None:
    assert session_name("work") == "cli:work"
    assert session_name("cli:work") == "cli:work"
    assert session_name("matrix:!r:m.org") == "matrix:!r:m.org"
    assert session_name("ada:x") == "cli:ada:x"  # not a channel: a terminal session's name
