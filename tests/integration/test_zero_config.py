"""Zero-config runs: ``relaybot chat`` with no Redis configured starts, and stops, what it needs.

Every relaybot process here is a real subprocess; the embedded Redis is relaybot's own
redis-server on a unix socket under RELAYBOT_HOME.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    chat,
    files_under,
    json_lines,
    memory_rows,
    pid_running,
    processes_mentioning,
    relaybot_env,
    run_relaybot,
    short_tmpdir,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def tmp() -> Iterator[Path]:
    with short_tmpdir() as path:
        yield path


def _event(records: list[dict], event: str) -> dict:
    hits = [r for r in records if r.get("event") == event]
    assert hits, f"no {event!r} in {records}"
    return hits[0]


def test_zero_config_chat_runs_everything_itself_and_keeps_to_its_home(tmp: Path) -> None:
    home, user_home, cwd, tmpdir = tmp / "home", tmp / "user", tmp / "cwd", tmp / "tmp"
    for d in (user_home, cwd, tmpdir):
        d.mkdir()
    env = relaybot_env(home, user_home=user_home, TMPDIR=str(tmpdir))
    assert "REDIS_URL" not in env
    assert "OPENAI_BASE_URL" not in env

    # -v: the chat logs (to stderr) the pids of the Redis and the worker it starts
    first = chat(env, "hi", session="zc", verbose=True, cwd=cwd, deadline=30)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("No model is configured, so I cannot answer yet.\n")
    assert "OPENAI_BASE_URL" in first.stdout  # it says how to configure one
    assert "\x1b" not in first.stdout  # plain text: no terminal control sequences
    assert not first.stdout.startswith("!")  # not shown as an error

    records = json_lines(first.stderr)
    assert all("_raw" not in r for r in records), first.stderr
    worker_pid = int(_event(records, "runtime.worker_started")["pid"])
    # the zero-config worker runs the embedded Redis (relaybot/zeroconf.py)
    worker_records = json_lines((home / "logs" / "worker.log").read_text())
    redis_pid = int(_event(worker_records, "redis.embedded_started")["pid"])
    assert _event(worker_records, "redis.embedded_started")["dir"] == str(home / "redis")

    # both were stopped when the chat ended
    assert not pid_running(redis_pid)
    assert not pid_running(worker_pid)
    assert not (home / "redis" / "redis.sock").exists()
    assert processes_mentioning(str(home)) == []
    worker_log = json_lines((home / "logs" / "worker.log").read_text())
    assert _event(worker_log, "worker.lease_acquired")
    assert _event(worker_log, "worker.stopped")["processed"] == 1
    assert {r.get("process") for r in worker_log} == {"worker"}
    assert _event(worker_log, "redis.embedded_stopped")  # after the worker stopped

    # the embedded Redis persisted the stream in an append-only file under RELAYBOT_HOME/redis
    aof = [p for p in (home / "redis").iterdir() if p.name.startswith("appendonly")]
    assert aof, files_under(home)
    assert any(b"relaybot:inbound" in p.read_bytes() for p in aof if p.is_file())

    # a second chat in the same session: starts both again, same memory
    second = chat(env, "again", session="zc", cwd=cwd, deadline=30)
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("No model is configured")
    assert second.stderr == ""  # nothing but the reply when all goes well
    assert processes_mentioning(str(home)) == []
    assert not (home / "redis" / "redis.sock").exists()

    rows = memory_rows(home / "memory.sqlite3")
    assert [r["direction"] for r in rows] == ["in", "out", "in", "out"]
    assert {r["channel"] for r in rows} == {"cli"}
    assert {r["session"] for r in rows} == {"cli:zc"}
    assert {r["conversation"] for r in rows} == {"cli:zc"}
    assert {r["privacy"] for r in rows} == {"owner"}
    inbound = [r for r in rows if r["direction"] == "in"]
    outbound = [r for r in rows if r["direction"] == "out"]
    assert [r["text"] for r in inbound] == ["hi", "again"]
    assert all(r["is_owner"] == 1 and r["entity"] == "owner" for r in inbound)
    assert all(r["text"].startswith("No model is configured") for r in outbound)
    assert [r["stream_id"] for r in outbound] == [r["stream_id"] for r in inbound]

    # everything written is under RELAYBOT_HOME
    assert files_under(user_home) == []
    assert files_under(cwd) == []
    assert files_under(tmpdir) == []
    assert sorted(p.name for p in tmp.iterdir()) == ["cwd", "home", "tmp", "user"]
    top = {p.split("/")[0] for p in files_under(home)}
    assert top <= {"redis", "logs", "memory.sqlite3", "memory.sqlite3-wal", "memory.sqlite3-shm"}


def test_zero_config_with_the_fake_model_remembers_across_chats(
    tmp: Path, model_server: FakeModelServer
) -> None:
    env = relaybot_env(tmp / "home", model_url=model_server.base_url)

    first = chat(env, "my name is Ada", session="m")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("echo: [cli / owner] ")
    assert first.stdout.endswith(": my name is Ada\n")

    second = chat(env, "what is my name?", session="m")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("echo: [cli / owner] ")
    assert second.stdout.endswith(": what is my name?\n")
    assert "my name is Ada" not in second.stdout  # only the new reply: nothing was left queued

    assert model_server.calls == 2
    assert model_server.requests[0]["model"] == "fake-model"
    messages = model_server.requests[1]["messages"]
    system, user = messages[0], messages[-1]
    assert system["role"] == "system"
    assert user["role"] == "user"
    assert user["content"].startswith("[cli / owner] ")
    assert user["content"].endswith(": what is my name?")
    history = system["content"].splitlines()
    earlier = [line for line in history if line.startswith("[cli / owner] ")]
    assert len(earlier) == 1
    assert earlier[0].endswith(": my name is Ada")
    answered = [line for line in history if line.startswith("[cli / relaybot] ")]
    assert len(answered) == 1
    assert "echo: " in answered[0]
    assert history.index(earlier[0]) < history.index(answered[0])


def test_chat_attaches_to_an_embedded_redis_and_worker_it_did_not_start(
    tmp: Path, model_server: FakeModelServer
) -> None:
    """With ``relaybot redis`` and ``relaybot worker`` running (the Procfile), chat uses both and
    stops neither."""
    import redis as redis_py

    from contract.config import load_config
    from tests.support.procs import Procs, lease_holder, wait_until

    home = tmp / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    cfg = load_config(env=env)
    with Procs(tmp / "proclogs") as procs:
        server = procs.start("redis", ["redis"], env)
        sock = home / "redis" / "redis.sock"
        wait_until(sock.exists, message=f"{sock}")
        r = redis_py.Redis(unix_socket_path=str(sock))
        wait_until(lambda: _ping(r), message="the embedded Redis to answer")
        worker = procs.worker(env, r=r, keys=cfg.keys)
        holder = lease_holder(r, cfg.keys)

        result = chat(env, "attached", session="p")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("echo: ")
        assert result.stdout.endswith(": attached\n")

        assert worker.returncode is None
        assert server.returncode is None
        assert lease_holder(r, cfg.keys) == holder
        assert not (home / "logs" / "worker.log").exists()  # chat started no worker of its own
        r.close()
        assert worker.stop() == 0
        assert server.stop() == 0


def _ping(r: object) -> bool:
    import redis as redis_py

    try:
        return bool(r.ping())  # type: ignore[attr-defined]
    except redis_py.RedisError:
        return False


@pytest.mark.parametrize(
    ("config", "env_extra", "named"),
    [
        ("[model]\ntimeout = -1\n", {}, "model.timeout"),
        ("[worker]\nbogus = 1\n", {}, "unknown key 'bogus' in [worker]"),
        ("[delivery]\nmax_age = 'soon'\n", {}, "delivery.max_age"),
        ("[redis]\nprefix = 'relaybot:'\n", {"RELAYBOT_MODEL_RETRIES": "many"}, "model.retries"),
        ("[model\nbase_url = 1\n", {}, "not valid TOML"),
    ],
)
def test_bad_config_makes_status_exit_2_naming_the_key(
    tmp: Path, config: str, env_extra: dict[str, str], named: str
) -> None:
    home = tmp / "home"
    write_config(home, config)
    env = relaybot_env(home, **env_extra)
    result = run_relaybot(["status"], env, timeout=20)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("relaybot: configuration error: ")
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    for var in env_extra:
        assert var in result.stderr  # a bad value from the environment names its variable
    assert not (home / "redis").exists()  # nothing was started


def test_a_zero_config_chat_starts_its_worker_as_soon_as_it_can(tmp: Path) -> None:
    """Before its own imports and configuration (relaybot/prestart.py): the worker's start is
    most of a cold chat's wait, and the two processes start side by side."""
    env = relaybot_env(tmp / "home", user_home=tmp / "user")
    done = chat(env, "hi", session="early", verbose=True, deadline=30)
    assert done.returncode == 0, done.stderr
    (started,) = [r for r in json_lines(done.stderr) if r.get("event") == "runtime.worker_started"]
    assert started.get("early") is True, started
    assert processes_mentioning(str(tmp / "home")) == []  # and it stopped with the chat


