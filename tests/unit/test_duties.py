"""The worker's periodic duties (worker/duties.py): registered by the parts and layers that own
them, run by the loop between rounds at their intervals."""

from __future__ import annotations

from pathlib import Path

import fakeredis
import pytest

from contract.config import Config, RedisConfig
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from worker.duties import Duties
from worker.main import assemble
from worker.tools import default_tools
from worker.turn import Turns


def test_a_duty_runs_at_the_first_round_then_once_its_interval_passed() -> None:
    now = [100.0]
    duties = Duties(clock=lambda: now[0])
    ran: list[float] = []
    duties.every(5.0, lambda: ran.append(now[0]), name="chore")
    for t in range(12):
        now[0] = 100.0 + t
        duties.run_due()
    assert ran == [100.0, 105.0, 110.0]


def test_an_interval_read_at_each_round_follows_a_change() -> None:
    now, every = [0.0], [10.0]
    duties = Duties(clock=lambda: now[0])
    ran: list[float] = []
    duties.every(lambda: every[0], lambda: ran.append(now[0]), name="chore")
    duties.run_due()
    every[0] = 2.0  # a reload shortened it
    for t in (1.0, 2.0, 3.0, 4.0):
        now[0] = t
        duties.run_due()
    assert ran == [0.0, 2.0, 4.0]


def test_a_name_is_registered_once() -> None:
    duties = Duties()
    duties.every(1.0, lambda: None, name="chore")
    with pytest.raises(ValueError, match="chore"):
        duties.every(2.0, lambda: None, name="chore")


def test_a_duty_registered_from_outside_runs_in_the_worker_loop_at_its_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new layer adds its duty to the registry it is given; the worker's loop runs it between
    rounds, at its interval, with the parts' own duties, without any edit of the loop."""
    now = [1000.0]
    duties = Duties(clock=lambda: now[0])
    ran: list[float] = []
    duties.every(30.0, lambda: ran.append(now[0]), name="layer.chore")
    cfg = Config(home=tmp_path, redis=RedisConfig(prefix="rb:"))
    store = MemoryStore(tmp_path / "memory.sqlite3")
    r = fakeredis.FakeRedis()
    c = assemble(cfg, r, Turns(cfg, store, InstantModel(), default_tools()), duties=duties)
    try:
        assert c.acquire(wait=False)
        c.reader.ensure_group()
        c.reader.recover()
        # nothing comes: a round reads nothing at once (no second of blocking per round)
        monkeypatch.setattr(c.reader, "read", lambda *, block_ms: [])
        for t in range(0, 95, 5):
            now[0] = 1000.0 + t
            c._serve_once()
        assert ran == [1000.0, 1030.0, 1060.0, 1090.0]
        # the parts registered theirs in the same registry, the loop's heartbeat last
        assert duties.names() == [
            "layer.chore",
            "erasure.wal_retry",
            "reply.sweep",
            "stream.trim",
            "config.reload",
            "heartbeat",
        ]
    finally:
        c.lease.release()
        store.close()
