"""End to end: under ``honcho start``, a Redis restart stops nothing (issue 11, item 8).

The repository's Procfile runs in an app directory with the embedded Redis (the ``redis`` line,
``relaybot redis``, which runs redis-server as its child). A chat message is answered; then the
redis-server process is killed with SIGKILL. The ``redis`` line starts it again (from its
append-only file), every other process reconnects, and the next message is answered. Every
process honcho started is still the same one, running; the logs show the restart and the
reconnects; SIGTERM then stops everything cleanly.
"""

from __future__ import annotations

import os
import re
import signal

import psutil
import pytest

from memory.store import MemoryStore
from tests.e2e.test_procfile import STAMP, App, stop_and_check
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import wait_until

pytestmark = pytest.mark.e2e

LINES = ("redis", "worker", "jobs", "gateway matrix", "gateway email")


@pytest.fixture
def model():
    with FakeModelServer() as server:
        yield server


def relaybot_processes(app: App) -> dict[str, int]:
    """The pid of each Procfile line's relaybot process."""
    found: dict[str, int] = {}
    for proc in app.processes():
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:  # gone since it was listed (the redis-server just killed)
            continue
        for line in LINES:
            if re.search(rf"relaybot {line}$", cmdline):
                found[line] = proc.pid
    return found


def redis_server(app: App) -> psutil.Process | None:
    for proc in app.processes():
        try:
            if proc.name().startswith("redis-server"):
                return proc
        except psutil.Error:  # gone since it was listed (the one just killed)
            continue
    return None


def test_a_redis_restart_under_honcho_stops_nothing(tmp_path, model):
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
        app.wait_for_heartbeats(("worker", "jobs", "gateway:matrix", "gateway:email"))
        first = app.relaybot("chat", "-m", "before the restart", "--session", "rr")
        assert first.returncode == 0, first.stderr
        assert re.fullmatch(rf"echo: \[cli / owner\] {STAMP}: before the restart\n", first.stdout)
        before = relaybot_processes(app)
        assert set(LINES) - {"redis"} <= set(before), (before, app.log())

        server = redis_server(app)
        assert server is not None, app.log()
        os.kill(server.pid, signal.SIGKILL)

        def restarted() -> bool:
            again = redis_server(app)
            return again is not None and again.pid != server.pid

        wait_until(restarted, timeout=30, message=lambda: f"a new redis-server:\n{app.log()}")
        wait_until(
            lambda: re.search(
                r"^\S+ worker\.1 +\| \[\w+\s*\] redis\.reconnected\b", app.log(), re.M
            ),
            timeout=60,
            message=lambda: f"the worker to reconnect:\n{app.log()}",
        )
        app.wait_for_heartbeats(("worker", "jobs", "gateway:matrix", "gateway:email"))

        second = app.relaybot("chat", "-m", "after the restart", "--session", "rr")
        assert second.returncode == 0, second.stderr
        assert re.fullmatch(rf"echo: \[cli / owner\] {STAMP}: after the restart\n", second.stdout)

        # the same processes, all still running; honcho stopped nothing
        assert relaybot_processes(app) == before
        assert app.honcho is not None and app.honcho.poll() is None
        log = app.log()
        assert " stopped (rc=" not in log, log
        assert re.search(r"^\S+ redis\.1 +\| \[\w+\s*\] redis\.embedded_died\b", log, re.M), log
        assert re.search(r"^\S+ worker\.1 +\| \[\w+\s*\] redis\.unreachable\b", log, re.M), log
        assert model.calls == 2

        stop_and_check(app)
    finally:
        app.stop()
    assert "Redis is now ready to exit" in app.log(), app.log()  # a clean shutdown at the end
    with MemoryStore(home / "memory.sqlite3", readonly=True) as store:
        rows = list(reversed(store.recent(10)))
    assert [r.text for r in rows if r.inbound] == ["before the restart", "after the restart"]
    assert len(rows) == 4
