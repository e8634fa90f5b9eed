"""The worker's periodic duties: what runs "every N seconds" between two rounds of its loop.

A part or a layer that owns a chore registers it here as (interval, function), as rq's worker
keeps its maintenance tasks and dramatiq its middleware, and the loop (worker/consumer.py) runs
whatever is due after each round, in the order they were registered, on the writer thread: no turn
is being begun or finished then, so a duty may write memory and change the configuration. An
interval of 0 runs at every round; an interval may be a function, read at each round (a value a
config reload may change). A duty runs at the first round, then once its interval has passed
since it last ran (time.monotonic).

Who registers what, in the order they run (worker/main.py ``assemble`` builds them): a layer
given the registry before the parts are built (``assemble(duties=...)``), the committer's
erasures (the WAL truncation retried: worker/erasures.py) and reply sweep (worker/committer.py),
the reader (stream trims: worker/reader.py), layer 1 (summary planning: worker/derive.py), the
reloader (config reload and model swap: worker/reload.py), and last the process (the heartbeat's
facts, fresh after a reload: worker/health.py, worker/consumer.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

Interval = float | Callable[[], float]


@dataclass
class Duty:
    name: str
    every: Interval
    run: Callable[[], object]
    last: float | None = None  # when it last ran (time.monotonic), None: never

    def interval(self) -> float:
        return self.every() if callable(self.every) else self.every


class Duties:
    """The registry of periodic duties, run by the worker's loop between rounds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._duties: list[Duty] = []

    def every(self, seconds: Interval, run: Callable[[], object], *, name: str) -> Duty:
        """Register ``run`` to be called every ``seconds`` (0: every round)."""
        if any(duty.name == name for duty in self._duties):
            raise ValueError(f"a duty named {name!r} is registered already")
        duty = Duty(name, seconds, run)
        self._duties.append(duty)
        return duty

    def names(self) -> list[str]:
        return [duty.name for duty in self._duties]

    def run_due(self) -> None:
        """Run each duty whose interval has passed (a round of the loop is over)."""
        for duty in self._duties:
            now = self._clock()
            if duty.last is not None and now - duty.last < duty.interval():
                continue
            duty.last = now
            duty.run()
