"""How ``relaybot chat`` shows a reply: Markdown with who answered and when on a terminal, the
plain text otherwise (so that pipes, scripts and tests read what the model wrote). Either way
control characters are shown as ``\\x1b``, not obeyed (:mod:`contract.terminal`): a reply may
quote what a remote sender wrote, and a pipe often ends on a terminal too."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from contract.messages import Reply, ReplyKind
from contract.terminal import safe

if TYPE_CHECKING:
    from rich.console import Console


def stamp(created: float, now: float | None = None) -> str:
    """``14:32`` today, ``2026-11-23 14:32`` on another day (local time)."""
    when = time.localtime(created)
    today = time.localtime(time.time() if now is None else now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M", when)
    return time.strftime("%Y-%m-%d %H:%M", when)


def header(reply: Reply, assistant: str, now: float | None = None) -> str:
    """Who answered and when: ``relaybot · 14:32`` (``relaybot (error) · 14:32``)."""
    who = assistant if reply.kind == ReplyKind.REPLY else f"{assistant} ({reply.kind.value})"
    return f"{who} · {stamp(reply.created, now)}"


class ReplyView:
    """Shows replies on ``out``: rendered when ``out`` is a terminal, plain text otherwise."""

    def __init__(self, out: TextIO, assistant: str) -> None:
        self.out = out
        self.assistant = assistant
        self.rich = out.isatty()
        self.console: Console | None = None
        if self.rich:  # rich (and its Markdown) only for a terminal: `chat -m` in a pipe starts
            from rich.console import Console  # sooner without it

            self.console = Console(file=out, highlight=False, soft_wrap=False)

    def show(self, reply: Reply) -> None:
        if self.console is None:
            prefix = "! " if reply.kind == ReplyKind.ERROR else ""
            self.out.write(f"{prefix}{safe(reply.text)}\n")
            self.out.flush()
            return
        from rich.text import Text

        style = "bold red" if reply.kind == ReplyKind.ERROR else "bold cyan"
        self.console.print(Text(safe(header(reply, self.assistant)), style=style))
        self.console.print(_markdown(safe(reply.text)))
        self.console.print()

    def note(self, text: str) -> None:
        """A line of the chat itself (a command's answer), never mistaken for a reply."""
        if self.console is None:
            self.out.write(f"{safe(text)}\n")
            self.out.flush()
        else:
            from rich.text import Text

            self.console.print(Text(safe(text), style="dim"), soft_wrap=True)


def _markdown(text: str) -> object:
    """``text`` as Markdown with hard line breaks: a reply's single line break is kept (a chat
    reply is not a paragraph to reflow), lists, code and the rest rendered as Markdown; links as
    "text (url)": an OSC 8 hyperlink would hide where it leads behind its text."""
    from rich.markdown import Markdown

    shown = Markdown(text, hyperlinks=False)
    for token in shown.parsed:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"
    return shown
