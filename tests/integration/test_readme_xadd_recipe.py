"""The README's recipe that injects a message with ``relaybot redis-cli XADD`` (issue 26): run
verbatim, its entry is a valid message dated now, not 1970 (it said ``ts 0``)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from contract.messages import InboundMessage
from tests.support.procs import REPO, relaybot_env
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def xadd_recipe() -> str:
    """The README's ``relaybot redis-cli XADD`` command (its continued lines joined)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^(relaybot redis-cli XADD .*?\\\n.*?)$", readme, re.M)
    assert found, "the README has no redis-cli XADD recipe"
    return found.group(1).replace("\\\n", " ")


def test_the_readme_xadd_recipe_dates_its_message_now(tmp_path: Path, home: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        env = relaybot_env(home, redis_url=server.url)
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # relaybot, as activated
        before = time.time()
        done = subprocess.run(
            ["/bin/sh", "-c", xadd_recipe()], env=env, cwd=home,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "ERR" not in done.stdout, (done.stdout, done.stderr)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        [(_id, fields)] = client.xrange("relaybot:inbound:cli")
        client.close()
        msg = InboundMessage.from_fields(fields)
        assert before - 2 <= msg.ts <= time.time() + 2, msg.ts
    finally:
        server.stop()
