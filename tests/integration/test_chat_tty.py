"""The interactive chat in a real pseudo-terminal: prompt, thinking indicator, reply, Ctrl-D."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fakemodel import FakeModelServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def read_until(fd: int, needle: bytes, timeout: float, buf: bytearray) -> bool:
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                buf += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    return needle in buf


def test_interactive_chat_shows_thinking_then_the_reply(home: Path) -> None:
    with FakeModelServer() as model:
        env = dict(
            os.environ,
            RELAYBOT_HOME=str(home),
            OPENAI_BASE_URL=model.base_url,
            RELAYBOT_MODEL="fake-model",
        )
        master, slave = os.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "--session", "tty"],
            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        out = bytearray()
        try:
            assert read_until(master, b"you> ", 30, out), out.decode(errors="replace")
            assert b"session tty" in out
            os.write(master, b"slow one [[delay:1.5]]\n")
            assert read_until(master, b"echo: ", 30, out), out.decode(errors="replace")
            before_reply = out[: out.index(b"echo: ")]
            assert b"thinking\xe2\x80\xa6" in before_reply  # the indicator ran while it worked
            assert read_until(master, b"you> ", 10, out)
            os.write(master, b"\x04")  # Ctrl-D ends the chat
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
    assert not (home / "redis" / "redis.sock").exists()  # what it started, it stopped


def test_a_reply_on_the_terminal_shows_escape_sequences_and_link_targets(home: Path) -> None:
    """A reply quoting what a remote sender wrote (here: echoed back) cannot clear the screen,
    retitle the window or write the clipboard, and a link shows where it leads."""
    hostile = "x\x1b[2J\x1b]0;EVIL\x07\x1b]52;c;ZXZpbA==\x07\x9b31m see [your bank](https://evil.example/login)"
    with FakeModelServer() as model:
        env = dict(
            os.environ,
            RELAYBOT_HOME=str(home),
            OPENAI_BASE_URL=model.base_url,
            RELAYBOT_MODEL="fake-model",
        )
        master, slave = os.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "--session", "tty", "-m", hostile],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        out = bytearray()
        try:
            read_until(master, b"\x00never", 60, out)  # everything, until the chat closes it
            assert proc.wait(30) == 0, out.decode(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
    shown = out.decode(errors="replace")
    for bad in ("\x1b[2J", "\x1b]0;", "\x1b]52;", "\x07", "\x9b", "\x1b]8;"):
        assert bad not in shown, (bad, shown)
    shown = re.sub(r"\x1b\[[0-9;]*[mK]", "", shown)  # rich's styling, the spinner's erase
    assert "echo: " in shown
    assert "\\x1b]0;EVIL\\x07" in shown
    assert "https://evil.example/login" in shown
