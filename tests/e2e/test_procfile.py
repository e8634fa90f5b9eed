"""End to end, the way a user runs it: ``honcho start`` on the repository's Procfile.

An app directory holds only a ``.env`` (RELAYBOT_HOME and the model: a fake OpenAI-compatible
server run by the test). ``honcho start -f <repo>/Procfile -d <app>`` runs in its own process group
and starts the ``redis``, ``worker`` and ``jobs`` lines. The test waits for the heartbeats through
``relaybot status --json``, chats with ``relaybot chat -m ... --session e2e`` (real subprocesses),
checks the replies, what the model was given, the status and the stored history, then stops honcho
with SIGTERM and checks that every process it started has ended.

Two variants: with no REDIS_URL (the ``redis`` line runs the embedded Redis, whose append-only file
must be left under RELAYBOT_HOME/redis) and with REDIS_URL pointing at a test Redis (the ``redis``
line stays up doing nothing, and no embedded Redis is started).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from memory.store import MemoryStore
from tests.support.fakemodel import FakeModelServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"


@pytest.fixture
def model():
    with FakeModelServer() as server:
        yield server


def base_env() -> dict[str, str]:
    """The user's shell: relaybot and honcho on PATH, none of the developer's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAYBOT_", "OPENAI_")) and k != "REDIS_URL"
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TZ"] = "UTC"  # the times the model sees are in the system's zone: STAMP is UTC
    return env


class App:
    """An app directory with a .env, and honcho running the repository's Procfile in it."""

    def __init__(self, root: Path, dotenv: dict[str, str]) -> None:
        self.dir = root / "app"
        self.dir.mkdir()
        self.home = Path(dotenv["RELAYBOT_HOME"])
        self.dotenv = dotenv
        (self.dir / ".env").write_text(
            "".join(f"{k}={v}\n" for k, v in dotenv.items()), encoding="utf-8"
        )
        self.output = root / "honcho.out"
        self.honcho: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What the user's own shell has for ``relaybot`` commands: the same settings."""
        return {**base_env(), **self.dotenv}

    def start(self) -> None:
        with self.output.open("wb") as out:
            self.honcho = subprocess.Popen(
                [str(BIN / "honcho"), "start", "-f", str(REPO / "Procfile"), "-d", str(self.dir)],
                cwd=self.dir,
                env=base_env(),  # the settings come from .env, as for a user
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped with killpg
            )

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def relaybot(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "relaybot"), *args],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def status(self) -> dict[str, Any] | None:
        done = self.relaybot("status", "--json", timeout=30)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)

    def wait_for_heartbeats(self, names: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            assert self.honcho is not None
            assert self.honcho.poll() is None, f"honcho exited:\n{self.log()}"
            status = self.status()
            if status is not None and all(
                n in status["heartbeats"] and not status["heartbeats"][n]["stale"] for n in names
            ):
                return status
            time.sleep(0.2)
        raise AssertionError(f"no heartbeats {names} within {timeout} s: {status}\n{self.log()}")

    def processes(self) -> list[psutil.Process]:
        assert self.honcho is not None
        return psutil.Process(self.honcho.pid).children(recursive=True)

    def stop(self) -> None:
        """SIGTERM to honcho's process group, as Ctrl-C in its terminal would do (SIGINT)."""
        if self.honcho is None or self.honcho.poll() is not None:
            return
        os.killpg(self.honcho.pid, signal.SIGTERM)
        try:
            self.honcho.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.honcho.pid, signal.SIGKILL)
            self.honcho.wait()
            raise AssertionError(f"honcho did not stop on SIGTERM:\n{self.log()}") from None


