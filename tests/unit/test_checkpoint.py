"""WAL checkpoints run off the writer's connection, and the WAL does not grow without bound."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from structlog.testing import capture_logs

from contract.messages import InboundMessage, Privacy, Reply
from memory.checkpoint import WalCheckpointer
from memory.store import MemoryStore


def test_checkpointer_keeps_the_wal_small(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    store = MemoryStore(path)
    store.set_autocheckpoint(0)  # as the worker runs it
    assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    checkpointer = WalCheckpointer(path, interval=0.05).start()
    try:
        for batch in range(20):
            with store.transaction():
                for i in range(50):
                    n = batch * 50 + i
                    msg = InboundMessage(
                        channel="cli", session="cli:s", conversation="cli:s", sender="me",
                        privacy=Privacy.OWNER, text="x" * 2000, ts=1.0, event_id=f"e{n}",
                    )  # fmt: skip
                    store.append_inbound(msg, f"1-{n}", is_owner=True)
        deadline = time.monotonic() + 5
        while checkpointer.checkpoints < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpointer.checkpoints >= 3
    finally:
        checkpointer.stop()
        store.close()
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # truncated on a clean stop


# -- the WAL stays bounded under sustained load (issue 11: "The WAL stays bounded") ---------------
#
# One writer in short transactions (one message and its reply each, as the worker records an
# entry), a little paced so the checkpoint thread gets the CPU as it does beside the real worker,
# and the checkpointer as the worker runs it, only ticking 50 times as often: the test writes about
# ten times faster than 200 msg/s, so it checks the WAL proportionally more often. A passive
# checkpoint alone never lets the WAL restart while a writer keeps writing, so with it the file
# grows by every write (~45 KB a message: 226 MiB here on the code before this change).

LIMIT = 16 * 2**20  # memory.checkpoint.WAL_SIZE_LIMIT, the documented size of a restarted WAL
BOUND = 3 * LIMIT  # the file may pass the limit by what is written before the next restart
MESSAGES = 4000


def _write(store: MemoryStore, start: int, n: int, wal: Path) -> int:
    """Write messages ``start`` .. ``start + n`` one transaction each; the largest WAL seen."""
    largest = 0
    for k in range(start, start + n):
        msg = InboundMessage(
            channel="cli", session="cli:s", conversation="cli:s", sender="me",
            privacy=Privacy.OWNER, text=f"message {k}: the meeting moved to thursday " * 3,
            ts=1.0, event_id=f"e{k}",
        )  # fmt: skip
        reply = Reply(
            reply_id=f"r{k}", answers=f"1-{k}", channel="cli", session="cli:s",
            conversation="cli:s", text=f"noted {k}", created=1.0,
        )  # fmt: skip
        with store.transaction():
            store.append_inbound(msg, f"1-{k}", is_owner=True)
            store.append_reply(reply, sender="relaybot", privacy=Privacy.OWNER)
        largest = max(largest, _size(wal))
        time.sleep(0.0002)
    return largest


def _size(wal: Path) -> int:
    return wal.stat().st_size if wal.exists() else 0


class _Reader(threading.Thread):
    """A read-only reader in short transactions, as `relaybot status` or a search is."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop, self.reads = path, threading.Event(), 0

    def run(self) -> None:
        with MemoryStore(self.path, readonly=True, cache_rows=0) as reader:
            while not self.stop.wait(0.005):
                reader.counts()
                self.reads += 1


def test_wal_stays_bounded_under_sustained_writes_with_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    wal = path.with_name(path.name + "-wal")
    store = MemoryStore(path)
    store.set_autocheckpoint(0)  # as the worker runs it
    checkpointer = WalCheckpointer(path, interval=0.02).start()
    reader = _Reader(path)
    reader.start()
    try:
        largest = _write(store, 0, MESSAGES, wal)
    finally:
        reader.stop.set()
        reader.join()
        checkpointer.stop()
        store.close()
    assert reader.reads > 0
    assert largest < BOUND, f"the WAL reached {largest / 2**20:.0f} MiB"


def test_a_reader_holding_a_snapshot_holds_the_wal_only_until_it_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    wal = path.with_name(path.name + "-wal")
    store = MemoryStore(path)
    store.set_autocheckpoint(0)
    checkpointer = WalCheckpointer(path, interval=0.02).start()
    try:
        _write(store, 0, 100, wal)
        reader = MemoryStore(path, readonly=True, cache_rows=0)
        reader.conn.execute("BEGIN")
        before = reader.counts()["log"]  # the snapshot this reader now holds
        with capture_logs() as logs:
            held = _write(store, 100, 1000, wal)
            assert reader.counts()["log"] == before  # it still reads its snapshot
            reader.conn.execute("COMMIT")  # ... and lets go
            reader.close()
            # sustained writes go on; the WAL is restarted and truncated within a round or two
            k = 1100
            while _size(wal) > LIMIT and k < 1100 + MESSAGES:
                _write(store, k, 20, wal)
                k += 20
            settled = _size(wal)
            largest_after = _write(store, k, 1000, wal)  # and it stays bounded from then on
    finally:
        checkpointer.stop()
        store.close()
    assert held > LIMIT  # the snapshot really held the WAL (~45 MB written meanwhile)
    assert settled <= LIMIT, f"the WAL stayed at {settled / 2**20:.0f} MiB after the reader left"
    assert largest_after < BOUND
    assert any(e["event"] == "memory.wal_pinned" for e in logs)  # said why the WAL grew
