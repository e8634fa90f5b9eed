"""Logs of real processes: JSON lines when not read by a person (auto), readable lines when asked
(``RELAYBOT_LOG_FORMAT=console``), each naming its process, turn lines naming channel, session and
stream id, and no secret in any of them. An idle process logs no error; a process that cannot
reach Redis says so at once (issue 13)."""

from __future__ import annotations

import re
import socket
import time
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
    wait_for_heartbeat,
    wait_until,
    write_config,
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
    worker = procs.worker(env, r=real_redis, keys=keys, verbose=True)  # model.* are debug

    outputs: list[str] = []
    for text in ("hello logs", "[[status:401]] who am I", "[[garbage]] and this", "[[tool:clock]]"):
        result = chat(env, text, session="logs", verbose=True)
        failed = text.startswith(("[[status", "[[garbage"))  # an error reply: exit 5
        assert result.returncode == (5 if failed else 0), result.stderr
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nobody listens here once the socket is closed


# a console line: "2026-11-24T13:00:00.123456Z [info     ] event   key=value ..."
CONSOLE_LINE = re.compile(r"^\S+Z \[(debug|info|warning|error|critical)\s*\] (\S+)")


def test_an_idle_jobs_process_logs_no_errors(
    tmp_path: Path, redis_server: RedisServer, real_redis: redis.Redis, prefix: str, procs: Procs
) -> None:
    """rq's blocking wait for a job used to outlast the connection's read timeout: the idle jobs
    process logged "could not connect to Redis ... Timeout reading from socket" every socket
    timeout (10 s) while its heartbeat, and ``status``, said it was healthy. With a 1 s timeout
    the old code said so within about a second; a few timeouts' worth of idling shows it no
    more."""
    home = tmp_path / "home"
    write_config(home, "[redis]\nsocket_timeout = 1\n")
    # a model is configured (the idle worker never asks it): no model.not_configured warning
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url="http://127.0.0.1:9/v1"
    )
    keys = Keys(prefix)
    jobs = procs.jobs(env)
    worker = procs.worker(env, r=real_redis, keys=keys)  # idle beside it: quiet too
    first = wait_for_heartbeat(real_redis, keys, "jobs", pid=jobs.pid)
    jobs.wait_for_log("jobs.started")
    idle_until = time.monotonic() + 4  # four read timeouts: the old code failed each one
    wait_until(lambda: time.monotonic() > idle_until, timeout=10, interval=0.2)
    wait_for_heartbeat(real_redis, keys, "jobs", pid=jobs.pid, newer_than=float(first["ts"]))
    for proc in (jobs, worker):
        assert proc.returncode is None
        assert proc.stop(timeout=15) == 0
        records = proc.records()
        assert all("_raw" not in r for r in records), proc.log_text()
        loud = [r for r in records if r.get("level") in ("warning", "error", "critical")]
        assert not loud, proc.log_text()
        assert "Timeout reading" not in proc.log_text()


def test_a_process_without_redis_says_at_once_that_it_waits(tmp_path: Path, procs: Procs) -> None:
    """It used to say nothing for 30 s. The first line comes at once, in the format asked for,
    with the password masked; a person reading a console line sees where it waits."""
    port = _closed_port()
    url = f"redis://relay:hunter2secret@127.0.0.1:{port}/0"
    shown = f"redis://relay:***@127.0.0.1:{port}/0"
    console = procs.jobs(relaybot_env(tmp_path / "a", redis_url=url, RELAYBOT_LOG_FORMAT="console"))
    as_json = procs.start("worker", ["worker"], relaybot_env(tmp_path / "b", redis_url=url))
    started = time.monotonic()

    line = wait_until(
        lambda: next((x for x in console.log_text().splitlines() if "redis.waiting" in x), None),
        timeout=8,  # a Python start on a busy machine; the line itself comes on the first try
        message=lambda: f"the waiting line; the log:\n{console.log_text()}",
    )
    record = as_json.wait_for_log("redis.waiting", timeout=8)
    waited = time.monotonic() - started
    assert CONSOLE_LINE.match(line), line
    assert f"waiting for Redis at {shown}" in line, line
    assert record["url"] == shown
    assert record["detail"] == f"waiting for Redis at {shown}"
    assert record["level"] == "info" and record["process"] == "worker"
    assert console.returncode is None and as_json.returncode is None  # it waits, it does not exit
    for proc in (console, as_json):
        proc.stop()
        assert "hunter2secret" not in proc.log_text()
    assert waited < 8


def test_console_format_is_readable_and_json_format_is_json(
    tmp_path: Path, redis_server: RedisServer, prefix: str, procs: Procs
) -> None:
    """``[logs] format`` in the config chooses; ``RELAYBOT_LOG_FORMAT`` wins over it; a bad value
    is a configuration error that names the variable."""
    home = tmp_path / "home"
    write_config(home, '[logs]\nformat = "console"\n')
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix)

    by_config = procs.jobs(env)
    line = wait_until(
        lambda: next((x for x in by_config.log_text().splitlines() if "jobs.started" in x), None),
        message=lambda: f"jobs.started; the log:\n{by_config.log_text()}",
    )
    by_config.stop()
    assert CONSOLE_LINE.match(line), line
    assert "process=jobs" in line, line
    lines = [x for x in by_config.log_text().splitlines() if x.strip()]
    assert all(not x.startswith("{") for x in lines), by_config.log_text()

    by_env = procs.jobs({**env, "RELAYBOT_LOG_FORMAT": "json"})
    record = by_env.wait_for_log("jobs.started")
    by_env.stop()
    assert record["process"] == "jobs"
    assert all("_raw" not in r for r in by_env.records()), by_env.log_text()

    bad = run_relaybot(["status"], {**env, "RELAYBOT_LOG_FORMAT": "pretty"})
    assert bad.returncode == 2
    assert "RELAYBOT_LOG_FORMAT" in bad.stderr
