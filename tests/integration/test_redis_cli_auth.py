"""``relaybot redis-cli`` against a Redis with a password and no ACL user (``requirepass``), the
README's ``redis://:PASSWORD@host`` form: it answered ``AUTH failed: WRONGPASS`` (redis-cli's
``-u`` took the empty user for a user named ""), while status and chat worked with that URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import relaybot_env, run_relaybot
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def test_a_requirepass_url_works_and_its_password_is_not_on_the_command_line(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        server.client().config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
        env = relaybot_env(tmp_path / "home", redis_url=url, model_url=None)
        done = run_relaybot(["redis-cli", "PING"], env, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "PONG", (done.stdout, done.stderr)
        assert "Using a password" not in done.stderr  # not given with -a / -u
        status = run_relaybot(["status"], env, timeout=30)
        assert status.returncode == 0, status.stderr
    finally:
        server.stop()
