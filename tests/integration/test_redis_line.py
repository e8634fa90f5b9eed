"""The Procfile's ``redis`` line when a zero-config ``relaybot chat`` already runs the embedded
Redis of the same RELAYBOT_HOME (found by the adversarial review: the line exited 1, and honcho
then stopped every process). It stays up, and starts its own server once that one stops."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

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


def test_a_short_wait_for_new_entries_ends_on_time_not_at_redis_next_tick(
    real_redis: redis.Redis, prefix: str
) -> None:
    """Redis notices a BLOCK timeout only when its event loop wakes (hz 10: as late as 100 ms);
    the worker's short waits (until its next flush is due) end on its own clock."""
    from contract.keys import Keys
    from worker.streams import InboundStreams

    streams = InboundStreams(real_redis, Keys(prefix), "c")
    streams.ensure_groups()
    r_fd, w_fd = os.pipe()  # a wake that never comes
    try:
        took = []
        for _ in range(5):
            start = time.monotonic()
            found, _gone = streams.read_new(block_ms=20, count=10, wake=r_fd)
            took.append(time.monotonic() - start)
            assert found == []
        assert sorted(took)[2] < 0.06, took  # the median: 20 ms and the reads, not 100
    finally:
        os.close(r_fd)
        os.close(w_fd)