def user_session(app: App, model: FakeModelServer) -> None:
    """What a user does once ``honcho start`` runs; asserts on everything they could see."""
    status = app.wait_for_heartbeats(("worker", "jobs"))
    assert status["worker_lease"] is not None

    first = app.relaybot("chat", "-m", "remember the blue door", "--session", "e2e")
    assert first.returncode == 0, first.stderr
    assert re.fullmatch(rf"echo: \[cli / owner\] {STAMP}: remember the blue door\n", first.stdout)

    second = app.relaybot("chat", "-m", "which door?", "--session", "e2e")
    assert second.returncode == 0, second.stderr
    assert re.fullmatch(rf"echo: \[cli / owner\] {STAMP}: which door\?\n", second.stdout)

    # the second turn's model input holds the first exchange, labelled
    assert model.calls == 2
    system, user = model.requests[-1]["messages"]
    assert re.search(rf"^\[cli / owner\] {STAMP}: remember the blue door$", system["content"], re.M)
    assert re.search(
        rf"^\[cli / relaybot\] {STAMP}: echo: \[cli / owner\] {STAMP}: remember the blue door$",
        system["content"],
        re.M,
    )
    assert re.fullmatch(rf"\[cli / owner\] {STAMP}: which door\?", user["content"])

    status = app.status()
    assert status is not None
    for name in ("worker", "jobs"):
        beat = status["heartbeats"][name]
        assert not beat["stale"] and psutil.pid_exists(beat["pid"]), beat
    assert status["group"]["pending"] == 0
    assert status["dead_letters"] == 0
    assert status["stream"]["length"] == 2
    assert status["reply_queues"].get("cli:e2e", 0) == 0  # delivered
    assert not any(status["in_flight"].values())

    # the idle jobs process said nothing alarming (it logged a Redis error every 10 s)
    assert not re.search(r"^\S+ jobs\.1 +\| \[(error|warning)", app.log(), re.M)

    with MemoryStore(app.home / "memory.sqlite3", readonly=True) as store:
        rows = list(reversed(store.recent(10)))
    assert [(r.direction, r.text) for r in rows] == [
        ("in", "remember the blue door"),
        ("out", first.stdout.removesuffix("\n")),
        ("in", "which door?"),
        ("out", second.stdout.removesuffix("\n")),
    ]
    for row in rows:
        assert (row.channel, row.privacy, row.session) == ("cli", "owner", "cli:e2e")
    assert all(r.is_owner and r.entity == "owner" for r in rows if r.inbound)


def stop_and_check(app: App) -> list[psutil.Process]:
    """Stop honcho; every process it started must end. Returns those processes."""
    procs = app.processes()
    names = " ".join(" ".join(p.cmdline()) for p in procs)
    for line in ("redis", "worker", "jobs"):
        assert f"relaybot {line}" in names or (line == "redis" and "redis-server" in names)
    app.stop()
    _gone, alive = psutil.wait_procs(procs, timeout=15)
    assert not alive, f"still running after honcho stopped: {alive}"
    log = app.log()
    for line in ("redis", "worker", "jobs"):
        assert re.search(rf"^\S+ system\s+\| {line}\.1 stopped \(rc=", log, re.M), log
    # honcho reports the exit code of each line's shell; the processes' own words say more;
    # under honcho a person reads them: readable lines, not JSON (issue 13)
    assert re.search(r"^\S+ worker\.1 +\| \[info\s*\] worker\.stopped\b", log, re.M), log
    assert not re.search(r"^\S+ \w+\.1 +\| \{", log, re.M), log
    assert "Traceback" not in log, log
    return procs


def test_honcho_start_with_embedded_redis(tmp_path, model):
    home = tmp_path / "home"
    app = App(
        tmp_path,
        {
            "RELAYBOT_HOME": str(home),
            "OPENAI_BASE_URL": model.base_url,
            "RELAYBOT_MODEL": "fake-model",
        },
    )
    app.start()
    try:
        user_session(app, model)
        assert (home / "redis" / "redis.sock").is_socket()
        assert any("redis-server" in " ".join(p.cmdline()) for p in app.processes())
        stop_and_check(app)
    finally:
        app.stop()
    assert "Redis is now ready to exit" in app.log(), app.log()  # a clean shutdown
    aof = list((home / "redis").glob("appendonly*"))
    assert aof, f"no append-only file in {home / 'redis'}: {list((home / 'redis').iterdir())}"
    files = [f for a in aof for f in ([a] if a.is_file() else a.rglob("*")) if f.is_file()]
    assert any(b"relaybot:inbound" in f.read_bytes() for f in files), files  # the stream is in it
    assert not (home / "redis" / "redis.sock").exists()


def test_honcho_start_with_external_redis(tmp_path, model, redis_server, prefix, real_redis):
    home = tmp_path / "home"
    app = App(
        tmp_path,
        {
            "RELAYBOT_HOME": str(home),
            "REDIS_URL": redis_server.url,
            "RELAYBOT_REDIS_PREFIX": prefix,
            "OPENAI_BASE_URL": model.base_url,
            "RELAYBOT_MODEL": "fake-model",
        },
    )
    app.start()
    try:
        user_session(app, model)
        assert real_redis.xlen(f"{prefix}inbound:cli") == 2  # the test's Redis carried it all
        idle = [p for p in app.processes() if "relaybot redis" in " ".join(p.cmdline())]
        assert idle and all(p.is_running() for p in idle)  # the redis line is up, doing nothing
        assert not any("redis-server" in " ".join(p.cmdline()) for p in app.processes())
        assert "REDIS_URL is set; the embedded Redis is not started" in app.log()
        stop_and_check(app)
    finally:
        app.stop()
    assert not (home / "redis").exists() or not any((home / "redis").iterdir())
    # the worker and the jobs process left the shared Redis tidy: lease released, beats removed
    assert real_redis.get(f"{prefix}worker:lease") is None
    assert real_redis.hkeys(f"{prefix}heartbeats") == []
