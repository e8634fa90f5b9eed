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
    monkeypatch.setattr(cli.os, "execve", lambda _binary, argv, _env: ran.append(list(argv)))
    assert cli.main(["redis-cli", *extra]) == 0
    (argv,) = ran
    assert argv[1:3] == ["-s", str(tmp_path / "redis" / "redis.sock")]
    assert argv[3:] == extra


@pytest.mark.parametrize(
    ("url", "target", "auth"),
    [
        (
            "redis://:s3cret@127.0.0.1:17601/0",
            ["-h", "127.0.0.1", "-p", "17601", "-n", "0"],
            "s3cret",
        ),
        (
            "redis://relaybot-cli:p%40ss@redis.example.org:6380/2",
            ["--user", "relaybot-cli", "-h", "redis.example.org", "-p", "6380", "-n", "2"],
            "p@ss",
        ),
        ("redis://127.0.0.1", ["-h", "127.0.0.1", "-p", "6379", "-n", "0"], None),
        ("unix:///run/redis.sock?db=3", ["-s", "/run/redis.sock", "-n", "3"], None),
    ],
)
def test_an_external_url_becomes_redis_clis_options_its_password_not_on_the_command_line(
    url: str, target: list[str], auth: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``redis://:pw@host`` (requirepass) answered WRONGPASS: redis-cli's ``-u`` took it for the
    user "" (redis-py takes it for the default user), and the password was in ``ps``."""
    monkeypatch.setenv("RELAYBOT_HOME", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.delenv("REDISCLI_AUTH", raising=False)
    ran: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(
        cli.os, "execve", lambda _binary, argv, env: ran.append((list(argv), dict(env)))
    )
    assert cli.main(["redis-cli", "PING"]) == 0
    ((argv, env),) = ran
    assert argv[1:] == [*target, "PING"]
    assert env.get("REDISCLI_AUTH") == auth
    assert all("s3cret" not in a and "p@ss" not in a for a in argv)
