"""WAL checkpoints off the worker's hot path.

SQLite's automatic checkpoint runs inside the commit that crosses the threshold, and in WAL mode
with ``synchronous=NORMAL`` that is where the database file is synced: a few milliseconds added
to one turn in a few hundred, which is the tail of the worker's latency. The worker therefore
turns the automatic checkpoint off and runs passive checkpoints from this thread, on its own
connection: a passive checkpoint never blocks the writer, and readers are never blocked in WAL.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


class WalCheckpointer:
    def __init__(self, path: Path, *, interval: float = 1.0) -> None:
        self.path, self.interval = path, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self.checkpoints = 0

    def start(self) -> WalCheckpointer:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.error("memory.checkpointer_unavailable", error=str(exc))
            return
        try:
            conn.execute("PRAGMA busy_timeout = 1000")
            while not self._stop.wait(self.interval):
                self.checkpoint(conn, "PASSIVE")
            self.checkpoint(conn, "TRUNCATE")  # on a clean stop, leave a small WAL behind
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> None:
        try:
            conn.execute(f"PRAGMA wal_checkpoint({mode})")  # mode is one of two literals
            self.checkpoints += 1
        except sqlite3.Error as exc:
            log.warning("memory.checkpoint_failed", mode=mode, error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
