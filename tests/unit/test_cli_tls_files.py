"""A TLS file that is not there is the same one line and exit 2 for every command (issue 26):
``relaybot status`` said "cannot reach Redis ... Error 2 ... No such file", exit 1, where the
worker, chat, the gateways and doctor said which file."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from relaybot import cli


@pytest.fixture(autouse=True)
def _umask() -> object:
    """cli.main sets the process's umask (077): give the other tests theirs back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.fixture(autouse=True)
def _logging_back() -> Iterator[None]:
    """cli.main points the logs at this test's captured stderr, closed after it: the logging
    of the tests after this one is put back as it was."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["memory", "notes", "add", "a note"],
        ["entities", "link", "matrix:@a:hs", "email:a@example.org"],
        ["redis-cli", "PING"],
    ],
)
def test_a_missing_ca_file_is_one_configuration_line_and_exit_2(
    args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RELAYBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REDIS_URL", "rediss://relaybot-cli:pw@127.0.0.1:1/0")
    monkeypatch.setenv("RELAYBOT_REDIS__CA_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setattr(cli.os, "execv", lambda *_: pytest.fail("redis-cli was started"))
    assert cli.main(args) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"relaybot: configuration error: [redis] ca_file {tmp_path / 'missing.pem'} does not "
        "exist: fix the path ([redis] ca_file or RELAYBOT_REDIS__CA_FILE) or its permissions"
    ), err
