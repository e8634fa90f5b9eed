"""`relaybot onboard` writes `concurrency = 1` for a model server on this machine."""

from __future__ import annotations

import pytest

from relaybot.onboard_sections import is_local


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://localhost:11434/v1", True),
        ("http://LOCALHOST:8080/v1", True),
        ("http://ollama.localhost/v1", True),
        ("http://127.0.0.1:11434/v1", True),
        ("http://127.5.6.7:8000/v1", True),
        ("http://[::1]:8080/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://192.168.1.10:11434/v1", False),  # another machine: its own capacity
        ("http://localhost.example.org/v1", False),
        ("not a url", False),
        ("", False),
    ],
)
def test_a_server_on_this_machine_is_recognised(url: str, local: bool) -> None:
    assert is_local(url) is local
