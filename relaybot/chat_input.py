"""How the interactive chat reads what you type: a line, or a paste as one message.

On a terminal the chat turns on *bracketed paste* (``ESC[?2004h``): the terminal then wraps
pasted text in ``ESC[200~`` … ``ESC[201~``, so a paste of several lines is read as one message
(sent with the Enter after it) instead of one message per line. The mode is turned off again
(``ESC[?2004l``) and the terminal's settings put back when the chat ends. While it is on, the
terminal's echo of control characters as ``^[`` is off, so the markers are not shown.

Piped or redirected input is read line by line, as before: each line is a message.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import TracebackType
from typing import Any, TextIO

PASTE_ON = "\x1b[?2004h"
PASTE_OFF = "\x1b[?2004l"
START = "\x1b[200~"
END = "\x1b[201~"


def join_paste(first: str, more: list[str]) -> str:
    """The message of ``first`` and the lines read after it to complete a paste, the markers
    taken out; a paste that ended with a line break does not end the message with it."""
    text = "\n".join([first, *more])
    start, end = text.find(START), text.rfind(END)
    if start >= 0 and end > start:
        pasted = text[start + len(START) : end].rstrip("\n")
        text = text[:start] + pasted + text[end + len(END) :]
    return text.replace(START, "").replace(END, "")


class LineReader:
    """``read(prompt)``: the next message (:class:`EOFError` at the end of the input)."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.bracketed = _tty(self.stdin) and _tty(self.stdout) and os.environ.get("TERM") != "dumb"
        self._saved: list[Any] | None = None

    def __enter__(self) -> LineReader:
        if self.bracketed:
            self._quiet_controls()
            self.stdout.write(PASTE_ON)
            self.stdout.flush()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if not self.bracketed:
            return
        with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
            self.stdout.write(PASTE_OFF)
            self.stdout.flush()
        if self._saved is not None:
            import termios

            with contextlib.suppress(OSError, termios.error):
                termios.tcsetattr(self.stdin.fileno(), termios.TCSADRAIN, self._saved)

    def _quiet_controls(self) -> None:
        """ECHOCTL off: the paste markers are not echoed as ``^[[200~``."""
        try:
            import termios

            fd = self.stdin.fileno()
            self._saved = termios.tcgetattr(fd)
            quiet = termios.tcgetattr(fd)
            quiet[3] &= ~getattr(termios, "ECHOCTL", 0)
            termios.tcsetattr(fd, termios.TCSADRAIN, quiet)
        except (ImportError, OSError, ValueError):
            self._saved = None

    def read(self, prompt: str) -> str:
        first = line = input(prompt)
        if START not in first:
            return first
        more: list[str] = []
        while END not in line[line.rfind(START) + 1 :]:  # the rest of the paste, to its end
            try:
                line = input()
            except EOFError:
                break
            more.append(line)
        return join_paste(first, more)


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