def test_a_reminder_set_in_a_zero_config_chat_fires_in_it(tmp: Path) -> None:
    """Zero-config runs no jobs process until rq has work for one: a reminder set while a chat is
    open is fired by the jobs process its worker then starts (relaybot/zeroconf_jobs.py), shown
    in the chat, and that jobs process stops with the worker (real seconds: nothing shifted)."""
    home = tmp / "home"
    env = relaybot_env(home)  # no model: the text is delivered as written, marked
    chat_proc = subprocess.Popen(
        [sys.executable, "-m", "relaybot", "chat", "--session", "zr"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp,
    )  # fmt: skip
    try:
        assert chat_proc.stdin is not None and chat_proc.stdout is not None
        chat_proc.stdin.write("hi\n")
        chat_proc.stdin.flush()
        _read_until(chat_proc.stdout, "No model is configured", 30)
        assert not (home / "logs" / "jobs.log").exists()  # no work yet: no jobs process
        added = run_relaybot(
            ["reminders", "add", "--in", "2s", "--session", "zr", "stretch your legs"], env
        )
        assert added.returncode == 0, added.stderr
        assert "reminder #1 set" in added.stdout
        deadline = time.monotonic() + 30
        while not _fired(home) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _fired(home)
        # a chat on a pipe shows what came meanwhile when it next reads a line (on a terminal,
        # at once: tests/integration/test_chat_live.py)
        chat_proc.stdin.write("ok\n")
        chat_proc.stdin.flush()
        shown = _read_until(chat_proc.stdout, "(delivered as written", 30)
        assert "⏰ Reminder: stretch your legs" in shown
        chat_proc.stdin.close()
        assert chat_proc.wait(30) == 0
    finally:
        if chat_proc.poll() is None:
            chat_proc.kill()
            chat_proc.wait()
    worker_log = json_lines((home / "logs" / "worker.log").read_text())
    assert _event(worker_log, "jobs.started_for_zero_config")
    deadline = time.monotonic() + 15
    while processes_mentioning(str(home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(home)) == []  # the jobs process stopped with the worker


def _fired(home: Path) -> bool:
    path = home / "logs" / "jobs.log"
    return path.exists() and any(
        r.get("event") == "schedule.fired" for r in json_lines(path.read_text())
    )


def _read_until(stream: IO[str], needle: str, seconds: float) -> str:
    """What ``stream`` says until a line holds ``needle`` (a reader thread: no blocking read
    past the deadline)."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in stream:
            seen.append(line)
            if needle in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(seconds), f"{needle!r} not seen in {''.join(seen)!r}"
    return "".join(seen)
