"""The worker applies a reloaded config.toml on its writer, between rounds (worker/reload.py
``maybe_reload``): the owner's aliases, the turns mode and the model client change for the next
turns; what cannot change waits for a restart."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest

from contract.config import Config, ModelConfig, load_config
from contract.config_watch import WORKER_RELOADS, WORKER_USES, ConfigWatcher
from contract.messages import InboundMessage
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from worker.consumer import Consumer
from worker.derive import Deriver
from worker.duties import Duties
from worker.main import assemble
from worker.tools import default_tools
from worker.turn import Turns

BASE = '[redis]\nprefix = "rb:"\n\n[turns]\nmode = "followup"\n'


def write(home: Path, text: str) -> None:
    path = home / "config.toml"
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


class Models:
    def __init__(self) -> None:
        self.made: list[ModelConfig] = []
        self.closed = 0

    def __call__(self, cfg: ModelConfig) -> InstantModel:
        self.made.append(cfg)
        models = self

        class Closing(InstantModel):
            def close(self) -> None:
                models.closed += 1

        return Closing()


@pytest.fixture
def consumer(tmp_path: Path) -> Iterator[tuple[Consumer, Models]]:
    write(tmp_path, BASE)
    cfg: Config = load_config(tmp_path, env={})
    store = MemoryStore(tmp_path / "memory.sqlite3")
    turns = Turns(cfg, store, InstantModel(), default_tools())
    r = fakeredis.FakeRedis()
    now = [0.0]
    watch = ConfigWatcher(cfg, process="worker", uses=WORKER_USES, reloadable=WORKER_RELOADS,
                          env={}, every=1.0, clock=lambda: now[0])  # fmt: skip
    models = Models()

    def summaries(busy: Callable[[str], bool], duties: Duties) -> Deriver:
        # layer 1, started with no model
        return Deriver(cfg, r, turns.memory, has_model=False, busy=busy, duties=duties)

    c = assemble(cfg, r, turns, watch=watch, make_model=models, deriver=summaries)
    c._now = now  # type: ignore[attr-defined]
    yield c, models
    store.close()


def tick(c: Consumer) -> None:
    """Two looks a few seconds apart: the watcher reads a changed file at its second look."""
    for _ in range(2):
        c._now[0] += 5  # type: ignore[attr-defined]
        c.reloader.maybe_reload()


def message(sender: str) -> InboundMessage:
    return InboundMessage.model_validate(
        dict(
            channel="matrix",
            session="matrix:!r",
            conversation="matrix:!r",
            sender=sender,
            privacy="direct",
            text="hi",
            ts=1.0,
            event_id="e1",
        )
    )


def test_aliases_and_turns_mode_apply_to_the_next_turns(
    consumer: tuple[Consumer, Models], tmp_path: Path
) -> None:
    c, models = consumer
    m = message("@ada:example.org")
    assert not c.turns.memory.is_owner(m)
    assert not c.writer.sessions.collect(m)
    alias = '\n[owner]\naliases = [{ address = "@ada:example.org", channel = "matrix" }]\n'
    write(tmp_path, BASE.replace("followup", "collect") + alias)
    tick(c)
    assert c.turns.memory.is_owner(m)
    assert c.writer.sessions.collect(m)
    assert c.cfg.turns.mode == "collect"
    assert models.made == []  # the model did not change: the client is kept


def test_a_new_model_gets_a_new_client_and_the_old_one_is_closed_once_idle(
    consumer: tuple[Consumer, Models], tmp_path: Path
) -> None:
    c, models = consumer
    old = c.turns.model
    write(tmp_path, BASE + '\n[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m2"\n')
    tick(c)
    assert [m.model for m in models.made] == ["m2"]
    assert c.turns.model is not old
    write(tmp_path, BASE + '\n[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m3"\n')
    tick(c)  # the m2 client is retired; no turn runs: closed at the next look
    tick(c)
    assert models.closed == 1


def test_what_cannot_be_reloaded_waits_for_a_restart(
    consumer: tuple[Consumer, Models], tmp_path: Path
) -> None:
    c, _ = consumer
    write(tmp_path, BASE + "\n[worker]\nbatch = 7\nlease_seconds = 3\n")
    tick(c)
    assert c.cfg.worker.batch == 100
    assert c.cfg.worker.lease_seconds == 10
    assert c.reloader.watch is not None
    assert c.reloader.watch.fields()["restart_keys"] == ["worker.batch", "worker.lease_seconds"]


def test_the_concurrency_follows_the_config(
    consumer: tuple[Consumer, Models], tmp_path: Path
) -> None:
    c, models = consumer
    c.writer.pool.start()
    try:
        write(tmp_path, BASE + "\n[model]\nconcurrency = 12\n")
        tick(c)
        assert c.writer.sessions.limit == 12
        assert c.writer.pool.limit == 12
        assert len(c.writer.pool._threads) == 12  # more threads for more turns at once
        write(tmp_path, BASE + "\n[model]\nconcurrency = 1\n")
        tick(c)
        assert c.writer.sessions.limit == 1  # no new turn starts above it; spare threads wait
        c.writer.sessions.running["cli:a"] = True  # one turn running: no slot for another
        assert not c.writer.sessions.has_slot(owner=True)
        c.writer.sessions.running.clear()
        assert models.made == []  # the endpoint did not change: the same client
    finally:
        c.writer.pool.stop()


def test_the_summaries_planner_follows_a_model_added_later(
    consumer: tuple[Consumer, Models], tmp_path: Path
) -> None:
    c, _models = consumer
    # layer 1 started with no model (the fixture)
    write(tmp_path, BASE + '\n[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m2"\n')
    tick(c)
    assert c.deriver.has_model  # pauses are now judged by the model, not by the quiet alone
