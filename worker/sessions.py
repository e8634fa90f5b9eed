"""Which turns may start now: per-session order, the model endpoint's limit, the owner first.

Pure bookkeeping, no I/O (the consumer does the work). Entries wait here, by session, in the
order they were read. A session runs at most one turn at a time, so its turns stay strictly in
order; turns of different sessions run side by side, at most ``limit`` at once (``[model]
concurrency``: what the model endpoint takes at once).

The owner is never queued behind other people's turns: the owner's own conversations (privacy
``owner``: the terminal, the owner's direct chats and mail) are started first, and with a limit
of 2 or more one slot is kept for them, so other people's turns use at most ``limit - 1``. With
a limit of 1 (a local model that takes one request at a time) the owner's turn waits at most for
the one turn already running.

A *group* is what one turn takes from a session: in ``collect`` mode every message waiting in
it, up to the next entry that is not a plain message of the same conversation; in ``followup``
mode one message. Memory commands and redactions are *barriers*: no turn starts while one waits,
and it is applied only when no turn runs (an erasure must not race a turn that read what it
erases).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from contract.messages import InboundMessage, Kind, Privacy
from worker.batch import Read
from worker.redactions import is_redaction


@dataclass(frozen=True, eq=False)
class Item(Read):
    """An entry read and parsed: its place in the read order, the entry, its message."""

    msg: InboundMessage

    @property
    def owner(self) -> bool:
        return self.msg.privacy is Privacy.OWNER

    @property
    def barrier(self) -> bool:
        """An owner command, or a redaction (an erasure: worker/redactions.py)."""
        return self.msg.kind is Kind.COMMAND or is_redaction(self.msg)

    @property
    def record_only(self) -> bool:
        """Recorded, never answered: it needs no model slot."""
        return self.msg.kind is Kind.MESSAGE and self.msg.record_only and not self.barrier

    def joins(self, first: Item) -> bool:
        """Whether this message may be answered by the same turn as ``first``."""
        m, f = self.msg, first.msg
        return (
            not self.barrier
            and m.kind is Kind.MESSAGE
            and f.kind is Kind.MESSAGE
            and m.conversation == f.conversation
            and m.privacy is f.privacy
        )


@dataclass
class Sessions:
    limit: int
    collect: Callable[[InboundMessage], bool]  # collect mode for this message's conversation
    waiting: dict[str, deque[Item]] = field(default_factory=dict)
    running: dict[str, bool] = field(default_factory=dict)  # session -> an owner turn

    @property
    def reserved(self) -> int:
        """Slots kept for the owner's own conversations."""
        return 1 if self.limit > 1 else 0

    n: int = 0  # entries waiting

    def add(self, item: Item) -> None:
        self.waiting.setdefault(item.msg.session, deque()).append(item)
        self.n += 1

    def waiting_items(self) -> Iterator[Item]:
        for queue in self.waiting.values():
            yield from queue

    def count(self) -> int:
        return self.n

    def active(self, session: str) -> bool:
        """A turn of the session runs or waits (its "thinking" mark stays on)."""
        return session in self.running or bool(self.waiting.get(session))

    def has_slot(self, owner: bool) -> bool:
        """Whether a turn may start: at most ``limit`` run; other people's at most ``limit -
        reserved`` (the owner's own turns do not count against theirs: with the owner's turns
        running, the slot kept for the owner is in use already)."""
        n = len(self.running)
        if owner or n >= self.limit:
            return n < self.limit
        others = sum(1 for is_owner in self.running.values() if not is_owner)
        return others < self.limit - self.reserved

    def barrier_waiting(self) -> bool:
        return any(q[0].barrier for q in self.waiting.values() if q)

    def can_start(self) -> bool:
        """A turn could start now: a session waits with no turn of its own running, and the
        model endpoint has a slot for it (what :meth:`runnable` would give, unsorted)."""
        return any(
            q and s not in self.running and self.has_slot(q[0].owner)
            for s, q in self.waiting.items()
        )

    def runnable(self) -> list[str]:
        """Sessions with waiting entries and no turn running: the owner's first, then the
        oldest head first."""
        ready = [s for s, q in self.waiting.items() if q and s not in self.running]
        return sorted(ready, key=lambda s: (not self.waiting[s][0].owner, self.waiting[s][0].seq))

    def next_group(self, session: str) -> list[Item]:
        """Take the next group of ``session`` off its queue (see the module docstring)."""
        queue = self.waiting[session]
        first = queue.popleft()
        group = [first]
        if first.msg.kind is Kind.MESSAGE and self.collect(first.msg):
            while queue and queue[0].joins(first):
                group.append(queue.popleft())
        if not queue:
            del self.waiting[session]
        self.n -= len(group)
        return group

    def next_records(self, session: str) -> list[Item]:
        """Take the record-only entries at the head of ``session``'s queue (recorded without a
        turn: they wait for no model slot)."""
        queue = self.waiting[session]
        group = []
        while queue and queue[0].record_only:
            group.append(queue.popleft())
        if not queue:
            del self.waiting[session]
        self.n -= len(group)
        return group

    def put_back(self, items: list[Item]) -> None:
        """Entries to be taken again (memory refused them): each session in read order."""
        for item in items:
            self.add(item)
        for session, queue in self.waiting.items():
            self.waiting[session] = deque(sorted(queue, key=lambda i: i.seq))

    def start(self, session: str, owner: bool) -> None:
        self.running[session] = owner

    def done(self, session: str) -> None:
        self.running.pop(session, None)

    def clear(self) -> list[Item]:
        """Forget everything waiting (it stays pending in Redis); what was waiting."""
        items = sorted(self.waiting_items(), key=lambda i: i.seq)
        self.waiting.clear()
        self.n = 0
        return items
