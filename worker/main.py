"""Assembling the worker process from the configuration: memory, model, tools, consumer."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import structlog

from contract.clock import RedisClock
from contract.config import Config
from contract.config_watch import WORKER_RELOADS, WORKER_USES, ConfigWatcher
from memory.errors import MemoryUnavailable
from memory.turns import privacy_of
from memory.writer import MemoryStore, WalCheckpointer
from worker.busy import BusySignal
from worker.consumer import Consumer
from worker.derive import Deriver
from worker.memory_tools import memory_tools
from worker.model import ModelPort, NoModel
from worker.openai_client import make_model
from worker.tools import LazyTools, ToolRegistry, default_tools
from worker.turn import Turns
from worker.turn_context import TurnContext

log = structlog.get_logger(__name__)


def open_store(cfg: Config) -> MemoryStore | None:
    """The memory database, or None (degraded mode: answer without memory) if it cannot open."""
    try:
        cfg.memory_path.parent.mkdir(parents=True, exist_ok=True)
        return MemoryStore(cfg.memory_path, synchronous=cfg.memory.synchronous)
    except (MemoryUnavailable, OSError) as exc:
        log.error("memory.unavailable", path=str(cfg.memory_path), error=str(exc))
        return None


def turn_tools(ctx: TurnContext) -> ToolRegistry:
    """The tools of one turn: the built-in ones and the memory tools for its privacy scope."""
    return ToolRegistry([*default_tools(), *memory_tools(ctx)])


def tool_shape(ctx: TurnContext) -> Hashable:
    """What decides which tools :func:`turn_tools` offers and how they are described: whether
    memory is there and the scope's privacy class (tests/unit/test_turn_tools.py checks that turns
    of one shape get the same specs)."""
    return (ctx.memory.store is None, privacy_of(ctx.scope))


class TurnTools:
    """:func:`turn_tools` for the worker: lazily built per turn, specs shared per shape."""

    def __init__(self) -> None:
        self._specs: dict[Hashable, list[dict[str, Any]]] = {}

    def __call__(self, ctx: TurnContext) -> ToolRegistry:
        return LazyTools(lambda: turn_tools(ctx), tool_shape(ctx), self._specs)


def build_consumer(
    cfg: Config,
    r: redis.Redis,
    *,
    model: ModelPort | None = None,
    store: MemoryStore | None = None,
    tools: ToolRegistry | None = None,
) -> Consumer:
    own_model = model is None  # a model given (tests) is kept across reloads
    model = model or make_model(cfg.model)
    if isinstance(model, NoModel):
        log.warning(
            "model.not_configured",
            hint="set [model] base_url and model in config.toml, or OPENAI_BASE_URL and "
            "RELAYBOT_MODEL; replies will say that no model is configured",
        )
    busy = BusySignal(r, cfg.keys)
    turns = Turns(
        cfg,
        store,
        model,
        tools or TurnTools(),
        thinking=busy.turn,
        opener=lambda: open_store(cfg),
        clock=RedisClock(r).now,
    )
    deriver = Deriver(cfg, r, turns.memory, has_model=not isinstance(model, NoModel))
    consumer = Consumer(cfg, r, turns, busy=busy, deriver=deriver)
    consumer.watch = ConfigWatcher(cfg, process="worker", uses=WORKER_USES,
                                   reloadable=WORKER_RELOADS)  # fmt: skip
    if own_model:
        consumer.make_model = make_model
    return consumer


def run_worker(cfg: Config, r: redis.Redis, *, wait_for_lease: bool = True) -> int:
    with worker_memory(cfg) as store:
        consumer = build_consumer(cfg, r, store=store)
        consumer.install_signal_handlers()
        return consumer.run(wait_for_lease=wait_for_lease)


@contextmanager
def worker_memory(cfg: Config) -> Iterator[MemoryStore | None]:
    """The worker's store, with WAL checkpoints on a thread of their own (memory.checkpoint)."""
    store = open_store(cfg)
    checkpointer = None
    if store is not None:
        store.set_autocheckpoint(0)
        checkpointer = WalCheckpointer(cfg.memory_path).start()
    try:
        yield store
    finally:
        if checkpointer is not None:
            checkpointer.stop()
        if store is not None:
            store.close()
