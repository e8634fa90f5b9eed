"""Assembling the worker process from the configuration: memory, model, tools, consumer."""

from __future__ import annotations

import sqlite3

import redis
import structlog

from memory.store import MemoryStore
from relaybot.config import Config
from worker.busy import BusySignal
from worker.consumer import Consumer
from worker.model import ModelPort, NoModel, make_model
from worker.tools import ToolRegistry, default_tools
from worker.turn import Turns

log = structlog.get_logger(__name__)


def open_store(cfg: Config) -> MemoryStore | None:
    """The memory database, or None (degraded mode: answer without memory) if it cannot open."""
    try:
        cfg.memory_path.parent.mkdir(parents=True, exist_ok=True)
        return MemoryStore(cfg.memory_path, synchronous=cfg.memory.synchronous)
    except (sqlite3.Error, OSError) as exc:
        log.error("memory.unavailable", path=str(cfg.memory_path), error=str(exc))
        return None


def build_consumer(
    cfg: Config,
    r: redis.Redis,
    *,
    model: ModelPort | None = None,
    store: MemoryStore | None = None,
    tools: ToolRegistry | None = None,
) -> Consumer:
    model = model or make_model(cfg.model)
    if isinstance(model, NoModel):
        log.warning(
            "model.not_configured",
            hint="set [model] base_url and model in config.toml, or OPENAI_BASE_URL and "
            "RELAYBOT_MODEL; replies will say that no model is configured",
        )
    busy = BusySignal(r, cfg.keys)
    turns = Turns(cfg, store, model, tools or default_tools(), thinking=busy.turn)
    return Consumer(cfg, r, turns, store, busy=busy)


def run_worker(cfg: Config, r: redis.Redis, *, wait_for_lease: bool = True) -> int:
    store = open_store(cfg)
    consumer = build_consumer(cfg, r, store=store)
    consumer.install_signal_handlers()
    try:
        return consumer.run(wait_for_lease=wait_for_lease)
    finally:
        if store is not None:
            store.close()
