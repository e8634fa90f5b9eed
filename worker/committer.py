"""The committer: what is done becomes durable, then queued and acked, in that order.

It owns what was handled since the last flush (worker/batch.py: ``Handled``), memory's group
commit and its refusal (``blocked``: memory refuses writes, the worker backs off and says so),
the commit line (the one fenced Lua script that queues the replies, writes the dead letters and
acks the entries: worker/commit_line.py), erasures' copies outside memory once their entries are
acked, and the replies in Redis (worker/replies.py: reconciled after a replay, expired by the
sweep, a periodic duty it registers).

Nothing is acked before its reply is recorded and queued, and a reply is queued in the same
atomic step as the ack, so a replay never queues a reply twice.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import redis
import structlog

from contract.keys import Keys
from memory.errors import FencedOut, MemoryUnwritable
from worker.batch import COMMIT, MEMORY_RETRY_CAP, Batch, Blocked, Handled, Read
from worker.commit_line import CommitLine
from worker.control import Control
from worker.deadletter import dead_letter
from worker.duties import Duties
from worker.erasures import Erasures
from worker.health import Health
from worker.replies import ReplyKeeper
from worker.scrub import Scrubber
from worker.sessions import Sessions
from worker.streams import Entry
from worker.turn import Outcome, Turns

log = structlog.get_logger(__name__)

SWEEP_EVERY = 60.0  # seconds between two sweeps of the reply queues


class LeaseLost(RuntimeError):
    pass


@contextlib.contextmanager
def lease_refusal() -> Iterator[None]:
    """The commit script's refusal (``LEASE``: the worker no longer holds the lease) as
    :class:`LeaseLost`."""
    try:
        yield
    except redis.ResponseError as exc:
        if str(exc).startswith("LEASE"):
            raise LeaseLost(str(exc)) from None
        raise


class Committer:
    def __init__(
        self,
        control: Control,
        r: redis.Redis,
        turns: Turns,
        sessions: Sessions,
        *,
        name: str,
        health: Health,
        duties: Duties,
    ) -> None:
        self.control, self.turns, self.sessions, self.name = control, turns, sessions, name
        self.health = health
        self.keys: Keys = control.cfg.keys
        self._line = CommitLine(r, COMMIT)  # sent now, its answer read later
        self.erasures = Erasures(turns.memory, Scrubber(r, self.keys), duties=duties)
        self.replies = ReplyKeeper(
            r,
            self.keys,
            turns.memory,
            now=turns.clock,
            max_age=control.cfg.delivery.max_age,
            queue=lambda replies: self.flush(Batch(replies=replies)),
        )
        self.handled = Handled()  # done, to be acked once memory committed them
        self.blocked: Blocked | None = None  # memory refuses writes
        self.memory_blocked = ""  # why memory refuses writes now ("" while it takes them)
        self.processed = 0
        health.report(self._facts)
        duties.every(SWEEP_EVERY, self.sweep, name="reply.sweep")

    def _facts(self) -> dict[str, Any]:
        info: dict[str, Any] = {"processed": self.processed}
        if self.memory_blocked:
            info["memory"] = f"blocked: {self.memory_blocked}"
        return info

    def done(self, read: Read, outcome: Outcome) -> None:
        """An entry is done: acked with its reply once memory committed it."""
        self.handled.add(read, outcome, self.turns.memory.commits)

    def waiting(self, now: float) -> bool:
        """Memory refuses writes and the next try is not due yet."""
        return self.blocked is not None and now < self.blocked.until

    def settle(self) -> None:
        """Commit memory's open transaction (raises :class:`MemoryUnwritable`)."""
        try:
            self.turns.settle()
        except FencedOut as exc:
            raise LeaseLost(str(exc)) from None
        if self.blocked is not None:
            self._resumed(self.blocked)

    def block(self, exc: Exception, stream_id: str) -> None:
        """Memory refused a write or a commit: the worker waits before the next try, backing
        off, saying so (log, heartbeat: ``relaybot status``, ``doctor``)."""
        error = str(exc)
        self.memory_blocked = error
        now = time.monotonic()
        blocked = self.blocked
        if blocked is None:
            blocked = self.blocked = Blocked(since=now)
            log.error("memory.write_blocked", stream_id=stream_id, error=error,
                      detail="entries stay pending until memory can be written")  # fmt: skip
        else:
            blocked.delay = min(blocked.delay * 2, MEMORY_RETRY_CAP)
            log.warning("memory.write_retry", stream_id=stream_id, error=error,
                        retry_in=blocked.delay)  # fmt: skip
        blocked.until = now + blocked.delay
        self.health.beat()

    def _resumed(self, blocked: Blocked) -> None:
        log.info("memory.write_resumed", blocked_s=round(time.monotonic() - blocked.since, 1))
        self.blocked = None
        self.memory_blocked = ""
        self.health.beat()

    def finish(self, items: list[tuple[Read, Outcome, int]]) -> None:
        """Queue the replies and ack the entries memory made durable; then what goes once
        acked (erasures' copies outside memory, imports' and summaries' entries)."""
        if not items:
            return
        batch = Batch()
        for read, outcome, _ in items:
            self._add(batch, read.entry, outcome)
        if batch.erasures:
            self.acked()
        self.erasures.finish(batch.replies, batch.erasures)
        self.flush(batch)
        if batch.forget:  # deleted from Redis only once acked
            self.acked()
            self.erasures.forget(batch.forget, rewrite=batch.rewrite)

    def _add(self, batch: Batch, entry: Entry, outcome: Outcome) -> None:
        batch.acks.append(entry)
        reply = outcome.reply
        if reply is not None and outcome.only_if_missing:
            queued = any(r.reply_id == reply.reply_id for r in batch.replies)
            if not queued:
                self.acked()  # a reply queued by the call in flight is held
            if queued or self.replies.held(reply):
                reply = None  # queued before (in this batch, or Redis still has it)
        if outcome.forget_entry and reply is None:  # a summary proposal: applied or refused
            batch.forget.append(entry)
            batch.rewrite |= outcome.rewrite_files
        if reply is None and outcome.erasure is not None:  # a redaction: its copies go too
            batch.erasures.append((None, outcome.erasure))
        if reply is not None:
            if outcome.erasure is not None:
                batch.erasures.append((len(batch.replies), outcome.erasure))
            if outcome.forget_entry:
                batch.forget.append(entry)
                batch.rewrite |= outcome.rewrite_files
            batch.replies.append(reply)
        if outcome.dead_reason is not None:
            log.warning("entry.dead_lettered", stream_id=entry.sid, reason=outcome.dead_reason)
            batch.dead.append(self._dead_fields(entry, outcome))

    def _dead_fields(self, entry: Entry, outcome: Outcome) -> list[str]:
        """The XADD arguments of its dead letter: bounded whatever the entry holds, so the
        commit script cannot fail on it (worker/deadletter.py)."""
        return dead_letter(
            reason=outcome.dead_reason or "",
            stream=entry.stream,
            raw_id=entry.raw_id,
            consumer=self.name,
            fields=outcome.fields,
            dead_at=time.time(),
            max_len=self.control.cfg.worker.dead_max_len,
        )

    def flush(self, batch: Batch) -> None:
        """Queue the replies and ack the entries in one atomic, lease-fenced script. The busy
        mark of a reply's session goes with it, unless another turn of it runs or waits."""
        if not batch.acks and not batch.replies:
            return
        by_stream: dict[str, list[str]] = {}
        for entry in batch.acks:
            by_stream.setdefault(entry.stream, []).append(entry.raw_id)
        idle = {rep.session for rep in batch.replies if not self.sessions.active(rep.session)}
        keys = [self.keys.lease, self.keys.dead, *by_stream]
        keys += [self.keys.reply(rep.session) for rep in batch.replies]
        keys += [self.keys.busy(session) for session in idle]
        args: list[str | int] = [self.name, Keys.GROUP, len(by_stream), len(batch.replies)]
        args.append(len(idle))
        args += [rep.to_json() for rep in batch.replies]
        args.append(len(batch.dead))
        args += [json.dumps(d, ensure_ascii=False) for d in batch.dead]
        for ids in by_stream.values():
            args += [len(ids), *ids]
        with lease_refusal():
            self._line.send(keys, args)
        self.processed += len(batch.acks)
        for entry in batch.acks:
            self.control.deliveries.pop(entry.sid, None)

    def acked(self) -> None:
        """Wait for the commit script in flight (its error raised here): before anything that
        must see its acks and queued replies (worker/commit_line.py)."""
        with lease_refusal():
            self._line.collect()

    def reset(self) -> None:
        """Forget what was handled (Redis went away: it is pending there, and is read again)."""
        self.handled = Handled()
        self._line.reset()  # its acks are read again from Redis

    def sweep(self) -> None:
        """Every minute: expire the replies nobody delivered in time (worker/replies.py)."""
        self.acked()
        try:
            self.replies.sweep()
        except MemoryUnwritable as exc:  # tried again at the next sweep
            log.warning("reply.sweep_unrecorded", error=str(exc))
