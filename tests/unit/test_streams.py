"""The inbound streams read in one order (worker/streams.py): a stream with more than a read's
worth queued never lets a quieter stream's newer entry go before its older ones."""

from __future__ import annotations

import fakeredis

from contract.keys import Keys
from worker.streams import InboundStreams


def test_one_order_across_streams_when_one_has_a_backlog() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    streams = InboundStreams(r, keys, "c")
    streams.ensure_groups()
    for ms in (1, 2, 3, 4, 5):  # the terminal's backlog
        r.xadd(keys.inbound_of("cli"), {"n": str(ms)}, id=f"{ms}-0")
    r.xadd(keys.inbound_of("matrix"), {"n": "m"}, id="3-1")  # newer than 3-0, older than 4-0
    order: list[str] = []
    for _ in range(5):
        found, gone = streams.read_new(block_ms=10, count=2)
        assert not gone
        order += [e.sid for e in found]
    assert order == ["cli/1-0", "cli/2-0", "cli/3-0", "matrix/3-1", "cli/4-0", "cli/5-0"]
    # the held entry was delivered (pending) all along: a crash would replay it, not lose it
    assert r.xpending(keys.inbound_of("matrix"), Keys.GROUP)["pending"] == 1
