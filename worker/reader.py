"""The reader: what the worker reads next from its inbound streams (worker/streams.py).

It owns the consumer group's view: the groups themselves, the entries this consumer left pending
(replayed first, together after one worker died, one at a time once an entry may be killing
workers), the reconciliation of the replies Redis lost once that replay is done, the pace of new
reads (whole batches while work goes on, the owner's terminal read on whatever the load), and the
streams' trims (a periodic duty it registers). What it reads goes to the writer
(worker/writer.py), whose entries in hand bound how much more may be read.
"""

from __future__ import annotations

import time

import redis

from contract.keys import Keys
from worker.batch import Batch
from worker.committer import Committer
from worker.control import Control
from worker.deadletter import Limits
from worker.duties import Duties
from worker.streams import Entry, InboundStreams
from worker.writer import Writer

TRIM_EVERY = 60.0  # seconds between two trims of the streams and the dead letters
# pending entries delivered at most this often (counting the replay) are replayed together
REPLAY_TOGETHER_UNTIL = 2
# seconds between reads while a batch or more is in hand and work goes on: as often as the worker
# flushes. A read is a write for Redis (it moves entries into the pending list): with durable
# acceptance each one waits for an fsync. Reading on is what lets the owner's terminal overtake a
# flood, so it goes on, only not more often than this.
READ_EVERY = 0.02


class Reader:
    def __init__(
        self,
        control: Control,
        r: redis.Redis,
        writer: Writer,
        committer: Committer,
        *,
        name: str,
        duties: Duties,
    ) -> None:
        self.control, self.r, self.writer, self.committer = control, r, writer, committer
        self.name = name
        self.keys: Keys = control.cfg.keys
        self.streams = self._streams()
        self.reconcile_due = True  # once what was left pending is replayed
        self._last_read = 0.0
        self._cli = self.keys.inbound_of("cli")  # the owner's terminal: read on, whatever
        duties.every(TRIM_EVERY, self.trim, name="stream.trim")

    def _streams(self) -> InboundStreams:
        return InboundStreams(self.r, self.keys, self.name, Limits.of(self.control.cfg.worker))

    def ensure_group(self) -> None:
        self.streams.ensure_groups()

    def recover(self) -> None:
        """Claim what dead consumers left pending, then note how often each was delivered."""
        self._deliveries(self.streams.recover())

    def _deliveries(self, counts: dict[str, int]) -> None:
        self.control.deliveries.clear()
        self.control.deliveries.update(counts)

    def restart(self) -> int:
        """Start over from what Redis holds (it went away): the held entries forgotten, the
        groups made again if Redis lost them, this consumer's pending entries to be re-read and
        the replies reconciled. A Redis outage is not a worker death: it does not count as a
        delivery attempt. How many entries are pending."""
        self.streams = self._streams()
        self.reconcile_due = True  # Redis may have lost replies memory recorded
        self.ensure_group()
        counts = self.streams.recover()
        self._deliveries({sid: max(1, n - 1) for sid, n in counts.items()})
        return len(counts)

    def read(self, *, block_ms: int) -> list[Entry]:
        """Own pending entries first, only with nothing else in hand: together after one worker
        died, one at a time once an entry may be killing workers (:meth:`_replay_count`; each
        read counts as a delivery: worker/streams.py), then new ones. Blocks at most
        ``block_ms`` (less when a turn finishes meanwhile), not at all while there is work."""
        deliveries, writer = self.control.deliveries, self.writer
        if deliveries or self.reconcile_due:
            self.committer.acked()  # what this consumer has pending, which replies Redis holds
        while deliveries:
            if writer.in_hand():  # a replayed entry is in hand: finish it first
                wait = writer.wait_s((block_ms or 0) / 1000)
                if any(sid.startswith("cli/") for sid in deliveries):
                    writer.pool.wait(wait)
                    return []
                # none of the terminal's is left to replay: the owner's new ones go on meanwhile
                return self._read_streams(wait, self.control.cfg.worker.batch, [self._cli])
            found, gone = self.streams.read_pending(self._replay_count())
            if gone:  # deleted from their stream while pending: nothing to answer
                self.committer.flush(Batch(acks=gone))
            if found:
                return found
            if not gone:  # nothing left pending
                deliveries.clear()
        if self.reconcile_due:  # the replay queued its replies: what Redis lost is left
            self.reconcile_due = False
            self.committer.replies.reconcile()
        return self._read_new(writer.wait_s((block_ms or 0) / 1000))

    def _replay_count(self) -> int:
        """How many pending entries to replay at once. After one worker died (each was handed
        to one worker before) they go together, turns side by side as usual; once an entry has
        been handed to two workers that did not finish it, one at a time, so an entry that
        kills the worker is isolated (and dead-lettered after ``max_attempts``) without
        charging the others more deliveries."""
        if max(self.control.deliveries.values(), default=1) <= REPLAY_TOGETHER_UNTIL:
            return self.control.cfg.worker.batch
        return 1

    def _read_new(self, wait: float) -> list[Entry]:
        """New entries, waiting at most ``wait`` seconds. With a batch or more in hand reading
        on is not urgent (every READ_EVERY, whole batches); near the cap only the owner's
        terminal is read on (its messages go first)."""
        batch, room, n = self.control.cfg.worker.batch, self.writer.room(), self.writer.in_hand()
        only = None
        if n >= batch:
            hard_cap = n >= 2 * 10 * batch  # the terminal's entries included
            if time.monotonic() - self._last_read < READ_EVERY or (room < batch and hard_cap):
                self.writer.pool.wait(min(wait, READ_EVERY))
                return []
            if room < batch:
                only, room, wait = [self._cli], batch, 0.0
        self._last_read = time.monotonic()
        return self._read_streams(wait, min(batch, room), only)

    def _read_streams(self, wait: float, count: int, only: list[str] | None) -> list[Entry]:
        """Read new entries (of ``only``'s streams), blocking at most ``wait`` seconds, less when
        a turn finishes meanwhile."""
        pool = self.writer.pool
        if wait > 0 and not pool.arm():  # a turn finished meanwhile: do not block
            wait = 0.0
        try:
            found, gone = self.streams.read_new(
                block_ms=int(wait * 1000), count=count, wake=pool.wake_fd, only=only
            )
        finally:
            pool.disarm()
        if gone:
            self.committer.flush(Batch(acks=gone))
        return found

    def trim(self) -> None:
        """Once a minute: drop acked entries older than the retention (never unread or pending
        ones: worker/streams.py), and keep the dead letters within their length and age."""
        self.committer.acked()
        self.streams.trim(self.control.cfg.worker.stream_retention)
        self.streams.trim_dead()
