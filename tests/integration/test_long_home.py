"""A RELAYBOT_HOME too long for the embedded Redis's unix socket (108 bytes on Linux) is a
configuration error: one line and exit 2 from every command (it was a 20-line traceback, exit 1,
from chat, status, redis-cli and the worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import relaybot_env, run_relaybot

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "args",
    [["status"], ["chat", "-m", "hi"], ["redis-cli", "PING"], ["worker", "--no-wait"], ["jobs"]],
)
def test_a_home_too_long_for_the_socket_is_one_line_and_exit_2(
    args: list[str], tmp_path: Path
) -> None:
    home = tmp_path / ("h" * 120)
    env = relaybot_env(home, redis_url=None, model_url=None)
    done = run_relaybot(args, env, timeout=30)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert any("too long for the embedded Redis socket" in ln for ln in lines), done.stderr
    assert len(lines) == 1, done.stderr
