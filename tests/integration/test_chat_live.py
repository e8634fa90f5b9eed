"""The interactive chat in a real pseudo-terminal, against a Redis of its own (``REDIS_URL``):
what arrives while it waits at its prompt is shown at once, no worker is waited for, and Redis
going away is one line of the chat, not log lines, with Ctrl-D still quitting."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.keys import Keys
from contract.messages import Reply, ReplyKind
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import REPO, Procs, relaybot_env
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

PREFIX = "live:"


class Pty:
    """``relaybot chat --session NAME`` on a pseudo-terminal; ``out`` is all it wrote."""

    def __init__(self, env: dict[str, str], session: str) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "--session", session],
            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.out = bytearray()

    def until(self, needle: bytes, timeout: float = 30, start: int = 0) -> int:
        """Where ``needle`` shows (after ``start``); fails with all that was shown."""
        deadline = time.monotonic() + timeout
        while self.out.find(needle, start) < 0 and time.monotonic() < deadline:
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.out += os.read(self.master, 4096)
                except OSError:  # the chat closed the terminal
                    break
        at = self.out.find(needle, start)
        assert at >= 0, (needle, self.out.decode(errors="replace"))
        return at

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "redis").start()
    try:
        yield srv
    finally:
        srv.stop()


def _reply(session: str, text: str) -> str:
    return Reply(
        reply_id=f"r-{time.time_ns()}", answers="cli:0-1", kind=ReplyKind.REPLY, channel="cli",
        session=f"cli:{session}", conversation=f"cli:{session}", text=text, created=time.time(),
    ).to_json()  # fmt: skip


def test_a_reply_that_arrives_at_the_prompt_is_shown_at_once(
    tmp_path: Path, server: RedisServer
) -> None:
    """A reply for the session (a turn replayed after a crash) while nobody types: shown
    without waiting for the next line, and the prompt comes back under it."""
    env = relaybot_env(tmp_path / "home", redis_url=server.url, prefix=PREFIX)
    chat = Pty(env, "idle")
    try:
        chat.until(b"you> ")
        server.client().rpush(Keys(PREFIX).reply("cli:idle"), _reply("idle", "arrived unasked"))
        at = chat.until(b"arrived unasked")
        chat.until(b"you> ", start=at)  # the prompt again
        chat.type(b"\x04")
        assert chat.proc.wait(30) == 0
    finally:
        chat.close()


def test_the_chat_waits_for_a_worker_and_shows_the_reply_once_one_runs(
    tmp_path: Path, server: RedisServer, procs: Procs
) -> None:
    """No worker runs: the chat says so once and waits (it quit, exit 4, after 3 s); the
    reply comes once a worker is started."""
    with FakeModelServer() as model:
        env = relaybot_env(
            tmp_path / "home", redis_url=server.url, prefix=PREFIX, model_url=model.base_url
        )
        chat = Pty(env, "wait")
        try:
            chat.until(b"you> ")
            chat.type(b"anyone there\n")
            said = chat.until(b"no worker is running")
            procs.worker(env, r=server.client(), keys=Keys(PREFIX))
            at = chat.until(b"echo: ", timeout=60, start=said)
            chat.until(b"anyone there", start=at)
            assert chat.proc.poll() is None
            chat.until(b"you> ", start=at)
            chat.type(b"\x04")
            assert chat.proc.wait(30) == 0
            assert chat.out.count(b"no worker is running") == 1
        finally:
            chat.close()


def test_redis_gone_under_the_chat_is_one_line_and_ctrl_d_quits(
    tmp_path: Path, server: RedisServer
) -> None:
    home = tmp_path / "home"
    env = relaybot_env(home, redis_url=server.url, prefix=PREFIX)
    chat = Pty(env, "gone")
    try:
        chat.until(b"you> ")
        server.stop()
        at = chat.until(b"Redis is gone")
        chat.until(b"you> ", start=at)
        time.sleep(5)  # the heartbeat and the prompt retry meanwhile (their lines: the log)
        chat.type(b"\x04")
        assert chat.proc.wait(30) == 0, chat.out.decode(errors="replace")
        shown = chat.out.decode(errors="replace")
        assert "redis.unreachable" not in shown and "[warning" not in shown, shown
        assert shown.count("Redis is gone") == 1, shown
        assert "heartbeat.failed" in (home / "logs" / "chat.log").read_text()  # the log has them
    finally:
        chat.close()


def test_ctrl_c_and_ctrl_d_while_thinking_say_at_once_what_happens(tmp_path: Path) -> None:
    """Zero-config: Ctrl-C during a turn says at once that the turn is being finished (the
    screen stayed blank until the model answered); Ctrl-D during a turn says the chat ends once
    the reply is shown, and it does."""
    with FakeModelServer() as model:
        env = relaybot_env(tmp_path / "home", model_url=model.base_url)
        chat = Pty(env, "ctrl")
        try:
            chat.until(b"you> ")
            chat.type(b"first [[delay:3]]\n")
            at = chat.until(b"thinking")
            chat.type(b"\x04")
            told = chat.until(b"the chat ends once this reply is shown", start=at)
            assert b"echo: " not in chat.out[:told]
            chat.until(b"echo: ", start=told)
            assert chat.proc.wait(30) == 0
        finally:
            chat.close()
        chat = Pty(env, "ctrl")
        try:
            chat.until(b"you> ")
            chat.type(b"second [[delay:4]]\n")
            at = chat.until(b"thinking")
            chat.proc.send_signal(signal.SIGINT)
            told = chat.until(b"finishing your turn", start=at)
            assert b"echo: " not in chat.out[at:told]
            chat.until(b"--session ctrl", start=told)
            assert chat.proc.wait(30) == 130
        finally:
            chat.close()
