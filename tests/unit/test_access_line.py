"""The one line a process stops with when Redis refused its account (contract/access.py):
a script's refused command named, not the script's SHA; a database other than 0 said so."""

from __future__ import annotations

import hashlib

import redis
from pydantic import SecretStr

from contract import access
from contract.config import Config


def _cfg(tmp: object, url: str) -> Config:
    cfg = Config(home=tmp)  # type: ignore[arg-type]
    cfg.redis.url = SecretStr(url)
    return cfg


def test_a_refused_command_of_the_workers_read_script_is_named(tmp_path: object) -> None:
    """It said `... script: abe802f2...(40 hex), on @user_script:104.`: a SHA for a command."""
    from worker import streams

    sha = hashlib.sha1(streams._READ.encode(), usedforsecurity=False).hexdigest()
    at = next(
        n for n, ln in enumerate(streams._READ.splitlines(), 1) if "redis.call('xreadgroup'" in ln
    )
    exc = redis.ResponseError(
        "The user executing the script can't run this command or subcommand script: "
        f"{sha}, on @user_script:{at}."
    )
    assert access.refusal(exc)
    cfg = _cfg(tmp_path, "redis://relaybot-worker:pw@host/0")
    line = access.line(cfg, exc, "worker")
    assert (
        "can't run this command or subcommand: XREADGROUP, run by the worker's read script "
        f"(EVALSHA {sha[:8]}…, its line {at})"
    ) in line, line
    assert sha not in line
    assert "give relaybot-worker these commands in the Redis ACL file" in line


def test_an_unknown_script_is_still_said_in_words(tmp_path: object) -> None:
    exc = redis.ResponseError(
        "The user executing the script can't run this command or subcommand script: "
        f"{'a' * 40}, on @user_script:3."
    )
    line = access.line(_cfg(tmp_path, "redis://relaybot-worker:pw@host/0"), exc, "worker")
    assert "a command of a script of relaybot's (EVALSHA aaaaaaaa…, its line 3)" in line


def test_a_refused_select_says_database_0_only(tmp_path: object) -> None:
    """REDIS_URL .../5 with the shipped ACL: the hint said `give these commands`."""
    exc = redis.exceptions.NoPermissionError(
        "this user has no permissions to run the 'select' command"
    )
    line = access.line(_cfg(tmp_path, "redis://relaybot-cli:pw@host/5"), exc, "cli")
    assert line.endswith(
        "-- the shipped ACL allows database 0 only: use /0 at the end of REDIS_URL (or [redis] url)"
    ), line
    assert "give" not in line
