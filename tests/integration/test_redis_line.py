"""The Procfile's ``redis`` line when a zero-config ``relaybot chat`` already runs the embedded
Redis of the same RELAYBOT_HOME (found by the adversarial review: the line exited 1, and honcho
then stopped every process). It stays up, and starts its own server once that one stops."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from contract.config import load_config
from deploy import embedded
from tests.support.procs import Procs, relaybot_env, wait_until

pytestmark = pytest.mark.integration


def test_the_redis_line_waits_for_an_embedded_redis_already_running(
    tmp_path: Path, procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    env = relaybot_env(home)
    monkeypatch.setenv("RELAYBOT_HOME", str(home))
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = load_config()
    chats_server = embedded.start(cfg)  # what a zero-config chat starts
    try:
        line = procs.start("redis", ["redis"], env)
        line.wait_for_log("redis.embedded_in_use")
        time.sleep(1.5)
        assert line.returncode is None  # honcho would have stopped everything
    finally:
        embedded.stop(chats_server, cfg)
    wait_until(lambda: (embedded.supervised(cfg) and embedded.ping(cfg)) or None, timeout=30)
    assert line.returncode is None
    assert line.stop() == 0
