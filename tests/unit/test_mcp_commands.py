"""The owner command ``mcp.approve`` (issue 29, worker/mcp_commands.py), applied by the worker as
``relaybot worker`` builds it (worker/main.py ``build_consumer``) with a hub of our own that
records what it was asked: the digest goes through as given, a refusal comes back as the
command's answer, a bad argument or a missing hub never reaches a hub, and only the owner's
terminal may send it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy
from memory.store import MemoryStore
from tests.support.worker import handle_entry
from worker.main import build_consumer
from worker.mcp_commands import approve_command
from worker.model import NoModel
from worker.turn import Turns

APPROVED = {
    "ok": True, "server": "files", "digest": "ab" * 32, "added": ["grep"], "changed": ["read"],
    "removed": [], "tools": {"grep": "search the notes", "read": "read a note, now by path"},
}  # fmt: skip


class FakeHub:
    """What approve_command needs of worker/mcp_hub.py ``McpHub``: its calls are recorded."""

    def __init__(self, answer: dict[str, object] | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str | None]] = []

    def approve(self, server: str, digest: str | None) -> dict[str, object]:
        self.asked.append((server, digest))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def worker_turns(tmp_path: Path, store: MemoryStore, hub: FakeHub | None) -> Turns:
    cfg = Config(home=tmp_path, owner={"name": "Ada"})
    turns = build_consumer(cfg, fakeredis.FakeRedis(), model=NoModel(), store=store).turns
    turns.commands["mcp.approve"] = partial(approve_command, hub)  # as worker/main.py wires it
    return turns


def send(turns: Turns, args: dict[str, Any], *, channel: str = "cli") -> dict[str, Any]:
    msg = InboundMessage(
        kind=Kind.COMMAND, channel=channel, session=f"{channel}:admin-1",
        conversation=f"{channel}:admin-1", sender="ada", privacy=Privacy.OWNER,
        text="/mcp.approve", ts=time.time(), event_id=f"e{time.time_ns()}",
        extra={"op": "mcp.approve", "args": args},
    )  # fmt: skip
    sid = f"{int(time.time() * 1000)}-0"
    outcome = handle_entry(turns, sid, msg.to_fields(), channel=channel)
    assert outcome.reply is not None, outcome
    return dict(json.loads(outcome.reply.text))


def test_the_hubs_answer_is_the_commands(tmp_path: Path, store: MemoryStore) -> None:
    hub = FakeHub(APPROVED)
    done = send(worker_turns(tmp_path, store, hub), {"server": "files", "digest": "ab" * 32})
    assert done == APPROVED
    assert hub.asked == [("files", "ab" * 32)]


def test_without_a_digest_the_hub_is_asked_with_none(tmp_path: Path, store: MemoryStore) -> None:
    hub = FakeHub(APPROVED)
    send(worker_turns(tmp_path, store, hub), {"server": " files "})
    assert hub.asked == [("files", None)]


def test_a_refusal_is_the_answer(tmp_path: Path, store: MemoryStore) -> None:
    refused = {"ok": False, "error": "the listing of files changed since: relaybot tools"}
    done = send(worker_turns(tmp_path, store, FakeHub(refused)), {"server": "files", "digest": "x"})
    assert done == refused


@pytest.mark.parametrize(
    "args",
    [{}, {"server": ""}, {"server": 3}, {"server": "files", "digest": 5},
     {"server": "files", "digest": "f" * 500}],
)  # fmt: skip
def test_bad_arguments_never_reach_the_hub(
    tmp_path: Path, store: MemoryStore, args: dict[str, Any]
) -> None:
    hub = FakeHub(APPROVED)
    done = send(worker_turns(tmp_path, store, hub), args)
    assert done["ok"] is False and "relaybot tools" in done["error"]
    assert hub.asked == []


def test_no_hub_says_how_to_configure_one(tmp_path: Path, store: MemoryStore) -> None:
    done = send(worker_turns(tmp_path, store, None), {"server": "files"})
    assert done["ok"] is False
    assert "[mcp.servers.files]" in done["error"]


def test_a_pin_that_cannot_be_written_is_a_refusal(tmp_path: Path, store: MemoryStore) -> None:
    hub = FakeHub(PermissionError(13, "Permission denied"))
    done = send(worker_turns(tmp_path, store, hub), {"server": "files"})
    assert done["ok"] is False
    assert "nothing was approved" in done["error"] and "mcp/pins" in done["error"]


def test_only_the_owners_terminal_may_approve(tmp_path: Path, store: MemoryStore) -> None:
    """An owner command on a gateway's stream is refused before it is applied (the gateway is
    trusted for its own channel's senders only): the hub never hears of it."""
    hub = FakeHub(APPROVED)
    turns = worker_turns(tmp_path, store, hub)
    msg = InboundMessage(
        kind=Kind.COMMAND, channel="matrix", session="matrix:!r:m.org",
        conversation="matrix:!r:m.org", sender="@mallory:m.org", privacy=Privacy.OWNER,
        text="/mcp.approve", ts=time.time(), event_id="e-forged",
        extra={"op": "mcp.approve", "args": {"server": "files"}},
    )  # fmt: skip
    outcome = handle_entry(turns, f"{int(time.time() * 1000)}-0", msg.to_fields(), channel="matrix")
    assert hub.asked == []
    if outcome.reply is not None:
        assert json.loads(outcome.reply.text)["ok"] is False
