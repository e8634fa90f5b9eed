"""Logs of real processes: JSON lines when not on a terminal, each naming its process, turn lines
naming channel, session and stream id, and no secret in any of them."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    chat,
    json_lines,
    memory_rows,
    relaybot_env,
    run_relaybot,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

TURN_EVENTS = {
    "model.request",
    "model.response",
    "model.attempt_failed",
    "model.backoff",
    "agent.model_error",
    "tool.called",
    "turn.done",
}


def test_worker_logs_are_json_with_turn_context_and_never_show_the_api_key(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    key = f"sk-itest-{uuid.uuid4().hex}"
    keys = Keys(prefix)
    home = tmp_path / "home"
    env = relaybot_env(
        home,
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
        OPENAI_API_KEY=key,
        RELAYBOT_MODEL_RETRIES="1",
        RELAYBOT_MODEL_TIMEOUT="1",
    )
    (home / "config.toml").parent.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[model]\nbackoff = 0.01\n")
    worker = procs.worker(env, r=real_redis, keys=keys)

    outputs: list[str] = []
    for text in ("hello logs", "[[status:401]] who am I", "[[garbage]] and this", "[[tool:clock]]"):
        result = chat(env, text, session="logs", verbose=True)
        assert result.returncode == 0, result.stderr
        outputs += [result.stdout, result.stderr]
        chat_lines = json_lines(result.stderr)  # -v: the chat's own log, on a pipe: JSON
        assert chat_lines
        assert all("_raw" not in r for r in chat_lines), result.stderr
        assert {r["process"] for r in chat_lines} == {"chat"}
    assert "check the API key" in outputs[2]  # the 401 reply says what to look at
    status = run_relaybot(["-v", "status", "--json"], env)
    outputs += [status.stdout, status.stderr]
    assert worker.stop() == 0

    # the key was really in use
    assert model_server.authorizations
    assert set(model_server.authorizations) == {f"Bearer {key}"}

    records = worker.records()
    assert records
    assert all("_raw" not in r for r in records), worker.log_text()
    assert all(r.get("process") == "worker" for r in records), worker.log_text()
    assert all({"event", "level", "timestamp"} <= set(r) for r in records)

    sids = {row["stream_id"] for row in memory_rows(home / "memory.sqlite3")}
    assert len(sids) == 4
    # every line written during a turn (model, agent, tool, turn) says which turn it is about
    turn_lines = [
        r for r in records if r["event"].split(".")[0] in {"model", "agent", "tool", "turn"}
    ]
    assert {r["event"] for r in turn_lines} >= TURN_EVENTS
    for r in turn_lines:
        assert r["channel"] == "cli", r
        assert r["session"] == "cli:logs", r
        assert r["stream_id"] in sids, r
    assert {r["stream_id"] for r in turn_lines if r["event"] == "turn.done"} == sids
    # context does not leak from one turn into lines that are not about a turn
    stopped = worker.events("worker.stopped")
    assert stopped
    assert "stream_id" not in stopped[0]

    everything = [worker.log_text(), *outputs]
    everything += [p.read_text(errors="replace") for p in (home / "logs").glob("*")]
    for text in everything:
        assert key not in text
    assert key not in (home / "memory.sqlite3").read_bytes().decode(errors="replace")


def test_a_redis_password_is_not_shown_when_redis_cannot_be_reached(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens here once the socket is closed
    env = relaybot_env(
        tmp_path / "home", redis_url=f"redis://relay:hunter2secret@127.0.0.1:{port}/0"
    )
    result = run_relaybot(["status"], env, timeout=30)
    assert result.returncode == 1
    assert "cannot reach Redis at redis://relay:***@127.0.0.1:" in result.stderr
    assert "hunter2secret" not in result.stderr + result.stdout
