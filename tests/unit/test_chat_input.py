"""Reading the chat's input (relaybot/chat_input.py): a bracketed paste is one message."""

from __future__ import annotations

import io

import pytest

from relaybot import chat_input
from relaybot.chat_input import LineReader, Said, join_paste


def reads(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> list[str]:
    """The messages ``LineReader.read`` makes of what ``input()`` returns, until EOF."""
    feed = iter(lines)

    def fake_input(_prompt: str = "") -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    reader = LineReader(io.StringIO(), io.StringIO())
    out: list[str] = []
    with reader:
        while True:
            try:
                out.append(reader.read("you> ").text)
            except EOFError:
                return out


S, E = chat_input.START, chat_input.END


@pytest.mark.parametrize(
    ("lines", "messages"),
    [
        (["one", "two"], ["one", "two"]),  # typed lines: one message each
        ([f"{S}a", "b", f"c{E}"], ["a\nb\nc"]),
        ([f"{S}a", "b", f"{E}"], ["a\nb"]),  # the paste ended with a line break
        ([f"see: {S}a", f"b{E} thanks"], ["see: a\nb thanks"]),  # typed around the paste
        ([f"{S}just one{E}", "next"], ["just one", "next"]),
        ([f"{S}a", "b"], ["a\nb"]),  # the input ended inside the paste
    ],
)
def test_a_paste_is_one_message(
    monkeypatch: pytest.MonkeyPatch, lines: list[str], messages: list[str]
) -> None:
    assert reads(monkeypatch, lines) == messages


def test_not_a_terminal_asks_nothing_of_it() -> None:
    out = io.StringIO()
    with LineReader(io.StringIO(), out) as reader:
        assert not reader.bracketed
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("/new", Said("/new", False)),  # typed: the chat decides whether it is a command
        (f"{S}/new{E}", Said("/new", True)),  # pasted, one line: a message, never a command
        (f"{S}//x{E}", Said("//x", True)),  # as it is, the // kept
        (f"{S}a\r\nb{E}", Said("a\nb", True)),  # CR LF is one line break
        (f"{S}a\rb\r\rc{E}", Said("a\nb\n\nc", True)),  # a lone CR too; CR CR a blank line
        (f"{S}a\r\n{E}", Said("a", True)),  # the paste's own last line break is not sent
    ],
)
def test_what_is_pasted_is_marked_and_keeps_its_line_breaks(raw: str, said: Said) -> None:
    assert join_paste(raw) == said
