"""What a remote sender wrote never drives the owner's terminal (issue 13, adversarial run):
escape sequences in stored or relayed text are shown, not obeyed."""

from __future__ import annotations

import io
import json
import time

from contract.messages import Reply
from contract.terminal import echo, echo_json, json_safe, safe
from relaybot import chat_render

HOSTILE = "hi\x1b[2J there\x1b]0;EVIL\x07 clip\x1b]52;c;ZXZpbA==\x07 csi\x9b31m del\x7f cr\r end"


def inert(text: str) -> bool:
    """Nothing a terminal acts on but newline and tab (and rich's own SGR styling when
    ``styled``)."""
    return not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


def test_controls_are_shown_as_visible_escapes_and_newline_and_tab_kept() -> None:
    shown = safe(HOSTILE + "\nline two\tcol")
    assert inert(shown)
    assert "\\x1b[2J" in shown and "\\x1b]0;EVIL\\x07" in shown and "\\x9b31m" in shown
    assert "\\x7f" in shown and "\\x0d" in shown
    assert shown.endswith("\nline two\tcol")
    assert safe("plain café ✓") == "plain café ✓"


def test_echo_and_echo_json(capsys: object) -> None:
    out = io.StringIO()
    echo("sender:", HOSTILE, file=out)
    assert inert(out.getvalue()) and "\\x1b]52;c;" in out.getvalue()
    dumped = json_safe(json.dumps({"text": HOSTILE}, ensure_ascii=False))
    assert inert(dumped)
    assert json.loads(dumped) == {"text": HOSTILE}  # the same JSON value


def test_echo_json_writes_inert_json(capsys: object) -> None:
    import pytest

    assert isinstance(capsys, pytest.CaptureFixture)
    echo_json({"text": HOSTILE}, ensure_ascii=False)
    printed = capsys.readouterr().out
    assert inert(printed) and json.loads(printed) == {"text": HOSTILE}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def reply(text: str) -> Reply:
    return Reply.model_validate(
        {
            "reply_id": "r1",
            "answers": "cli:1-0",
            "kind": "reply",
            "channel": "cli",
            "session": "cli:s",
            "conversation": "cli:s",
            "text": text,
            "created": time.time(),
        }
    )


def test_a_reply_in_a_pipe_shows_the_escapes_instead_of_sending_them() -> None:
    out = io.StringIO()
    view = chat_render.ReplyView(out, "relaybot")
    view.show(reply(HOSTILE))
    view.note(HOSTILE)
    assert inert(out.getvalue())
    assert "\\x1b[2J" in out.getvalue()


def test_a_reply_on_a_terminal_carries_only_riches_own_styling() -> None:
    out = Tty()
    view = chat_render.ReplyView(out, "relaybot")
    view.show(reply(HOSTILE))
    view.note(HOSTILE)
    shown = out.getvalue()
    for bad in ("\x1b[2J", "\x1b]", "\x07", "\x9b", "\x7f", "\r"):
        assert bad not in shown, repr(bad)
    assert "\\x1b]0;EVIL\\x07" in shown


def test_a_link_on_a_terminal_shows_where_it_leads() -> None:
    out = Tty()
    view = chat_render.ReplyView(out, "relaybot")
    view.show(reply("see [your bank](https://evil.example/login)"))
    shown = out.getvalue()
    assert "\x1b]8;" not in shown  # no OSC 8 hyperlink hiding its target behind its text
    assert "https://evil.example/login" in shown and "your bank" in shown


def test_bidirectional_overrides_are_shown_not_obeyed() -> None:
    # "evil\u202egpj.exe" reads as "evilexe.jpg" on screen
    assert safe("evil\u202egpj.exe") == "evil\\u202egpj.exe"
    assert safe("\u2066x\u2069") == "\\u2066x\\u2069"
    assert safe("שלום, hello") == "שלום, hello"  # right-to-left text itself is untouched
