"""The busy mark: only slow turns are marked, refreshed while they last, never after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import fakeredis

from contract.keys import Keys
from worker.busy import BusySignal


@contextmanager
def turn(busy: BusySignal, session: str) -> Iterator[None]:
    """A turn of the session, as the worker marks it: busy from when it is taken in until its
    reply is queued (worker/writer.py: ``begin``, then ``end``)."""
    busy.begin(session)
    try:
        yield
    finally:
        busy.end(session)


def test_only_a_slow_turn_is_marked_and_no_mark_lands_after_it() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("rb:")
    busy = BusySignal(r, keys, after=0.05, ttl=0.6).start()
    try:
        with turn(busy, "cli:fast"):
            pass
        with turn(busy, "cli:slow"):
            deadline = time.monotonic() + 2
            while not r.exists(keys.busy("cli:slow")) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert r.exists(keys.busy("cli:slow"))
            time.sleep(0.8)  # longer than the TTL: the mark is refreshed while the turn lasts
            assert r.exists(keys.busy("cli:slow"))
        r.delete(keys.busy("cli:slow"))  # what the worker's commit script does with the reply
        time.sleep(0.2)
        assert not r.exists(keys.busy("cli:slow"))
        assert not r.exists(keys.busy("cli:fast"))
    finally:
        busy.stop()
