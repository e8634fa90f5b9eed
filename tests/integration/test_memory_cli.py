"""`relaybot memory status|export|import|erase` as the owner runs them: real Redis, the worker as
its own process (the only writer), the command line as another.

Proves: status counts what is there; an export imported into a fresh home gives the same rows and
ids and a second import adds nothing; a squidbot history comes in once, bad lines reported by
number; an erasure leaves no trace of the text in the log, its index or the model's input, keeps
its tombstone, and asks first.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
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
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

SECRET = "zanzibarquux"
TABLES = ("entity", "handle", "entity_link", "log", "reply_status", "note", "erasure")


def make_env(
    tmp_path: Path, name: str, redis_server: RedisServer, model: FakeModelServer
) -> tuple[dict[str, str], Keys]:
    prefix = f"t{uuid.uuid4().hex[:10]}:"
    env = relaybot_env(
        tmp_path / name, redis_url=redis_server.url, prefix=prefix, model_url=model.base_url,
        RELAYBOT_TURNS_MODE="followup",  # one reply per message: the count is the check
    )  # fmt: skip
    return env, Keys(prefix)


def db(env: dict[str, str]) -> Path:
    return Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"


def tell(r: redis.Redis, keys: Keys, text: str, *, sender: str, conversation: str) -> str:
    """A message from someone else, as the Matrix gateway would publish it."""
    return publish(
        r,
        keys,
        InboundMessage(
            channel="matrix",
            session=conversation,
            conversation=conversation,
            sender=sender,
            privacy=Privacy.DIRECT,
            text=text,
            ts=time.time(),
            event_id=uuid.uuid4().hex,
        ),
    )


def relaybot(env: dict[str, str], *args: str, stdin: str | None = None) -> Any:
    return run_relaybot(list(args), env, timeout=60, stdin=stdin)


def table(path: Path, name: str) -> list[dict[str, Any]]:
    return memory_rows(path, f"SELECT * FROM {name} ORDER BY rowid")


def fts(path: Path, word: str) -> list[dict[str, Any]]:
    return memory_rows(path, "SELECT rowid FROM log_fts WHERE log_fts MATCH ?", word)


def test_status_export_import_round_trip(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    env, keys = make_env(tmp_path, "home", redis_server, model_server)
    before = relaybot(env, "memory", "status")
    assert before.returncode == 0 and "no memory database yet" in before.stdout
    procs.worker(env, r=real_redis, keys=keys)
    for text in ("first", "second"):
        assert chat(env, text, session="mine").returncode == 0
    tell(real_redis, keys, "hello from bob", sender="@bob:m.org", conversation="matrix:dm-bob")
    wait_for_replies(real_redis, keys, "matrix:dm-bob", 1)
    chat(env, '[[tool:remember:{"text": "ada likes tea"}]]', session="mine")

    status = relaybot(env, "memory", "status", "--json", "--check")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["counts"]["log_in"] == 4 and report["counts"]["log_out"] == 4
    assert report["counts"]["entities"] == 2 and report["counts"]["handles"] == 1
    assert report["last_entry"]["conversation"] == "cli:mine"
    assert report["last_entry"]["label"] == "[cli / relaybot]"
    assert report["check"] == {"valid_rows": 8, "corrupt_rows": 0, "quick_check": "ok"}
    assert report["schema_version"] >= 5 and report["size"]["db_bytes"] > 0
    human = relaybot(env, "memory", "status")
    assert "4 in, 4 out" in human.stdout and "corrupt rows skipped: 0" in human.stdout

    out = tmp_path / "export.jsonl"
    exported = relaybot(env, "memory", "export", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "exported" in exported.stderr
    assert out.stat().st_mode & 0o777 == 0o600  # everything it knows: the owner's eyes only
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "footer"
    assert [x["type"] for x in lines].count("log") == 8

    # into a fresh home, through its own worker
    env2, keys2 = make_env(tmp_path, "home2", redis_server, model_server)
    procs.worker(env2, r=real_redis, keys=keys2)
    first = relaybot(env2, "memory", "import", str(out), "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    summary = json.loads(first.stdout)
    assert summary["format"] == "relaybot" and summary["rejected"] == []
    assert summary["added"] == {k: n for k, n in lines[0]["counts"].items() if n}
    assert summary["present"] == {}
    for name in TABLES:
        assert table(db(env2), name) == table(db(env), name), name  # same rows, same ids
    again = relaybot(env2, "memory", "import", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "added:           none" in again.stdout
    assert "already present: entity 2" in again.stdout
    assert table(db(env2), "log") == table(db(env), "log")


def test_squidbot_history_import(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    env, keys = make_env(tmp_path, "home", redis_server, model_server)
    procs.worker(env, r=real_redis, keys=keys)
    # said today, before a history of older messages is imported
    assert chat(env, "said today before the import", session="before").returncode == 0

    def line(role: str, content: str, ts: str, channel: str, sender: str) -> str:
        return json.dumps(
            {
                "role": role,
                "content": content,
                "timestamp": ts,
                "channel": channel,
                "sender_id": sender,
            }
        )

    history = tmp_path / "history.jsonl"
    history.write_text(
        "\n".join(
            [
                line(
                    "user",
                    "Did you see the release?",
                    "2026-02-24T10:00:00Z",
                    "matrix",
                    "@alice:m.org",
                ),
                line("assistant", "Not yet.", "2026-02-24T10:00:05Z", "matrix", "squidbot"),
                "{broken",
                line("user", f"remember {SECRET}", "2026-02-24T11:00:00Z", "cli", "tester"),
                line("system", "you are squidbot", "2026-02-24T11:00:00Z", "cli", "squidbot"),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    result = relaybot(env, "memory", "import", str(history))
    assert result.returncode == 1, result.stdout + result.stderr  # some lines were rejected
    assert "squidbot format, 3 records read" in result.stdout
    assert "added:           log 3" in result.stdout
    assert "line 3: not JSON" in result.stdout
    assert "line 5: role 'system' is not a user or assistant message" in result.stdout
    rows = memory_rows(
        db(env), "SELECT direction, conversation, privacy, is_owner, text FROM log WHERE id > 2"
    )
    assert rows == [
        {
            "direction": "in",
            "conversation": "matrix:@alice:m.org",
            "privacy": "direct",
            "is_owner": 0,
            "text": "Did you see the release?",
        },
        {
            "direction": "out",
            "conversation": "matrix:@alice:m.org",
            "privacy": "direct",
            "is_owner": 0,
            "text": "Not yet.",
        },
        {
            "direction": "in",
            "conversation": "cli:tester",
            "privacy": "owner",
            "is_owner": 1,
            "text": f"remember {SECRET}",
        },
    ]
    # it says whom it took each sender for (issue 13)
    assert "cli / tester -> owner (by owner.aliases)" in result.stdout
    assert "unmapped:        1 sender(s), each an entity of its own" in result.stdout
    assert "matrix / @alice:m.org -> e-" in result.stdout
    again = json.loads(relaybot(env, "memory", "import", str(history), "--json").stdout)
    assert again["added"] == {} and again["present"] == {"log": 3}
    # a Telegram history: the owner's handle there is mapped on the command line
    telegram = tmp_path / "telegram.jsonl"
    telegram.write_text(
        line("user", "from my phone", "2026-02-20T08:00:00Z", "telegram", "12345") + "\n"
        + line("user", "hi from bob", "2026-02-20T08:01:00Z", "telegram", "777") + "\n",
        encoding="utf-8",
    )  # fmt: skip
    mapped = relaybot(env, "memory", "import", str(telegram), "--map", "telegram:12345=owner")
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    assert "telegram / 12345 -> owner (by --map)" in mapped.stdout
    assert "telegram / 777 -> e-" in mapped.stdout
    rows = memory_rows(
        db(env), "SELECT sender, entity, is_owner, privacy FROM log WHERE channel = 'telegram'"
    )
    assert rows[0] == {"sender": "12345", "entity": "owner", "is_owner": 1, "privacy": "owner"}
    assert rows[1]["is_owner"] == 0 and rows[1]["entity"].startswith("e-")
    bad = relaybot(env, "memory", "import", str(telegram), "--map", "12345=owner")
    assert bad.returncode != 0 and "CHANNEL:ADDRESS=TARGET" in bad.stderr
    # what was imported is memory like any other: the owner's next turn sees it, in the
    # messages' time: the imported (older) messages before what was said today (issue 13)
    assert chat(env, "what do you remember?", session="later").returncode == 0
    assert SECRET in json.dumps(model_server.requests[-1])
    system = model_server.requests[-1]["messages"][0]["content"]
    assert system.index(f"remember {SECRET}") < system.index("said today before the import")
    assert system.index("Did you see the release?") < system.index(f"remember {SECRET}")


def test_erase_a_conversation_end_to_end(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    env, keys = make_env(tmp_path, "home", redis_server, model_server)
    worker = procs.worker(env, r=real_redis, keys=keys)
    tell(
        real_redis,
        keys,
        f"my password is {SECRET}",
        sender="@bob:m.org",
        conversation="matrix:dm-bob",
    )
    tell(
        real_redis,
        keys,
        "and the weather is nice",
        sender="@bob:m.org",
        conversation="matrix:dm-bob",
    )
    wait_for_replies(real_redis, keys, "matrix:dm-bob", 2)
    assert chat(env, "what did bob say?", session="mine").returncode == 0
    assert SECRET in json.dumps(model_server.requests[-1])  # the owner sees everything
    path = db(env)
    # (the worker indexes its commits within 0.25 s, or when idle: memory.store)
    wait_until(lambda: fts(path, SECRET), timeout=10, message="the secret to be indexed")

    # no terminal and no --yes: refused, nothing sent
    refused = relaybot(
        env, "memory", "erase", "--conversation", "matrix:dm-bob", "--reason", "bob asked"
    )
    assert refused.returncode == 1 and "needs confirmation" in refused.stderr
    nothing = relaybot(
        env, "memory", "erase", "--conversation", "nowhere", "--reason", "x", "--yes"
    )
    assert nothing.returncode == 1 and "nothing to erase" in nothing.stderr

    erased = relaybot(
        env,
        "memory",
        "erase",
        "--conversation",
        "matrix:dm-bob",
        "--reason",
        "bob asked",
        "--yes",
        "--json",
    )
    assert erased.returncode == 0, erased.stdout + erased.stderr
    result = json.loads(erased.stdout)
    # the conversation's 4 rows, and the owner's reply whose context held them (derived)
    assert result["ok"] and result["log_rows"] == 5 and not result["replayed"]
    assert result["derived_replies"] == 1 and result["cleaned"]["memory_wal"] == "truncated"
    worker.wait_for_log("memory.erased")

    rows = memory_rows(path, "SELECT text, extra FROM log WHERE conversation = 'matrix:dm-bob'")
    assert (
        rows
        == [{"text": "", "extra": json.dumps({"erased": result["erasure"]}).replace(" ", "")}] * 4
    )
    assert fts(path, SECRET) == [] and fts(path, "weather") == []
    (tomb,) = memory_rows(path, "SELECT * FROM erasure")
    assert (tomb["target_kind"], tomb["target"], tomb["reason"]) == (
        "conversation",
        "matrix:dm-bob",
        "bob asked",
    )
    assert tomb["log_rows"] == 5 and tomb["requested_by"]
    assert memory_rows(path, "SELECT count(*) AS n FROM erasure_grant") == [{"n": 0}]
    conn = sqlite3.connect(path)
    try:  # outside an erasure the database still refuses to change the log
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE log SET text = 'x'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM log")
    finally:
        conn.close()
    # the worker's next context has nothing of it (its caches were dropped)
    assert chat(env, "what did bob say?", session="mine").returncode == 0
    assert SECRET not in json.dumps(model_server.requests[-1])
    assert "weather" not in json.dumps(model_server.requests[-1])
    status = json.loads(relaybot(env, "memory", "status", "--json").stdout)
    assert status["counts"]["erasures"] == 1 and status["counts"]["erased_log_rows"] == 5


def test_the_erasure_preview_lists_what_goes_and_keep_keeps_it(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    """Issue 24, item 7: two messages of small talk with bob; later, in the owner's terminal, a
    turn whose history window held them wrote an unrelated note (a locker code). The preview of
    erasing bob's conversation names that note (its words, its hop, the row it drew on), not
    only "1 notes"; --keep note:N keeps it, the tombstone says so; --yes still works."""
    env, keys = make_env(tmp_path, "home", redis_server, model_server)
    procs.worker(env, r=real_redis, keys=keys)
    tell(real_redis, keys, "nice weather today", sender="@bob:m.org", conversation="matrix:dm-bob")
    tell(real_redis, keys, "yes, lovely", sender="@bob:m.org", conversation="matrix:dm-bob")
    wait_for_replies(real_redis, keys, "matrix:dm-bob", 2)
    remember = json.dumps({"text": "locker code 4711", "type": "fact"})
    assert chat(env, f"[[tool:remember:{remember}]] my locker", session="own").returncode == 0
    path = db(env)
    (note,) = memory_rows(path, "SELECT id FROM note WHERE text = 'locker code 4711'")
    (first,) = memory_rows(
        path, "SELECT id FROM log WHERE text = 'nice weather today' AND direction = 'in'"
    )

    dry = relaybot(env, "memory", "erase", "--conversation", "matrix:dm-bob", "--reason", "x",
                   "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    line = next(ln for ln in dry.stdout.splitlines() if f"note:{note['id']}" in ln)
    assert "hop 1" in line and f"drew on log #{first['id']}" in line, dry.stdout
    assert '"locker code 4711"' in line, dry.stdout
    assert "--keep" in dry.stdout
    assert memory_rows(path, "SELECT count(*) AS n FROM erasure")[0]["n"] == 0  # nothing erased
    bad = relaybot(env, "memory", "erase", "--conversation", "matrix:dm-bob", "--reason", "x",
                   "--keep", "note:999999", "--yes")  # fmt: skip
    assert bad.returncode == 1 and "not among" in bad.stderr, bad.stderr

    erased = relaybot(env, "memory", "erase", "--conversation", "matrix:dm-bob", "--reason",
                      "bob asked", "--keep", f"note:{note['id']}", "--yes")  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    assert f"kept:          note:{note['id']}" in erased.stdout, erased.stdout
    assert memory_rows(path, "SELECT text FROM note") == [{"text": "locker code 4711"}]
    (tomb,) = memory_rows(path, "SELECT detail FROM erasure")
    kept = json.loads(tomb["detail"])["kept"]
    assert kept == [{"kind": "note", "id": note["id"], "hop": 1, "drew_on": f"log #{first['id']}"}]
