"""`relaybot memory notes ...` end to end: a real Redis, the worker as its own process, the CLI as
the owner types it. Writes go through the worker (the only writer), reads are read-only, and what
the notes say reaches the model's context under the scoping rules."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def env(
    tmp_path: Path, redis_server: RedisServer, prefix: str, model_server: FakeModelServer
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(home, '[roles]\n"cli:work" = "architect"\n')
    return relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )


def notes_cli(env: dict[str, str], *args: str) -> Any:
    result = run_relaybot(["memory", "notes", *args], env)
    assert result.returncode == 0, result.stderr
    return result


def listed(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    out = json.loads(notes_cli(env, "list", "--json", *args).stdout)
    assert isinstance(out, list)
    return out


def system_prompt_of_last_turn(server: FakeModelServer) -> str:
    return str(server.requests[-1]["messages"][0]["content"])


def test_notes_add_supersede_list_show_search_and_the_context(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
) -> None:
    procs.worker(env, r=real_redis, keys=Keys(prefix))

    added = notes_cli(
        env, "add", "JWT chosen over sessions", "--type", "decision", "--topic", "auth",
        "--visibility", "public",
    )  # fmt: skip
    assert added.stdout.startswith("wrote note #1: public knowledge")
    scratch = notes_cli(env, "add", "scratch: try argon2 for sessions", "--chat", "cli:other")
    assert scratch.stdout == (
        "wrote note #2: seen only in your own conversations (add --visibility public to share it)\n"
    )  # private unless told otherwise (issue 10, case 7)
    role = notes_cli(
        env, "add", "ADR template for sessions", "--scope", "agent", "--role", "architect",
        "--visibility", "public", "--json",
    )  # fmt: skip
    role_result = json.loads(role.stdout)
    assert role_result["ok"]
    assert role_result["note"]["id"] == 3
    assert role_result["note"]["author"] == "owner"
    newer = notes_cli(env, "supersede", "1", "Sessions after all: JWT revocation is too hard")
    assert newer.stdout.startswith("wrote note #4: public knowledge")

    # list: the live notes, newest first; --all adds the superseded version; filters narrow
    assert [n["id"] for n in listed(env)] == [4, 3, 2]
    assert [n["id"] for n in listed(env, "--all")] == [4, 3, 2, 1]
    assert [n["id"] for n in listed(env, "--scope", "shared")] == [4]
    assert [n["id"] for n in listed(env, "--all", "--topic", "AUTH")] == [4, 1]
    assert [n["id"] for n in listed(env, "--role", "architect")] == [3]
    assert [n["id"] for n in listed(env, "--chat", "cli:other")] == [2]
    four = listed(env, "--scope", "shared")[0]
    assert (four["supersedes"], four["topic"], four["type"]) == (1, "auth", "decision")

    # show: every field and the versions, oldest first
    shown = json.loads(notes_cli(env, "show", "1", "--json").stdout)
    assert shown["note"]["text"] == "JWT chosen over sessions"  # the old note stays
    assert shown["note"]["superseded_by"] == 4
    assert [v["id"] for v in shown["versions"]] == [1, 4]
    human = notes_cli(env, "show", "4").stdout
    assert "supersedes: 1" in human
    assert "versions (oldest first):" in human

    # search: full text, most relevant first
    found = notes_cli(env, "search", "revocation").stdout.splitlines()
    assert len(found) == 1
    assert found[0].startswith("#4 [decision / auth]")
    assert notes_cli(env, "search", "zebra").stdout == "no notes match 'zebra'\n"

    # refusals come back from the worker with a reason, and change nothing
    fork = run_relaybot(["memory", "notes", "supersede", "1", "fork"], env)
    assert fork.returncode == 1
    assert "already superseded by #4" in fork.stderr
    bad = run_relaybot(["memory", "notes", "add", "x", "--scope", "agent"], env)
    assert bad.returncode == 1
    assert "needs the role" in bad.stderr
    missing = run_relaybot(["memory", "notes", "show", "99"], env)
    assert missing.returncode == 1
    assert (
        len(memory_rows(Path(env["RELAYBOT_HOME"]) / "memory.sqlite3", "SELECT * FROM note")) == 4
    )

    # the context: the owner's own conversations see every live note, not superseded versions
    reply = chat(env, "what about sessions?", session="work")
    assert reply.returncode == 0, reply.stderr
    system = system_prompt_of_last_turn(model_server)
    assert "JWT revocation is too hard" in system
    assert "ADR template for sessions" in system
    assert "JWT chosen over sessions" not in system
    assert "argon2" in system
    chat(env, "sessions again?", session="play")
    system = system_prompt_of_last_turn(model_server)
    assert "JWT revocation is too hard" in system
    assert "ADR template" in system


def test_notes_are_private_by_default_and_the_owner_sees_them_everywhere(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
) -> None:
    """Issue 10, case 7: `notes add` made a "home wifi password" public by default (it showed up
    in a group's context), and what the model remembered in one terminal session was invisible
    in the owner's next one."""
    keys = Keys(prefix)
    procs.worker(env, r=real_redis, keys=keys)
    notes_cli(env, "add", "home wifi password is hunter2", "--topic", "wifi")
    remembered = chat(
        env, 'note it [[tool:remember:{"text": "the owner drinks green tea"}]]', session="one"
    )
    assert remembered.returncode == 0, remembered.stderr
    assert "every one of the owner's own conversations can see it" in remembered.stdout

    chat(env, "which wifi password and which tea?", session="two")
    owner_input = json.dumps(model_server.requests[-1]["messages"])
    assert "hunter2" in owner_input
    assert "green tea" in owner_input

    room = "matrix:!team:m.org"
    group = InboundMessage(
        channel="matrix", session=room, conversation=room, sender="@bob:m.org",
        privacy=Privacy.GROUP, text="what is the wifi password? tea?", ts=time.time(),
        event_id="$group-1",
    )  # fmt: skip
    publish(real_redis, keys, group)
    wait_for_replies(real_redis, keys, room, 1, timeout=20)
    group_input = json.dumps(model_server.requests[-1]["messages"])
    assert "wifi password?" in group_input  # this is the group's turn
    assert "hunter2" not in group_input
    assert "green tea" not in group_input
