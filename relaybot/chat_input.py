"""How the interactive chat reads what you type: a line, or a paste as one message.

On a terminal the chat turns on *bracketed paste* (``ESC[?2004h``): the terminal then wraps
pasted text in ``ESC[200~`` … ``ESC[201~``, so a paste of several lines is read as one message
(sent with the Enter after it) instead of one message per line. The mode is turned off again
(``ESC[?2004l``) and the terminal's settings put back when the chat ends. While it is on, the
terminal's echo of control characters as ``^[`` is off, so the markers are not shown.

Pasted text is a message, never a ``/`` command, whatever it holds (:attr:`Said.pasted`). Its line
breaks are the pasted text's own: CR LF and a lone CR are one line break each. To tell them apart
the terminal's input mapping is set while the chat reads (CR to NL as usual for the Enter key, and
NL to CR, with CR also ending a line), and the lines are read from the terminal as they came.

Piped or redirected input is read line by line, as before: each line is a message.

On a terminal, while the chat waits at its prompt, ``idle`` (given to :meth:`LineReader.read`)
runs about every quarter second: a reply that arrives meanwhile is shown at once. Whatever it
prints first clears the prompt line (:meth:`LineReader.interrupt`); the prompt is written again
after it. What was typed but not yet sent stays in the terminal's line (Ctrl-R shows it again).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple, TextIO

PASTE_ON = "\x1b[?2004h"
PASTE_OFF = "\x1b[?2004l"
START = "\x1b[200~"
END = "\x1b[201~"


_SWAP = str.maketrans({"\n": "\r", "\r": "\n"})


class Said(NamedTuple):
    """What one read gives: the message, and whether any of it was pasted (then it is sent as it
    is: never a command)."""

    text: str
    pasted: bool


def line_breaks(text: str) -> str:
    """CR LF and a lone CR as LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def join_paste(raw: str) -> Said:
    """The message of ``raw`` (the lines read for it, with their line breaks, without the Enter
    that sent it), the markers taken out; a paste that ended with a line break does not end the
    message with it."""
    start = raw.find(START)
    if start < 0:
        return Said(raw.replace(END, ""), False)
    end = raw.rfind(END)
    end = end if end > start else len(raw)  # no end: the input ended inside the paste
    pasted = line_breaks(raw[start + len(START) : end]).rstrip("\n")
    text = raw[:start] + pasted + raw[end + len(END) :]
    return Said(text.replace(START, "").replace(END, ""), True)


class LineReader:
    """``read(prompt)``: the next message (:class:`EOFError` at the end of the input)."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.bracketed = _tty(self.stdin) and _tty(self.stdout) and os.environ.get("TERM") != "dumb"
        self._saved: list[Any] | None = None
        self._prompt = ""
        self._redraw = False  # the prompt line was cleared for something printed
        self._ahead = bytearray()  # lines typed while the chat was not reading (a turn ran)
        self.quit_asked = False  # Ctrl-D typed while the chat was not reading

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
        """ECHOCTL off: the paste markers are not echoed as ``^[[200~``. And the line breaks
        kept apart: CR (the Enter key, a pasted line break) comes as NL, NL as CR, and CR also
        ends a line (VEOL), so a pasted CR LF is NL CR, not two line breaks."""
        try:
            import termios

            fd = self.stdin.fileno()
            self._saved = termios.tcgetattr(fd)
            quiet = termios.tcgetattr(fd)
            quiet[0] = (quiet[0] | termios.ICRNL | termios.INLCR) & ~termios.IGNCR
            quiet[3] &= ~getattr(termios, "ECHOCTL", 0)
            quiet[6][termios.VEOL] = b"\r"
            termios.tcsetattr(fd, termios.TCSADRAIN, quiet)
        except (ImportError, OSError, ValueError):
            self._saved = None

    @property
    def live(self) -> bool:
        """Whether the chat can show what arrives while it waits for a line (a terminal)."""
        return self._saved is not None

    def interrupt(self) -> None:
        """Clear the prompt line for something to print; the prompt comes back after it."""
        if self._prompt and not self._redraw:
            self.stdout.write("\r\x1b[K")
            self.stdout.flush()
            self._redraw = True

    def typed_ahead(self) -> bool:
        """Read what was typed while the chat did something else, without waiting: a line is
        kept for the next :meth:`read`; Ctrl-D sets :attr:`quit_asked`. True when Ctrl-D was
        typed (just now)."""
        if not self.live or self.quit_asked:
            return False
        fd = self.stdin.fileno()
        while select.select([fd], [], [], 0)[0]:
            data = os.read(fd, 65536)
            if not data:
                self.quit_asked = True
                return True
            self._ahead += data
        return False

    def read(self, prompt: str, idle: Callable[[], None] | None = None) -> Said:
        if self.quit_asked:
            raise EOFError
        if self._saved is None:  # lines as input() gives them
            first = line = input(prompt)
            more: list[str] = []
            while START in first and END not in line[line.rfind(START) + 1 :]:
                try:  # the rest of the paste, to its end
                    line = input()
                except EOFError:
                    break
                more.append(line)
            return join_paste("\n".join([first, *more]))
        self.stdout.write(prompt)
        self.stdout.flush()
        self._prompt, self._redraw = prompt, False
        try:
            got = self._line(idle)
            while START in got and END not in got[got.rfind(START) + 1 :]:
                try:
                    got += self._line(idle)
                except EOFError:
                    break
        finally:
            self._prompt = ""
        raw = got.translate(_SWAP)  # the line breaks as they came (see _quiet_controls)
        if raw.endswith("\n"):  # a typed NL: its echo (a CR) did not move to the next line
            self.stdout.write("\n")
            self.stdout.flush()
        return join_paste(raw[:-1] if raw.endswith(("\r", "\n")) else raw)

    def _line(self, idle: Callable[[], None] | None = None) -> str:
        """One line from the terminal, with the character that ended it; ``idle`` runs while
        none comes."""
        fd, chunks = self.stdin.fileno(), bytearray()
        while not chunks.endswith((b"\n", b"\r")):
            if self._ahead:  # one line of it at a time, as the terminal gives them
                ends = [i for i in (self._ahead.find(b"\n"), self._ahead.find(b"\r")) if i >= 0]
                cut = min(ends) + 1 if ends else len(self._ahead)
                chunks += self._ahead[:cut]
                del self._ahead[:cut]
                continue
            while idle is not None and not select.select([fd], [], [], 0.25)[0]:
                idle()
                if self._redraw:  # something was printed: the prompt again, below it
                    self.stdout.write(self._prompt)
                    self.stdout.flush()
                    self._redraw = False
            data = os.read(fd, 65536)
            if not data:  # Ctrl-D
                if not chunks:
                    raise EOFError
                break
            chunks += data
        return chunks.decode(self.stdin.encoding or "utf-8", "replace")


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
