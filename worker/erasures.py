"""The worker's part of an erasure, once memory has committed it (memory/erasure.py).

Before the ``memory.erase`` command is answered (and acked): the WAL is checkpointed and
truncated (its old frames still hold the text), the copies in Redis are deleted and Redis's
files rewritten (worker/scrub.py), and the answer says, place by place, what was cleaned. A WAL
that a reader keeps from being truncated is reported ``pending`` and retried every second until
it is done (logged as ``memory.erasure_wal_truncated``). If the batch's commit failed, nothing was
erased, and the answer says so. A crash before the answer replays the command: memory answers
from the tombstone, and the places outside it are cleaned again (idempotent).

Process logs need no cleaning: no relaybot log line holds message text (tests/e2e grep them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from contract.messages import Reply
from memory.turns import Memory
from memory.writer import MemoryStore, any_erasure
from worker.duties import Duties
from worker.scrub import Scrubber
from worker.streams import Entry

log = structlog.get_logger(__name__)

LOGS = "nothing to clean: no process log line holds message text"
WAL_PENDING = (
    "pending: a reader holds an old snapshot of the database; the worker truncates the WAL as "
    "soon as it lets go (retried every second, logged as memory.erasure_wal_truncated)"
)


class Erasures:
    def __init__(
        self,
        memory: Memory,
        scrubber: Scrubber,
        *,
        retry_every: float = 1.0,
        duties: Duties | None = None,
    ) -> None:
        self.memory, self.scrubber, self.retry_every = memory, scrubber, retry_every
        # the other places an erasure cleans, by name (layer 2's TODO.md): what each did
        self.cleaners: dict[str, Callable[[], str]] = {}
        # an erasure's truncation may have been pending when a worker died: try once on start
        self.wal_pending = memory.use(_has_erasures) is True
        self._tried = 0.0
        if duties is not None:  # looked at every round; tried every ``retry_every`` seconds
            duties.every(0, self.retry_wal, name="erasure.wal_retry")

    def finish(self, replies: list[Reply], erasures: list[tuple[int | None, int]]) -> None:
        """Clean outside memory what each erasure erased; its answer (``replies[i]``) says where
        (a redaction has none: the log says, ``memory.erasure_scrubbed``)."""
        for index, erasure in erasures:
            cleaned: dict[str, Any] = {"memory_wal": self._wal(), "process_logs": LOGS}
            copies = self.memory.erased_copies(erasure)
            if copies is None:
                cleaned["redis"] = "not cleaned (memory failed): run the same erasure again"
                log.error("memory.erasure_not_scrubbed", erasure=erasure,
                          reason="memory failed while reading the tombstone")  # fmt: skip
            else:
                cleaned["redis"] = self.scrubber.scrub(copies).as_dict()
                self.memory.drop_erased_texts(erasure)
            for place, clean in self.cleaners.items():
                cleaned[place] = clean()
            if index is not None:
                replies[index] = _amend(replies[index], {"cleaned": cleaned})

    def forget(self, entries: list[Entry], *, rewrite: bool) -> None:
        """Delete acked import and summary entries (they hold text memory now keeps);
        with ``rewrite``, an import held text that erasures here had erased: Redis rewrites its
        files, so no old append-only file keeps it."""
        for entry in entries:
            self.scrubber.delete_entry(entry.stream, entry.raw_id)
        if rewrite:
            streams, aof, rdb = self.scrubber.rewrite_files()
            log.info(
                "memory.import_forgotten", entries=len(entries), streams=streams, aof=aof, rdb=rdb
            )

    def retry_wal(self) -> None:
        """A periodic duty (worker/duties.py): finish a pending WAL truncation."""
        if not self.wal_pending or time.monotonic() - self._tried < self.retry_every:
            return
        if self._wal() == "truncated":
            log.info("memory.erasure_wal_truncated")

    def _wal(self) -> str:
        self._tried = time.monotonic()
        done = self.memory.clear_wal()
        self.wal_pending = done is False
        if done is None:
            return "unknown: memory failed (see the worker log)"
        return "truncated" if done else WAL_PENDING


def _has_erasures(store: MemoryStore) -> bool:
    return any_erasure(store)


def _amend(reply: Reply, update: dict[str, Any]) -> Reply:
    try:
        result = json.loads(reply.text)
    except ValueError:
        result = {}
    if not isinstance(result, dict):
        result = {}
    result.update(update)
    changes: dict[str, Any] = {"text": json.dumps(result, ensure_ascii=False, default=str)}
    return reply.model_copy(update=changes)
