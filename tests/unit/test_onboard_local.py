"""`relaybot onboard` writes `concurrency = 1` for a model server on this machine."""

from __future__ import annotations

import socket
from pathlib import Path

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
        # the other spellings of this machine (adversary round 2)
        ("http://127.1:8080/v1", True),
        ("http://2130706433:8080/v1", True),
        ("http://0x7f000001:8080/v1", True),
        ("http://0.0.0.0:11434/v1", True),
        ("http://[::]:8080/v1", True),
        ("http://[::ffff:127.0.0.1]:8080/v1", True),
        ("http://localhost.:11434/v1", True),
        (f"http://{socket.gethostname()}:11434/v1", True),
        ("http://10.1.2.3:11434/v1", False),
        ("http://[::ffff:10.0.0.1]:8080/v1", False),
        ("http://[bad:8080/v1", False),
        ("https://api.openai.com/v1", False),
        ("http://192.168.1.10:11434/v1", False),  # another machine: its own capacity
        ("http://localhost.example.org/v1", False),
        ("not a url", False),
        ("", False),
    ],
)
def test_a_server_on_this_machine_is_recognised(url: str, local: bool) -> None:
    assert is_local(url) is local


def test_a_key_beside_a_user_and_password_in_the_url_is_asked_again_then_refused(
    tmp_path: Path,
) -> None:
    """Both would be the Authorization header, and httpx sends the URL's: the key never went."""
    from contract.config import Config
    from relaybot.onboard_ask import Asker, Cancelled
    from relaybot.onboard_sections import ask_model

    answers = iter(["http://proxy:pw-4411@127.0.0.1:9/v1", "sk-k1", "sk-k2", *["sk-k3"] * 3])
    said: list[str] = []

    def read(_prompt: str) -> str:
        return next(answers)

    asker = Asker(read=read, secret=read, say=said.append)
    with pytest.raises(Cancelled):
        ask_model(asker, Config(home=tmp_path))
    refusals = [s for s in said if "user:password" in s]
    assert len(refusals) == 5  # asked five times, then it stops; no request was made
    assert not any("pw-4411" in s for s in said)

    preset = Asker(
        preset={"model_url": "http://proxy:pw@127.0.0.1:9/v1", "api_key": "sk-k"},
        interactive=False,
    )
    with pytest.raises(Cancelled) as stopped:
        ask_model(preset, Config(home=tmp_path))
    assert "--api-key" in str(stopped.value) and "user:password" in str(stopped.value)
