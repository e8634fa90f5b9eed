"""``relaybot redis-cli ARGS``: everything after ``redis-cli`` is redis-cli's, options too.

The README's recipes (``relaybot redis-cli --scan --pattern 'relaybot:reply:*'``) failed with
"unrecognized arguments": argparse took ``--scan`` for one of relaybot's own options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy import embedded
from relaybot import cli


@pytest.fixture(autouse=True)
def _umask() -> object:
    """cli.main sets the process's umask (077): give the other tests theirs back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.mark.parametrize(
    "extra",
    [
        ["--scan", "--pattern", "relaybot:reply:*"],
        ["XRANGE", "relaybot:inbound:cli", "-", "+", "COUNT", "5"],
        ["--no-raw", "XINFO", "GROUPS", "relaybot:inbound"],
    ],
)
def test_every_argument_after_redis_cli_goes_to_redis_cli(
    extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYBOT_HOME", str(tmp_path))
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(embedded, "ping", lambda _cfg: True)  # as when chat or honcho runs it
    ran: list[list[str]] = []
    monkeypatch.setattr(cli.os, "execv", lambda _binary, argv: ran.append(list(argv)))
    assert cli.main(["redis-cli", *extra]) == 0
    (argv,) = ran
    assert argv[1:3] == ["-s", str(tmp_path / "redis" / "redis.sock")]
    assert argv[3:] == extra
