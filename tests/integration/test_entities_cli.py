"""`relaybot entities ...` and `relaybot onboard` as a user runs them: real processes, a real
Redis, the worker as its own process, the fake model server recording what the model is sent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish
from contract.config import load_config
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    write_config,
)
from tests.support.servers import RedisServer, free_port

pytestmark = pytest.mark.integration

SECRET = "QX-5531"
BOB_DM = "matrix:dm-bob"
BOB_MAIL = "email:thread-bob"


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def env(
    tmp_path: Path, redis_server: RedisServer, prefix: str, model_server: FakeModelServer
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(
        home, '[owner]\nname = "Ada"\naliases = [{ address = "@ada:m.org", channel = "matrix" }]\n'
    )
    return relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )


_n = iter(range(1, 10_000))


def say(r: redis.Redis, keys: Keys, conversation: str, sender: str, text: str) -> str:
    n = next(_n)
    msg = InboundMessage(
        channel=conversation.split(":", 1)[0],
        session=conversation,
        conversation=conversation,
        sender=sender,
        privacy=Privacy.DIRECT,
        text=text,
        ts=time.time(),
        event_id=f"ev-{n}",
    )
    return publish(r, keys, msg)


def ask_bob_by_mail(r: redis.Redis, keys: Keys, server: FakeModelServer, count: int) -> str:
    """Bob asks by mail; the context the model was sent for it."""
    sid = say(r, keys, BOB_MAIL, "bob@example.org", "what was my vault code?")
    got = wait_for_replies(r, keys, BOB_MAIL, count, timeout=20)
    assert got[-1].answers == sid
    body = server.requests[-1]
    return json.dumps(body["messages"], ensure_ascii=False)


def entities(env: dict[str, str], *args: str) -> Any:
    result = run_relaybot(["entities", *args], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if "--json" in args else result.stdout


def test_list_show_link_suggest_unlink_end_to_end(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
    model_server: FakeModelServer,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    say(real_redis, keys, BOB_DM, "@Bob:m.org", f"my vault code is {SECRET}")
    wait_for_replies(real_redis, keys, BOB_DM, 1, timeout=20)
    say(real_redis, keys, "matrix:dm-ada", "@ada:m.org", "hello, it is me")
    wait_for_replies(real_redis, keys, "matrix:dm-ada", 1, timeout=20)
    context = ask_bob_by_mail(real_redis, keys, model_server, 1)
    assert SECRET not in context  # two handles, two entities: nothing shared yet

    listed = entities(env, "list", "--json")
    by_handle = {h: e for e in listed for h in e["handles"]}
    bob_matrix, bob_mail = by_handle["matrix:@bob:m.org"], by_handle["email:bob@example.org"]
    assert bob_matrix["id"] != bob_mail["id"]
    assert (bob_matrix["kind"], bob_matrix["messages"]) == ("person", 1)
    assert bob_mail["messages"] == 1
    owner = next(e for e in listed if e["id"] == "owner")
    assert owner["name"] == "Ada" and owner["handles"] == ["matrix:@ada:m.org"]
    assert owner["messages"] == 1
    table = entities(env, "list")
    assert "matrix:@bob:m.org" in table and bob_mail["id"] in table

    # a suggestion records, shows, and shares nothing
    out = entities(env, "suggest", "matrix:@bob:m.org", "bob@example.org", "--reason", "same name")
    assert "is now suggested" in out and "separate people" in out
    shown = entities(env, "show", "email:bob@example.org", "--json")
    assert shown["links"] == [
        {
            "with": bob_matrix["id"],
            "status": "suggested",
            "reason": "same name",
            "actor": "owner",
            "ts": shown["links"][0]["ts"],
        }
    ]
    assert shown["person"] == [bob_mail["id"]]
    assert SECRET not in ask_bob_by_mail(real_redis, keys, model_server, 2)

    # the owner confirms: one person, and Bob by mail sees what Bob said on Matrix
    out = entities(env, "link", "matrix:@bob:m.org", "email:bob@example.org", "--reason", "he said")
    assert "is now verified" in out and "one person" in out
    shown = entities(env, "show", bob_mail["id"], "--json")
    assert shown["person"] == sorted([bob_matrix["id"], bob_mail["id"]])
    assert [link["status"] for link in shown["link_history"]] == ["suggested", "verified"]
    assert shown["handles"][0]["handle"] == "email:bob@example.org"
    assert shown["messages"] == 2 and shown["messages_by_channel"] == {"email": 2}
    text = entities(env, "show", "@bob:m.org")
    assert "verified" in text and "handles" in text and "matrix:@bob:m.org" in text
    assert SECRET in ask_bob_by_mail(real_redis, keys, model_server, 3)

    # linking again changes nothing
    assert "was already verified" in entities(env, "link", "@bob:m.org", "bob@example.org")

    # unlinked: separate again
    out = entities(env, "unlink", "@bob:m.org", "bob@example.org")
    assert "is now unlinked" in out
    assert SECRET not in ask_bob_by_mail(real_redis, keys, model_server, 4)
    assert entities(env, "show", bob_mail["id"], "--json")["person"] == [bob_mail["id"]]


def test_refusals_are_clear(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    # no database yet: list says so
    result = run_relaybot(["entities", "list"], env)
    assert result.returncode == 1
    assert "memory database" in result.stderr
    procs.worker(env, r=real_redis, keys=keys)
    say(real_redis, keys, BOB_DM, "@bob:m.org", "hi")
    wait_for_replies(real_redis, keys, BOB_DM, 1, timeout=20)

    result = run_relaybot(["entities", "link", "owner", "matrix:@bob:m.org"], env)
    assert result.returncode == 1
    assert "owner.aliases" in result.stderr
    result = run_relaybot(["entities", "unlink", "matrix:@bob:m.org", "email:x@example.org"], env)
    assert result.returncode == 1
    assert "has been seen" in result.stderr
    result = run_relaybot(["entities", "show", "nobody-at-all"], env)
    assert result.returncode == 1
    assert "no entity or handle" in result.stderr
    result = run_relaybot(["entities", "link", "@bob:m.org", "@bob:m.org", "--json"], env)
    assert result.returncode == 1
    assert json.loads(result.stdout)["ok"] is False


def test_onboard_writes_a_config_that_relaybot_accepts(tmp_path: Path) -> None:
    home = tmp_path / "fresh"
    env = relaybot_env(home)
    closed = f"http://127.0.0.1:{free_port()}/v1"
    answers = "\n".join(
        [
            "Ada Lovelace",  # name
            "",  # terminal user: anyone at this terminal
            "@ada:example.org, @ada:work.org",  # matrix
            "not-an-address",  # e-mail: refused, asked again
            "ada@example.org",
            closed,  # the model endpoint (nothing answers there: the test fails)
            "sk-test-123",  # API key
            "qwen2.5:7b",
            "k",  # keep these model settings anyway
            "n",  # no Matrix gateway
            "n",  # no e-mail gateway
        ]
    )
    result = run_relaybot(["onboard"], env, stdin=answers + "\n")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "not an e-mail address" in result.stdout
    cfg = load_config(home, env={})
    assert cfg.owner.name == "Ada Lovelace"
    assert [(a.channel, a.address) for a in cfg.owner.aliases] == [  # type: ignore[union-attr]
        ("matrix", "@ada:example.org"),
        ("matrix", "@ada:work.org"),
        ("email", "ada@example.org"),
    ]
    assert cfg.model.base_url == closed
    assert "FAILED: cannot connect to" in result.stdout
    assert cfg.model.model == "qwen2.5:7b"
    assert cfg.model.api_key is not None and cfg.model.api_key.get_secret_value() == "sk-test-123"
    assert (home / "config.toml").stat().st_mode & 0o777 == 0o600

    # not overwritten without --force
    again = run_relaybot(["onboard"], env, stdin=answers + "\n")
    assert again.returncode == 1
    assert "--force" in again.stderr
    # end of input: cancelled, nothing written
    before = (home / "config.toml").read_text()
    cut = run_relaybot(["onboard", "--force"], env, stdin="Grace\n")
    assert cut.returncode == 1
    assert "cancelled" in cut.stderr
    assert (home / "config.toml").read_text() == before


@pytest.mark.parametrize(
    "args",
    [
        ["entities", "link", "matrix:@bob:m.org", "email:bob@example.org"],
        ["memory", "notes", "add", "a note"],
        ["memory", "erase", "--id", "1", "--reason", "test", "--yes"],
    ],
    ids=["entities-link", "notes-add", "erase"],
)
def test_owner_commands_without_redis_say_so_plainly(tmp_path: Path, args: list[str]) -> None:
    """An owner command when Redis cannot be reached: one line saying so, exit 1, no traceback."""
    env = relaybot_env(tmp_path / "home", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    done = run_relaybot(args, env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "relaybot: cannot reach Redis" in done.stderr
    assert "Traceback" not in done.stderr
