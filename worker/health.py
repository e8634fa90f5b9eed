"""What the worker's heartbeat says (``relaybot status`` and ``doctor`` read it).

The heartbeat (contract/liveness.py) beats on a thread of its own; this part owns the facts it
carries. Each part that has something to say registers a source (a function returning its
fields) in its constructor: the committer (entries processed, memory blocked), the writer (turns
running and waiting), the reloader (the config in force, beside the facts). :meth:`beat` gathers
them: at every round of the loop (a duty) and at once when memory blocks or resumes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from contract.keys import Keys
from contract.liveness import Heartbeat

Source = Callable[[], dict[str, Any]]


class Health:
    def __init__(self, r: redis.Redis, keys: Keys, consumer: str) -> None:
        self.consumer, self._keys = consumer, keys
        self.heartbeat = Heartbeat(r, keys, "worker")
        self._sources: list[Source] = []
        self._private: list[Source] = []
        self._config: Source | None = None

    def report(self, source: Source) -> None:
        """Add a source of the heartbeat's facts."""
        self._sources.append(source)

    def report_private(self, source: Source) -> None:
        """Add a source of facts not every process may read (the MCP servers' tools): written
        beside the heartbeat to a key only the worker and the owner's terminal reach
        (``Keys.mcp``; deploy/redis/users.acl), never into the heartbeats hash."""
        self._private.append(source)
        self.heartbeat.private_key = self._keys.mcp

    def report_config(self, source: Source) -> None:
        """The source of the config fields (contract/config_watch.py), beside the facts."""
        self._config = source

    def beat(self) -> None:
        """Gather the facts for the next beat."""
        info: dict[str, Any] = {"consumer": self.consumer}
        for source in self._sources:
            info.update(source())
        self.heartbeat.info = info
        if self._private:
            private: dict[str, Any] = {}
            for source in self._private:
                private.update(source())
            self.heartbeat.private = private
        if self._config is not None:
            self.heartbeat.config = self._config()
