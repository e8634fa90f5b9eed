"""What the worker holds between reading entries and acking them, and the script that acks.

Entries are handled (memory written) and then, once memory committed them, acked in batches by
one fenced Redis script that also queues their replies and writes their dead letters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from contract import access
from contract.messages import Reply
from worker.streams import Entry
from worker.turn import Outcome

# KEYS: lease, dead, streams (m), reply keys (n), busy keys (b)
# ARGV: token, group, m, n, b, reply json (n), n_dead, dead letters as JSON arrays of XADD
#       arguments after the key (worker/deadletter.py: bounded, whatever the entry was),
#       then per stream: how many ids, the ids to ack
COMMIT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE this worker no longer holds the worker lease')
end
local m = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local b = tonumber(ARGV[5])
local i = 6
for k = 1, n do
  redis.call('rpush', KEYS[2 + m + k], ARGV[i])
  i = i + 1
end
for k = 1, b do
  redis.call('del', KEYS[2 + m + n + k])
end
local ndead = tonumber(ARGV[i]); i = i + 1
for k = 1, ndead do
  redis.call('xadd', KEYS[2], unpack(cjson.decode(ARGV[i])))  -- MAXLEN ~ n * fields
  i = i + 1
end
local acked = 0
for s = 1, m do
  local c = tonumber(ARGV[i]); i = i + 1
  local ids = {}
  for k = 1, c do ids[k] = ARGV[i]; i = i + 1 end
  acked = acked + redis.call('xack', KEYS[2 + s], ARGV[2], unpack(ids))
end
return acked
"""
access.name_script("the worker's commit script", COMMIT)

MEMORY_RETRY_START, MEMORY_RETRY_CAP = 0.5, 30.0  # seconds between tries while memory refuses


@dataclass(frozen=True, eq=False)
class Read:
    """An entry as read, with its place in the worker's read order and its size in bytes."""

    seq: int
    entry: Entry
    size: int

    @classmethod
    def of(cls, seq: int, entry: Entry) -> Read:
        return cls(seq, entry, sum(len(k) + len(v) for k, v in entry.fields.items()))


@dataclass
class Batch:
    """What one fenced Redis script does, once memory committed it: queue the replies, write the
    dead letters, ack the entries."""

    acks: list[Entry] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    dead: list[list[str]] = field(default_factory=list)
    # (the index of the reply that answers it, None: no reply (a redaction); erasure id)
    erasures: list[tuple[int | None, int]] = field(default_factory=list)
    forget: list[Entry] = field(default_factory=list)  # imports: deleted once acked
    rewrite: bool = False  # Redis rewrites its files after that

    def __len__(self) -> int:
        return len(self.acks)


@dataclass
class Handled:
    """Entries handled since the last flush, each with the number of memory commits when it was
    handled: an entry is durable once a commit followed it (memory's group commit)."""

    started: float = field(default_factory=time.perf_counter)
    items: list[tuple[Read, Outcome, int]] = field(default_factory=list)

    def add(self, read: Read, outcome: Outcome, commits: int) -> None:
        if not self.items:
            self.started = time.perf_counter()
        self.items.append((read, outcome, commits))

    def undurable(self, commits: int) -> list[Read]:
        """Drop and return the entries no commit followed (a failed commit took them)."""
        keep = [item for item in self.items if item[2] < commits]
        lost = [item[0] for item in self.items if item[2] >= commits]
        self.items = keep
        return lost

    def take(self) -> list[tuple[Read, Outcome, int]]:
        items, self.items = self.items, []
        return items


@dataclass
class Blocked:
    """Memory refuses writes: since when, the wait before the next try, and when that is."""

    since: float
    delay: float = MEMORY_RETRY_START
    until: float = 0.0
