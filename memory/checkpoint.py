"""WAL checkpoints off the worker's hot path, and a WAL that stays bounded under sustained load.

SQLite's automatic checkpoint runs inside the commit that crosses the threshold, and in WAL mode
with ``synchronous=NORMAL`` that is where the database file is synced: a few milliseconds added
to one turn in a few hundred, which is the tail of the worker's latency. The worker therefore
turns the automatic checkpoint off and runs checkpoints from this thread, on its own connection.

Why passive checkpoints alone let the WAL grow without bound: a checkpoint copies frames into the
database, but the WAL *file* only starts again from its beginning when a writer opens a write
transaction at a moment when every frame has been copied and no reader is using the WAL. The
automatic checkpoint gets that moment for free (it runs inside the writer's commit, so nothing is
appended while it copies). A passive checkpoint on another thread never does under sustained load:
while it copies, the writer appends, so the writer always finds frames not yet copied, keeps
appending, and the file grows by every write (measured: 336 MB in 60 s at 100 msg/s). A reader
that holds a snapshot also stops a checkpoint at the frames that snapshot still needs.

So every ``interval`` this thread runs a passive checkpoint (never blocks anyone) and, once the WAL
holds ``restart_bytes`` or more and that checkpoint copied everything (no reader holds an old
snapshot), a RESTART checkpoint: it takes the write lock for the moment it needs to copy the last
frames and waits (up to ``busy_ms``) for readers to leave the WAL, so the writer's next transaction
starts the WAL from the beginning, and ``PRAGMA journal_size_limit`` (:data:`WAL_SIZE_LIMIT`, set
by memory.store on the writer's connection) truncates the file back to that size at that commit.
The WAL file therefore stays near ``restart_bytes`` plus what is written in one interval.

A reader that keeps one snapshot open holds the WAL for as long as it does (SQLite cannot
checkpoint frames the snapshot may still need): the WAL grows meanwhile, this thread logs
``memory.wal_pinned`` and does not stall the writer on a restart that cannot succeed, and the WAL is
restarted and truncated within an interval of the reader letting go. Readers (``relaybot status``,
search, the CLIs) open the database read-only and keep their transactions short.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

WAL_RESTART_BYTES = 16 * 2**20  # a WAL this large is restarted (RESTART checkpoint)
WAL_SIZE_LIMIT = 16 * 2**20  # PRAGMA journal_size_limit: the file is truncated to this on restart
BUSY_MS = 200  # how long a RESTART may wait for the writer's transaction and for readers
PINNED_WARN_EVERY = 30.0  # seconds between memory.wal_pinned warnings while a reader holds the WAL


class WalCheckpointer:
    """The checkpoint thread of the worker's memory (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        interval: float = 1.0,
        restart_bytes: int = WAL_RESTART_BYTES,
        busy_ms: int = BUSY_MS,
    ) -> None:
        self.path, self.interval = path, interval
        self.restart_bytes, self.busy_ms = restart_bytes, busy_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self.checkpoints = 0  # checkpoints run (passive and restart)
        self._page_size = 4096
        self._pinned_logged = float("-inf")
        self._held = -1  # frames copied when a reader's snapshot last stopped a checkpoint

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
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_ms)}")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            self._page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            while not self._stop.wait(self.interval):
                self.tick(conn)
            self.checkpoint(conn, "TRUNCATE")  # on a clean stop, leave a small WAL behind
        except sqlite3.Error as exc:
            log.error("memory.checkpointer_failed", error=str(exc))
        finally:
            conn.close()

    def tick(self, conn: sqlite3.Connection) -> None:
        """One round: a passive checkpoint, then a restart if the WAL is large and not pinned."""
        result = self.checkpoint(conn, "PASSIVE")
        if result is None:
            return
        _busy, frames, copied = result
        if frames * self._page_size < self.restart_bytes:
            return
        if copied < frames:  # a reader's snapshot still needs frames
            held, self._held = self._held == copied, copied
            if held:  # the same snapshot as a round ago: a restart would only stall the writer
                self._pinned(frames, copied)
                return
        else:
            self._held = -1
        # the WAL starts again from 0; when the writer or a reader kept it busy for busy_ms, the
        # next round tries again
        self.checkpoint(conn, "RESTART")

    def checkpoint(self, conn: sqlite3.Connection, mode: str) -> tuple[int, int, int] | None:
        """``PRAGMA wal_checkpoint(mode)``: (busy, frames in the WAL, frames copied), or None."""
        try:
            row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()  # mode: a literal
        except sqlite3.Error as exc:
            log.warning("memory.checkpoint_failed", mode=mode, error=str(exc))
            return None
        self.checkpoints += 1
        return int(row[0]), int(row[1]), int(row[2])

    def _pinned(self, frames: int, copied: int) -> None:
        now = time.monotonic()
        if now - self._pinned_logged < PINNED_WARN_EVERY:
            return
        self._pinned_logged = now
        log.warning(
            "memory.wal_pinned",
            wal_bytes=frames * self._page_size,
            uncopied_bytes=(frames - copied) * self._page_size,
            hint="a reader of the memory database holds an old snapshot; the WAL is restarted "
            "and truncated as soon as it lets go",
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
