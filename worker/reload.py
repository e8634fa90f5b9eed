"""The reloader: a changed config.toml applied between rounds, and the model client swapped.

Every round (a periodic duty; the watcher itself looks at the file every few seconds:
contract/config_watch.py), on the writer, when no turn is being begun or finished: what can
change is applied (the owner's aliases, the turns mode, the model endpoint and its concurrency,
the MCP servers: worker/mcp_hub.py); the rest waits for a restart, said in the log and the
heartbeat (the config fields it reports).
Turns whose model call runs keep the input and the model client they started with; the next turns
get the new settings. A replaced client is closed once no turn runs.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.config import Config, ModelConfig
from contract.config_watch import ConfigWatcher
from worker.control import Control
from worker.derive import Deriver
from worker.duties import Duties
from worker.health import Health
from worker.mcp_tools import WorkerHub
from worker.model import ModelPort, NoModel
from worker.turn import Turns
from worker.writer import Writer

MakeModel = Callable[[ModelConfig], ModelPort]


class Reloader:
    def __init__(
        self,
        control: Control,
        turns: Turns,
        writer: Writer,
        *,
        duties: Duties,
        health: Health,
        watch: ConfigWatcher | None = None,
        make_model: MakeModel | None = None,
        deriver: Deriver | None = None,
        hub: WorkerHub | None = None,
    ) -> None:
        """``make_model``: how a client is made for a changed endpoint (None: the model given
        is kept across reloads, as tests give theirs); ``hub``: the MCP servers' sessions,
        given a changed ``[mcp]`` (worker/mcp_hub.py ``configure``: it does not block)."""
        self.control, self.turns, self.writer, self.hub = control, turns, writer, hub
        self.watch, self.make_model, self.deriver = watch, make_model, deriver
        self._retired: list[ModelPort] = []  # replaced model clients, closed once idle
        duties.every(0, self.maybe_reload, name="config.reload")
        if watch is not None:
            health.report_config(watch.fields)

    def maybe_reload(self) -> None:
        """Between rounds: close the retired clients once no turn runs, and apply a changed
        config.toml (the watcher says when it changed)."""
        if self._retired and not self.writer.jobs:
            for model in self._retired:
                close = getattr(model, "close", None)
                if callable(close):
                    close()
            self._retired.clear()
        if self.watch is None:
            return
        reload = self.watch.poll()
        if reload is not None:
            self.apply_config(reload.config)

    def apply_config(self, cfg: Config) -> None:
        old, self.control.cfg = self.control.cfg, cfg
        endpoint = cfg.model.model_copy(update={"concurrency": old.model.concurrency})
        if endpoint != old.model and self.make_model is not None:
            self._retired.append(self.turns.model)
            self.turns.model = self.make_model(cfg.model)
            if self.deriver is not None:  # a model now (or none any more): how pauses are told
                self.deriver.has_model = not isinstance(self.turns.model, NoModel)
        if cfg.model.concurrency != old.model.concurrency:
            # more turns at once: more threads; fewer: the turns in flight finish, no new one
            # starts until they are below the new limit
            self.writer.pool.grow(cfg.model.concurrency)
            self.writer.sessions.limit = cfg.model.concurrency
        if self.hub is not None and cfg.mcp != old.mcp:
            # servers added, removed or restarted; audiences, allowlists and timeouts hold from
            # the next call on (a running turn's next call is checked again: worker/mcp_tools.py)
            self.hub.configure(cfg.mcp.servers)
        if self.turns.mcp is not None:  # a result's budget, from the next call on
            self.turns.mcp.budget = cfg.mcp.result_chars
        self.turns.reconfigure(cfg)
