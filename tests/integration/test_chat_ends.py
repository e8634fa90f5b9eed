"""An interactive zero-config ``relaybot chat`` that ends any way at all -- the terminal closed
(SIGHUP), a stop asked (SIGTERM), killed (SIGKILL) -- leaves no embedded Redis and no worker of
its own running (they ran on, unseen, after a closed terminal or a kill -9)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    REPO,
    chat,
    json_lines,
    memory_rows,
    pid_running,
    processes_mentioning,
    relaybot_env,
    short_tmpdir,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmpdir() as path:
        yield path


def _until(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(check())  # type: ignore[operator]


def _interactive(env: dict[str, str], err: Path, session: str) -> subprocess.Popen[bytes]:
    with err.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "relaybot", "-v", "chat", "--session", session],
            env=dict(env),
            cwd=REPO,
            stdin=subprocess.PIPE,  # kept open: the chat waits at its prompt
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _pids(log: Path) -> tuple[int, int] | None:
    records = json_lines(log.read_text(errors="replace"))
    redis = [r["pid"] for r in records if r.get("event") == "redis.embedded_started"]
    worker = [r["pid"] for r in records if r.get("event") == "runtime.worker_started"]
    return (int(redis[0]), int(worker[0])) if redis and worker else None


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGKILL])
def test_a_chat_that_ends_any_way_stops_what_it_started(tmp: Path, sig: signal.Signals) -> None:
    home = tmp / "home"
    env = relaybot_env(home)
    err = tmp / "chat.stderr"
    proc = _interactive(env, err, "ends")
    try:
        assert _until(lambda: _pids(err) is not None, 30), err.read_text()
        found = _pids(err)
        assert found is not None
        redis_pid, worker_pid = found
        assert _until((home / "logs" / "worker.log").exists, 10)
        assert _until(
            lambda: b"worker.lease_acquired" in (home / "logs" / "worker.log").read_bytes(), 30
        )
        proc.send_signal(sig)
        proc.wait(timeout=40)
        # SIGHUP and SIGTERM: the chat leaves as after Ctrl-D; SIGKILL: they follow it
        assert _until(lambda: not pid_running(worker_pid), 40), f"worker {worker_pid} runs on"
        assert _until(lambda: not pid_running(redis_pid), 20), f"redis {redis_pid} runs on"
        assert _until(lambda: processes_mentioning(str(home)) == [], 10)
        assert not (home / "redis" / "redis.sock").exists()
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig
        worker_log = json_lines((home / "logs" / "worker.log").read_text())
        assert any(r.get("event") == "worker.stopped" for r in worker_log)  # a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # and the next chat starts afresh, on the same memory
    again = chat(env, "hello again", session="ends", deadline=30)
    assert again.returncode == 0, again.stderr
    assert processes_mentioning(str(home)) == []


def test_a_chat_killed_during_a_turn_loses_nothing_and_leaves_nothing(
    tmp: Path, model_server: FakeModelServer
) -> None:
    """kill -9 of the chat while its message is at the model: the worker finishes that turn,
    records and queues its reply, stops, then stops Redis; the next chat shows the reply and
    nothing is asked twice."""
    home = tmp / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    err = tmp / "chat.stderr"
    proc = _interactive(env, err, "inflight")
    try:
        assert _until(lambda: _pids(err) is not None, 30), err.read_text()
        found = _pids(err)
        assert found is not None
        redis_pid, worker_pid = found
        assert proc.stdin is not None
        proc.stdin.write(b"[[delay:2]] remember the blue door\n")
        proc.stdin.flush()
        assert _until(lambda: model_server.calls == 1, 30)  # the turn is at the model
        proc.kill()
        proc.wait(timeout=10)
        assert _until(lambda: not pid_running(worker_pid), 40), f"worker {worker_pid} runs on"
        assert _until(lambda: not pid_running(redis_pid), 20), f"redis {redis_pid} runs on"
        assert _until(lambda: processes_mentioning(str(home)) == [], 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    worker_log = json_lines((home / "logs" / "worker.log").read_text())
    events = [r.get("event") for r in worker_log]
    assert "worker.chat_gone" in events and "worker.stopped" in events
    assert "worker.abandoning_turn" not in events  # one clean stop, the turn finished
    rows = memory_rows(home / "memory.sqlite3")
    assert [r["direction"] for r in rows] == ["in", "out"]
    assert rows[1]["text"].endswith("remember the blue door")

    again = chat(env, "and now?", session="inflight", deadline=30)
    assert again.returncode == 0, again.stderr
    assert "remember the blue door" in again.stdout  # the reply it missed, shown first
    assert again.stdout.rstrip().endswith(": and now?")
    assert model_server.calls == 2  # the first message was not asked again
    assert processes_mentioning(str(home)) == []
