"""An interactive zero-config ``relaybot chat`` that ends any way at all -- the terminal closed
(SIGHUP), a stop asked (SIGTERM), killed (SIGKILL) -- leaves no embedded Redis and no worker of
its own running (they ran on, unseen, after a closed terminal or a kill -9)."""

from __future__ import annotations

import contextlib
import os
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
    """The embedded Redis's pid (the zero-config worker starts it) and the worker's."""
    records = json_lines(log.read_text(errors="replace"))
    worker = [r["pid"] for r in records if r.get("event") == "runtime.worker_started"]
    worker_log = log.parent / "home" / "logs" / "worker.log"
    if not worker or not worker_log.exists():
        return None
    started = json_lines(worker_log.read_text(errors="replace"))
    redis = [r["pid"] for r in started if r.get("event") == "redis.embedded_started"]
    return (int(redis[0]), int(worker[0])) if redis else None


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
    assert "worker.no_chat_left" in events and "worker.stopped" in events
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


def _left_nothing(home: Path, timeout: float = 40) -> None:
    assert _until(lambda: processes_mentioning(str(home)) == [], timeout), processes_mentioning(
        str(home)
    )
    assert not (home / "redis" / "redis.sock").exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("after", [0.15, 0.45, 0.8])
def test_a_chat_that_ends_while_it_starts_leaves_nothing(
    tmp: Path, sig: signal.Signals, after: float
) -> None:
    """Adversary round 3: ended while the worker or the Redis was still starting, the chat left
    them running for good."""
    home = tmp / "home"
    proc = _interactive(relaybot_env(home), tmp / "chat.stderr", "early")
    try:
        time.sleep(after)
        proc.send_signal(sig)
        proc.wait(timeout=40)
        _left_nothing(home)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_chat_opened_while_the_killed_chats_worker_stops_is_answered(
    tmp: Path, model_server: FakeModelServer
) -> None:
    """Adversary round 3: a chat resumed right after a kill -9 attached to the worker that was
    finishing the killed chat's turn; that worker then shut its Redis down under it."""
    home = tmp / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    proc = _interactive(env, tmp / "chat.stderr", "resume")
    try:
        assert _until(lambda: _pids(tmp / "chat.stderr") is not None, 30)
        assert proc.stdin is not None
        proc.stdin.write(b"[[delay:3]] the first one\n")
        proc.stdin.flush()
        assert _until(lambda: model_server.calls == 1, 30)
        proc.kill()
        proc.wait(timeout=10)
        again = chat(env, "the second one", session="resume", deadline=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert again.returncode == 0, again.stderr
    assert "the first one" in again.stdout  # the reply it missed
    assert again.stdout.rstrip().endswith(": the second one")
    assert model_server.calls == 2  # nothing asked twice
    _left_nothing(home)


def test_two_chats_the_first_killed_the_second_goes_on(
    tmp: Path, model_server: FakeModelServer
) -> None:
    """The chat that started the worker is killed: the one that attached is still answered,
    and when it ends, everything stops."""
    home = tmp / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    first = _interactive(env, tmp / "chat.stderr", "one")
    second = None
    try:
        assert _until(lambda: _pids(tmp / "chat.stderr") is not None, 30)
        found = _pids(tmp / "chat.stderr")
        assert found is not None
        second = _interactive(env, tmp / "second.stderr", "two")
        time.sleep(2)  # the second has attached (registered)
        first.kill()
        first.wait(timeout=10)
        time.sleep(2)  # longer than the worker takes to look
        assert pid_running(found[1]), "the worker stopped though a chat still uses it"
        assert second.stdin is not None
        second.stdin.write(b"still there?\n")
        second.stdin.flush()
        assert _until(lambda: model_server.calls == 1, 30)
        assert _until(lambda: len(memory_rows(home / "memory.sqlite3")) == 2, 30)
        second.stdin.close()  # Ctrl-D
        assert second.wait(timeout=40) == 0
        _left_nothing(home)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_the_worker_killed_first_then_the_chat_leaves_nothing(tmp: Path) -> None:
    """Adversary round 3: worker kill -9 (the OOM killer), then chat kill -9: Redis ran on."""
    home = tmp / "home"
    proc = _interactive(relaybot_env(home), tmp / "chat.stderr", "oom")
    try:
        assert _until(lambda: _pids(tmp / "chat.stderr") is not None, 30)
        found = _pids(tmp / "chat.stderr")
        assert found is not None
        os.kill(found[1], signal.SIGKILL)
        time.sleep(0.5)
        proc.kill()
        proc.wait(timeout=10)
        _left_nothing(home)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_chats_opened_at_once_share_one_redis(tmp: Path) -> None:
    """Two chats opened together on a fresh home: each starts a worker, and one embedded Redis
    runs (a lock file: two servers on one socket and one append-only file would clash)."""
    home = tmp / "home"
    env = relaybot_env(home)
    argv = [sys.executable, "-m", "relaybot", "chat", "-m"]
    procs = [
        subprocess.Popen(
            [*argv, f"hello {n}", "--session", f"s{n}"],
            env=dict(env),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(2)
    ]
    started_at = time.monotonic()
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # neither waited out its worker (30 s): the second worker stopped, then the Redis's
    assert time.monotonic() - started_at < 20
    assert all(out.startswith(b"No model is configured") for out, _ in outs)
    started = [
        r
        for r in json_lines((home / "logs" / "worker.log").read_text())
        if r.get("event") == "redis.embedded_started"
    ]
    assert len(started) == 1, started
    _left_nothing(home)
    rows = memory_rows(home / "memory.sqlite3")
    assert sorted(r["text"] for r in rows if r["direction"] == "in") == ["hello 0", "hello 1"]


def test_a_chat_whose_worker_died_says_so_at_once(tmp: Path) -> None:
    """Adversary round 4: the worker killed (its Redis goes with it), the chat's next line
    waited out the whole timeout, then Ctrl-D hung."""
    home = tmp / "home"
    proc = _interactive(relaybot_env(home), tmp / "chat.stderr", "died")
    try:
        assert _until(lambda: _pids(tmp / "chat.stderr") is not None, 30)
        found = _pids(tmp / "chat.stderr")
        assert found is not None
        time.sleep(1)
        os.kill(found[1], signal.SIGKILL)
        assert _until(lambda: not pid_running(found[0]), 10)  # its Redis went with it
        assert proc.stdin is not None
        proc.stdin.write(b"anyone there?\n")
        proc.stdin.flush()
        assert proc.wait(timeout=20) == 1
        said = (tmp / "chat.stderr").read_text()
        assert "the worker exited with code -9" in said and "not sent" in said
        _left_nothing(home)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_redis_worker_stalled_past_its_lease_keeps_its_redis_for_open_chats(
    tmp: Path, model_server: FakeModelServer
) -> None:
    """Adversary round 4 (F4a): the worker running Redis stalls past its lease (SIGSTOP 12 s);
    a chat opened meanwhile starts a second worker, which takes over. On waking the first lost
    its lease, stopped, and shut its Redis down under the open chats."""
    home = tmp / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    first = _interactive(env, tmp / "c0.stderr", "c0")
    second, owner = None, -1
    try:
        assert _until(lambda: _pids(tmp / "c0.stderr") is not None, 30)
        found = _pids(tmp / "c0.stderr")
        assert found is not None
        redis_pid, owner = found
        worker_log = home / "logs" / "worker.log"
        assert _until(lambda: b"worker.lease_acquired" in worker_log.read_bytes(), 30)
        os.kill(owner, signal.SIGSTOP)
        time.sleep(11)  # past the 10 s lease
        second = _interactive(env, tmp / "c1.stderr", "c1")  # starts a worker: none holds it
        assert _until(lambda: worker_log.read_bytes().count(b"worker.lease_acquired") == 2, 30)
        os.kill(owner, signal.SIGCONT)
        assert _until(lambda: b"worker.lease_lost_standing_by" in worker_log.read_bytes(), 20)
        assert pid_running(redis_pid) and pid_running(owner)
        for n, chat_proc in enumerate((first, second)):
            assert chat_proc.stdin is not None
            chat_proc.stdin.write(f"after the stall {n}\n".encode())
            chat_proc.stdin.flush()

        def answered() -> int:
            rows = memory_rows(home / "memory.sqlite3")
            return sum("after the stall" in r["text"] for r in rows)

        assert _until(lambda: answered() == 4, 40)
        for chat_proc in (first, second):
            assert chat_proc.stdin is not None
            chat_proc.stdin.close()
        for chat_proc in (first, second):
            assert chat_proc.wait(timeout=40) == 0
        _left_nothing(home)
    finally:
        if owner > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(owner, signal.SIGCONT)
        for chat_proc in (first, second):
            if chat_proc is not None and chat_proc.poll() is None:
                chat_proc.kill()
                chat_proc.wait()
