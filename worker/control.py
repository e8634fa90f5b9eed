"""What the worker's parts share, and who changes it: the configuration in force (the reloader
replaces it: worker/reload.py), the stop request (the process's signal handler sets it:
worker/consumer.py), and how often each pending entry was delivered (the reader counts them at
start and after an outage, a step's attempts count from them, the committer forgets an entry once
it is acked).

Every part is given the one :class:`Control` in its constructor and reads it when it acts, so a
reload reaches all of them between two rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.config import Config


@dataclass
class Control:
    cfg: Config
    stopping: bool = False  # a signal came: no new turn starts; the turns in flight finish
    signals: int = 0  # how many came (a second one abandons the turns in flight)
    deliveries: dict[str, int] = field(default_factory=dict)  # pending stream id -> deliveries

    @property
    def abandoning(self) -> bool:
        """A second signal came: the turns in hand are left pending (replayed later)."""
        return self.signals > 1
