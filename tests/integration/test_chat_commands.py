"""The interactive chat in a real pseudo-terminal (issue 13): replies rendered as Markdown with
who answered and when; ``/help``, ``/status``, ``/session NAME``, ``/new``; ``//`` sends a line
that starts with ``/``; an unknown command is said, not sent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_chat_tty import read_until
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import memory_rows

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Pty:
    def __init__(self, env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "--session", "one"],
            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.out = bytearray()
        self.mark = 0

    def say(self, line: str) -> None:
        self.mark = len(self.out)
        os.write(self.master, line.encode() + b"\n")

    def until(self, needle: str, timeout: float = 30) -> bytes:
        """What was shown since the line last typed (less the terminal's echo of it), once it
        holds ``needle`` (in plain text) and then the next prompt."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = bytes(self.out[self.mark :])
            shown = shown[shown.index(b"\n") + 1 :] if b"\n" in shown else b""
            text = self.plain(shown)
            if needle in text and "you> " in text[text.index(needle) :]:
                return shown
            read_until(self.master, b"\x00never", 0.1, self.out)
        raise AssertionError(f"no {needle!r} within {timeout} s:\n{self.plain()}")

    def plain(self, raw: bytes | None = None) -> str:
        return ANSI.sub(b"", bytes(self.out) if raw is None else raw).decode(errors="replace")


def test_chat_renders_replies_and_has_its_commands(home: Path) -> None:
    with FakeModelServer() as model:
        env = dict(
            os.environ,
            RELAYBOT_HOME=str(home),
            OPENAI_BASE_URL=model.base_url,
            RELAYBOT_MODEL="fake-model",
            USER="ada",
            TERM="xterm-256color",
        )
        chat = Pty(env)
        try:
            assert read_until(chat.master, b"you> ", 30, chat.out), chat.plain()
            assert b"session one" in chat.out and b"/help" in chat.out

            chat.say("/help")
            shown = chat.plain(chat.until("/session NAME"))
            for command in ("/new", "/status", "//text", "Ctrl-D"):
                assert command in shown

            chat.say("a **bold** claim")
            shown = chat.until("claim")
            text = chat.plain(shown)
            assert re.search(r"relaybot · \d\d:\d\d\s", text), text  # who answered, and when
            assert "a bold claim" in text and "**" not in text  # Markdown, rendered
            assert ANSI.search(shown)  # styled

            chat.say("/status")
            text = chat.plain(chat.until("model:"))
            assert "session:  one" in text
            assert re.search(r"worker: +running", text), text
            assert "fake-model at http" in text

            chat.say("/session two")
            assert "session two" in chat.plain(chat.until("session two"))
            chat.say("//slash at the start")
            assert "/slash at the start" in chat.plain(chat.until("at the start"))

            chat.say("/session not one")
            assert "cannot name a session" in chat.plain(chat.until("cannot name"))

            chat.say("/bogus")
            assert "unknown command /bogus" in chat.plain(chat.until("unknown command"))

            chat.say("/new")
            text = chat.plain(chat.until("session ada-"))
            new = re.search(r"session (ada-[0-9a-f]{6})", text)
            assert new, text
            chat.say("a fresh start")
            chat.until("fresh start")

            os.write(chat.master, b"\x04")  # Ctrl-D ends the chat
            assert chat.proc.wait(30) == 0
        finally:
            if chat.proc.poll() is None:
                chat.proc.kill()
            os.close(chat.master)
        assert model.calls == 3  # the commands never reached the model

    rows = memory_rows(
        home / "memory.sqlite3", "SELECT session, text FROM log WHERE direction = 'in' ORDER BY id"
    )
    assert [(r["session"], r["text"]) for r in rows] == [
        ("cli:one", "a **bold** claim"),
        ("cli:two", "/slash at the start"),
        (f"cli:{new.group(1)}", "a fresh start"),
    ]
