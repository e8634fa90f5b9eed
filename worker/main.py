"""Assembling the worker process from the configuration: memory, model, tools, and the parts of
the consumer (``assemble``: each part is given what it needs in its constructor)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from functools import partial
from types import FrameType
from typing import Any

import redis
import structlog

from contract.clock import RedisClock, ScheduleClock
from contract.config import Config
from contract.config_watch import WORKER_RELOADS, WORKER_USES, ConfigWatcher
from contract.durable import NotDurable, probe
from contract.liveness import process_identity
from contract.messages import InboundMessage, Privacy
from contract.outage import TRANSIENT
from memory.errors import MemoryUnavailable
from memory.turns import privacy_of
from memory.types import Scope
from memory.writer import MemoryStore, WalCheckpointer
from worker.busy import BusySignal
from worker.commands import WorkerCommand
from worker.committer import Committer
from worker.consumer import Consumer
from worker.control import Control
from worker.derive import Deriver, resummarize_command
from worker.duties import Duties
from worker.health import Health
from worker.mcp_commands import approve_command
from worker.mcp_tools import McpOffers, WorkerHub
from worker.memory_tools import memory_tools
from worker.model import ModelPort, NoModel
from worker.openai_client import make_model
from worker.profile_derive import Profiler
from worker.reader import Reader
from worker.reload import MakeModel, Reloader
from worker.schedule_commands import add_command, cancel_command
from worker.schedule_items import ScheduleSettings
from worker.schedule_tools import offer, schedule_tools
from worker.scheduling import Scheduling, fired_by_jobs
from worker.sessions import Sessions
from worker.tools import LazyTools, ToolRegistry, default_tools
from worker.turn import Turns
from worker.turn_context import TurnContext
from worker.writer import Writer

# layer 1 (worker/derive.py), built once the writer can say whether a conversation is busy
MakeDeriver = Callable[[Callable[[str], bool], Duties], Deriver]
# scheduled work's duty (worker/scheduling.py), given the writer's way to write between rounds
MakeScheduling = Callable[[Callable[[Callable[[], object]], object], Duties], Scheduling]
# layer 2 (worker/profile_derive.py), given the same
MakeProfiler = Callable[[Callable[[Callable[[], object]], object], Duties], Profiler]

log = structlog.get_logger(__name__)


def open_store(cfg: Config) -> MemoryStore | None:
    """The memory database, or None (degraded mode: answer without memory) if it cannot open."""
    try:
        cfg.memory_path.parent.mkdir(parents=True, exist_ok=True)
        return MemoryStore(cfg.memory_path, synchronous=cfg.memory.synchronous)
    except (MemoryUnavailable, OSError) as exc:
        log.error("memory.unavailable", path=str(cfg.memory_path), error=str(exc))
        return None


def turn_tools(ctx: TurnContext, settings: ScheduleSettings | None = None) -> ToolRegistry:
    """The tools of one turn: the built-in ones, the memory tools for its privacy scope and,
    where it is offered, scheduling (worker/schedule_tools.py; ``settings``: the worker's
    ``[schedule]`` and schedule clock, else the defaults)."""
    settings = settings or ScheduleSettings()
    return ToolRegistry([*default_tools(ctx.memory.settings.timezone), *memory_tools(ctx),
                         *schedule_tools(ctx, settings)])  # fmt: skip


def tool_shape(ctx: TurnContext, settings: ScheduleSettings | None = None) -> Hashable:
    """What decides which tools :func:`turn_tools` offers and how they are described: whether
    memory is there, the scope's privacy class and the scheduling offered (whom it serves and its
    limits: tests/unit/test_turn_tools.py checks that turns of one shape get the same specs)."""
    settings = settings or ScheduleSettings()
    return (ctx.memory.store is None, privacy_of(ctx.scope), offer(ctx, settings.config()))


def tool_names(turns: Turns, settings: ScheduleSettings | None = None) -> list[str]:
    """The names of the tools the worker's turns have: those of a turn of the owner's terminal
    (which is offered every one); a capability gap that needs one of them is covered."""
    msg = InboundMessage(channel="cli", session="cli:tools", conversation="cli:tools",
                         sender="owner", privacy=Privacy.OWNER, text="", ts=0.0,
                         event_id="tool-names")  # fmt: skip
    ctx = TurnContext(stream_id="0-0", msg=msg, scope=Scope("cli:tools", Privacy.OWNER),
                      memory=turns.memory)  # fmt: skip
    names = turn_tools(ctx, settings).names
    if turns.mcp is not None:  # and the MCP tools the owner's turns are offered now
        names += turns.mcp.for_turn(Privacy.OWNER).names
    return names


class TurnTools:
    """:func:`turn_tools` for the worker: lazily built per turn, specs shared per shape."""

    def __init__(self, settings: ScheduleSettings | None = None) -> None:
        self._specs: dict[Hashable, list[dict[str, Any]]] = {}
        self._settings = settings or ScheduleSettings()

    def __call__(self, ctx: TurnContext) -> ToolRegistry:
        settings = self._settings
        shape = tool_shape(ctx, settings)
        return LazyTools(lambda: turn_tools(ctx, settings), shape, self._specs)


def assemble(
    cfg: Config,
    r: redis.Redis,
    turns: Turns,
    *,
    name: str | None = None,
    busy: BusySignal | None = None,
    flush_after: float = 0.02,
    watch: ConfigWatcher | None = None,
    make_model: MakeModel | None = None,
    deriver: MakeDeriver | None = None,
    duties: Duties | None = None,
    scheduling: MakeScheduling | None = None,
    profiles: MakeProfiler | None = None,
    hub: WorkerHub | None = None,
) -> Consumer:
    """The worker's parts, each given what it needs, one way (worker/consumer.py): the
    committer, the writer, the reader, the layers' duties (``deriver``: layer 1's summaries,
    given the writer's view of a busy conversation and the duties), the reloader, the process.
    ``name``: the consumer's name in its group (default: this process's identity). ``duties``:
    the registry the loop runs, with what others registered in it already (a layer built
    before the worker's parts adds its periodic duty there: worker/duties.py).
    ``scheduling``: scheduled work's duty (the rq jobs of the items due), given the writer's
    way to write memory between rounds; ``profiles``: layer 2's duties (the profile jobs,
    TODO.md, gaps a tool covers), given the same. ``hub``: the MCP servers' sessions
    (worker/mcp_hub.py): its state goes beside the heartbeat (Keys.mcp), a reload reconfigures
    it."""
    name = name or process_identity("worker")
    control, health = Control(cfg), Health(r, cfg.keys, name)
    if hub is not None:
        health.report_private(hub.health)  # not the gateways' to read: Keys.mcp
    duties = duties if duties is not None else Duties()
    sessions = Sessions(
        limit=cfg.model.concurrency,
        collect=lambda m: control.cfg.turns.mode_of(m.channel, m.conversation) == "collect",
    )
    committer = Committer(control, r, turns, sessions, name=name, health=health, duties=duties)
    writer = Writer(control, turns, sessions, committer, health=health, busy=busy,
                    flush_after=flush_after)  # fmt: skip
    reader = Reader(control, r, writer, committer, name=name, duties=duties)
    layer = deriver(writer.conversation_busy, duties) if deriver is not None else None
    if scheduling is not None:
        scheduling(writer.write_between_rounds, duties)
    if profiles is not None:
        profiler = profiles(writer.write_between_rounds, duties)
        committer.erasures.cleaners["todo_md"] = profiler.after_erasure
    reloader = Reloader(control, turns, writer, duties=duties, health=health, watch=watch,
                        make_model=make_model, deriver=layer, hub=hub)  # fmt: skip
    return Consumer(control, r, turns, name=name, reader=reader, writer=writer,
                    committer=committer, reloader=reloader, deriver=layer, duties=duties,
                    health=health, busy=busy)  # fmt: skip


def build_consumer(
    cfg: Config,
    r: redis.Redis,
    *,
    model: ModelPort | None = None,
    store: MemoryStore | None = None,
    tools: ToolRegistry | None = None,
    hub: WorkerHub | None = None,
) -> Consumer:
    """The worker as ``relaybot worker`` runs it (a model given, as tests and benchmarks do,
    is kept across reloads); ``hub``: the MCP servers' sessions, whose tools turns are offered
    by their audience (worker/mcp_tools.py; None: no MCP tools)."""
    own_model = model is None
    model = model or make_model(cfg.model)
    if isinstance(model, NoModel):
        log.info(  # a state, not a fault: every reply says so, and doctor warns
            "model.not_configured",
            hint="set [model] base_url and model in config.toml, or OPENAI_BASE_URL and "
            "RELAYBOT_MODEL; replies will say that no model is configured",
        )
    busy = BusySignal(r, cfg.keys)
    clock = RedisClock(r)
    schedule_clock = ScheduleClock(clock.now)  # the jobs' scheduler runs on the same one
    # [schedule] as the worker runs it now (a reload changes turns.cfg between turns), on the
    # clock that fires the items
    schedule_settings = ScheduleSettings(
        config=lambda: turns.cfg.schedule, shift=schedule_clock.shift
    )
    turns = Turns(
        cfg,
        store,
        model,
        tools or TurnTools(schedule_settings),
        opener=lambda: open_store(cfg),
        clock=clock.now,
        commands={
            "memory.resummarize": partial(resummarize_command, cfg, r),
            "schedule.add": partial(add_command, schedule_settings),
            "schedule.cancel": partial(cancel_command, schedule_settings),
        },
        schedule_clock=schedule_clock,
        schedule_fired=fired_by_jobs(lambda: turns.cfg, r),
    )
    if hub is not None:  # reserved: the built-in tools' names, which no MCP tool takes
        turns.mcp = McpOffers(hub, tool_names(turns, schedule_settings),
                              budget=cfg.mcp.result_chars)  # fmt: skip
        turns.commands.update(mcp_commands(hub))
    has_model = not isinstance(model, NoModel)

    def summaries(busy_now: Callable[[str], bool], duties: Duties) -> Deriver:
        return Deriver(cfg, r, turns.memory, has_model=has_model, busy=busy_now, duties=duties)

    def jobs_of_items(
        write: Callable[[Callable[[], object]], object], duties: Duties
    ) -> Scheduling:
        return Scheduling(lambda: turns.cfg, r, turns.memory, clock=schedule_clock,
                          write=write, duties=duties)  # fmt: skip

    def layer2(write: Callable[[Callable[[], object]], object], duties: Duties) -> Profiler:
        return Profiler(lambda: turns.cfg, r, turns.memory,
                        has_model=lambda: not isinstance(turns.model, NoModel),
                        tool_names=lambda: tool_names(turns, schedule_settings),
                        write=write, duties=duties)  # fmt: skip

    watch = ConfigWatcher(cfg, process="worker", uses=WORKER_USES, reloadable=WORKER_RELOADS)
    return assemble(cfg, r, turns, busy=busy, watch=watch,
                    make_model=make_model if own_model else None,
                    deriver=summaries, scheduling=jobs_of_items, profiles=layer2,
                    hub=hub)  # fmt: skip


def mcp_commands(hub: WorkerHub) -> dict[str, WorkerCommand]:
    """The owner commands of the MCP hub: ``mcp.approve`` (``relaybot tools approve``)."""
    return {"mcp.approve": partial(approve_command, hub)}


def run_worker(cfg: Config, r: redis.Redis, *, wait_for_lease: bool = True) -> int:
    """The worker process: memory, the MCP servers' hub (its sessions on a thread of their own,
    started once the lease is this worker's: a standby starts no server; closed once the
    consumer stopped), the consumer."""
    from worker.mcp_hub import (
        READY_WAIT,
        McpHub,
    )  # the hub and the SDK: imported by the worker process only
    from worker.mcp_pins import PinStore

    warn_if_not_durable(r)
    with worker_memory(cfg) as store:
        hub = McpHub(cfg.mcp.servers, PinStore(cfg.home / "mcp" / "pins"))
        try:
            consumer = build_consumer(cfg, r, store=store, hub=hub)
            if consumer.turns.mcp is not None:  # the names relaybot tools shows are the turns'
                hub.reserve(consumer.turns.mcp.reserved)
            # the hub starts with the lease and is given a moment to reach its servers: what the
            # worker takes over at its start (pending after a crash) is offered their tools
            consumer.on_lease.append(lambda: hub.start().wait_ready(
                READY_WAIT, stop=lambda: consumer.control.stopping))  # fmt: skip
            consumer.on_stop.append(hub.stopping)  # a hanging call never holds the stop
            consumer.install_signal_handlers()
            return consumer.run(wait_for_lease=wait_for_lease)
        finally:
            with signals_deferred():  # a second Ctrl-C must not leave a server running
                hub.close()


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT only logged while the MCP servers are being stopped (bounded:
    worker/mcp_hub.py ``CLOSE_WAIT``): a signal's exception there would leave a started server
    running after the worker (the SDK starts it in a session of its own). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    said = False

    def later(signum: int, _frame: FrameType | None) -> None:
        nonlocal said
        if not said:
            said = True
            log.warning("worker.stopping_mcp_servers", signal=signal.Signals(signum).name,
                        detail="the MCP servers are being stopped; a moment")  # fmt: skip

    before = {sig: signal.signal(sig, later) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def warn_if_not_durable(r: redis.Redis) -> None:
    """One warning at start on a Redis that cannot make an accepted message durable: the worker
    runs (it loses nothing of memory), but gateways and ``relaybot chat`` refuse to publish."""
    try:
        probe(r)
    except NotDurable as exc:
        log.warning(
            "redis.not_durable",
            detail=f"{exc}. The gateways and relaybot chat refuse to publish to it",
        )
    except TRANSIENT:  # Redis is away: the worker's own loop waits for it
        pass


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
