"""The writer's transaction, and what depends on how it ends.

``with store.transaction():`` is one ``BEGIN IMMEDIATE … COMMIT`` around many appends (the
worker wraps each batch of stream entries in one). When it commits, the new rows are indexed for
full-text search in the same transaction, join the read caches, and the callbacks registered with
:meth:`Transactions.after_commit` run (never after a rollback). When it rolls back, its rows vanish
and their ids are used again.

:attr:`Transactions.generation` says when what was read earlier may be wrong now: it is bumped
whenever rows below the top of the log change or vanish (a rollback, an erasure or an import
inside the transaction, a reload), and readers that keep what they read (memory.window) compare it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import structlog

from memory.caches import RecentRows

log = structlog.get_logger(__name__)


class Transactions:
    """The transaction state of one store; itself the context manager of one transaction."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        caches: RecentRows,
        index: Callable[[], object],
        index_if_due: Callable[[], object],
    ) -> None:
        self._conn = conn
        self._caches = caches
        self._index = index  # full-text index the batch's rows before the commit
        self._index_if_due = index_if_due  # ... or only when the last indexing is old enough
        self.open = False
        self.generation = 0
        self._after: list[Callable[[], object]] = []

    def __enter__(self) -> None:
        if self.open:
            raise RuntimeError("memory transactions do not nest")
        self._conn.execute("BEGIN IMMEDIATE")
        self.open = True

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.rollback()

    def commit(self, *, lazy_index: bool = False) -> None:
        """Commit; the new rows are full-text indexed in it, or with ``lazy_index`` only when
        indexing is due (the worker's group commits: memory.store)."""
        try:
            (self._index_if_due if lazy_index else self._index)()
            self._conn.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        caches = self._caches
        pending, caches.pending = caches.pending, []
        self.open = False
        caches.added(pending)
        self._ended(committed=True)

    def rollback(self) -> None:
        self.generation += 1
        self._caches.pending = []
        self.open = False
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        finally:
            self._ended(committed=False)

    def changed(self) -> None:
        """Rows below the top changed (an erasure, an import): the caches are dropped."""
        self.generation += 1
        self._caches.invalidate(in_batch=self.open)

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the open transaction commits (never, if it rolls back); at once
        outside a transaction. A failing callback is logged, never raised into the commit."""
        if self.open:
            self._after.append(callback)
        else:
            _run(callback)

    def _ended(self, *, committed: bool) -> None:
        after, self._after = self._after, []
        caches = self._caches
        if caches.sql_only:  # conversation caches read inside it may hold rolled-back rows
            caches.sql_only = False
            caches.clear()
            self.generation += 1  # and so may what was built from them (memory.window)
        if committed:
            for callback in after:
                _run(callback)


def _run(callback: Callable[[], object]) -> None:
    try:
        callback()
    except sqlite3.Error as exc:
        log.error("memory.after_commit_failed", error=str(exc))
