"""WAL checkpoints run off the writer's connection, and the WAL does not grow without bound."""

from __future__ import annotations

import time
from pathlib import Path

from contract.messages import InboundMessage, Privacy
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
