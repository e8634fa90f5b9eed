"""A multi-line paste in the interactive chat is one message (issue 26): on a terminal the chat
turns on bracketed paste, and what the terminal wraps in ESC[200~ … ESC[201~ is sent as one
message with the Enter after it, not one message per line. Driven through a real pty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_chat_tty import ROOT, read_until
from tests.support.fakemodel import FakeModelServer

pytestmark = pytest.mark.integration


def test_a_multi_line_paste_is_one_message(home: Path) -> None:
    with FakeModelServer() as model:
        env = dict(
            os.environ, RELAYBOT_HOME=str(home), OPENAI_BASE_URL=model.base_url,
            RELAYBOT_MODEL="fake-model",
        )  # fmt: skip
        master, slave = os.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "--session", "paste"],
            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        out = bytearray()
        try:
            assert read_until(master, b"you> ", 30, out), out.decode(errors="replace")
            assert b"\x1b[?2004h" in out  # bracketed paste asked of the terminal
            # what a terminal sends for a pasted block of three lines (its line breaks as CR),
            # then the Enter that sends it
            os.write(master, b"\x1b[200~first line\rsecond line\r/not a command\x1b[201~\r")
            assert read_until(master, b"echo: ", 30, out), out.decode(errors="replace")
            del out[: out.index(b"echo: ")]
            assert read_until(master, b"you> ", 10, out), out.decode(errors="replace")
            os.write(master, b"and a typed line\r")
            assert read_until(master, b"typed line", 30, out), out.decode(errors="replace")
            assert read_until(master, b"you> ", 10, out), out.decode(errors="replace")
            os.write(master, b"\x04")  # Ctrl-D ends the chat
            assert proc.wait(30) == 0
            read_until(master, b"\x00never", 2, out)
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        asked = [
            str(request["messages"][-1]["content"]).split(": ", 1)[1] for request in model.requests
        ]
    assert asked == ["first line\n  second line\n  /not a command", "and a typed line"]
    assert b"\x1b[?2004l" in out  # and turned off again
    assert b"^[[20" not in out  # the markers were not echoed as text


def _chat(home: Path, model: FakeModelServer, session: str) -> tuple[subprocess.Popen[bytes], int]:
    env = dict(
        os.environ, RELAYBOT_HOME=str(home), OPENAI_BASE_URL=model.base_url,
        RELAYBOT_MODEL="fake-model",
    )  # fmt: skip
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybot", "chat", "--session", session],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    return proc, master


def _say(master: int, data: bytes, out: bytearray) -> None:
    """Send ``data`` (ending with an Enter) and wait for its reply and the next prompt."""
    del out[:]
    os.write(master, data)
    assert read_until(master, b"echo: ", 30, out), out.decode(errors="replace")
    assert read_until(master, b"you> ", 10, out), out.decode(errors="replace")


def test_pasted_text_is_never_a_command_and_keeps_its_own_line_breaks(home: Path) -> None:
    """A pasted ``/new`` (one line) is a message, not a new session; a pasted ``//x`` is sent as
    it is; CR LF and a lone CR in a paste are one line break each, CR CR a blank line."""
    with FakeModelServer() as model:
        proc, master = _chat(home, model, "pasted")
        out = bytearray()
        try:
            assert read_until(master, b"you> ", 30, out), out.decode(errors="replace")
            _say(master, b"\x1b[200~/new\x1b[201~\r", out)
            _say(master, b"\x1b[200~//x\x1b[201~\r", out)
            _say(master, b"\x1b[200~a\r\nb\x1b[201~\r", out)
            _say(master, b"\x1b[200~c\rd\r\re\x1b[201~\r", out)
            _say(master, b"\x1b[200~f\ng\x1b[201~\r", out)
            _say(master, b"typed with a line feed\n", out)  # Ctrl-J still sends a line
            del out[:]
            os.write(master, b"/new\r")  # typed, it is the command
            assert read_until(master, b"type a message", 30, out), out.decode(errors="replace")
            assert read_until(master, b"you> ", 10, out), out.decode(errors="replace")
            os.write(master, b"\x04")
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
        asked = [
            str(request["messages"][-1]["content"]).split(": ", 1)[1] for request in model.requests
        ]
    assert asked == [
        "/new",
        "//x",
        "a\n  b",
        "c\n  d\n  \n  e",  # (the fake indents every line it quotes)
        "f\n  g",
        "typed with a line feed",
    ]
