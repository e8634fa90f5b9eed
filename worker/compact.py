"""Rebuild a stream so that no storage node keeps the bytes of entries deleted from it.

Redis's ``XDEL`` (and an exact ``XTRIM``) only flags an entry deleted inside the listpack node
that holds it; the node keeps its bytes until every entry in it is deleted. ``BGSAVE`` and
``BGREWRITEAOF`` (whose RDB preamble is the default) write the nodes as they are, so an erased
entry whose node still holds live ones would survive in ``dump.rdb`` and ``appendonly.aof``
although no command shows it any more.

:func:`compact` copies the live entries into a new stream, in one atomic script, and renames it
over the old one. Everything a reader can observe stays as it was:

- every live entry, with its id and fields, in order;
- the stream's last generated id (``XSETID``): a new ``XADD *`` never reuses an erased id, and
  on Redis/Valkey >= 7.0 its ``entries-added`` and ``max-deleted-entry-id`` too;
- every consumer group with its last delivered id (and ``entries-read`` on >= 7.0), its
  consumers, and its pending entries with their consumer, idle time and delivery count
  (``XCLAIM ... FORCE`` creates a pending entry as it was; a pending id whose entry was deleted
  is dropped, as the worker's read script would ack it).

A stream with no live entry keeps no node at all (a node whose last live entry is deleted is
freed), so it is left as it is. Redis answers nobody else for the length of the script: about
15 ms per thousand entries kept (50,000 in 0.6-0.8 s on Redis 6.2 and Valkey, fsync always; the
worker trims acked entries, so a stream is small).
"""

from __future__ import annotations

from typing import Any

import redis

from contract import access
from contract.bus import text

# KEYS: the stream, a scratch key. Returns the number of entries copied (0: left as it was).
_COMPACT = """
local S, T = KEYS[1], KEYS[2]
if redis.call('type', S).ok ~= 'stream' then return 0 end
local function field(list, name)
  for j = 1, #list, 2 do if list[j] == name then return list[j + 1] end end
  return nil
end
local info = redis.call('xinfo', 'stream', S)
if tonumber(field(info, 'length')) == 0 then return 0 end
redis.call('del', T)
local copied, start = 0, '-'
while true do
  local page = redis.call('xrange', S, start, '+', 'COUNT', 500)
  for _, e in ipairs(page) do
    redis.call('xadd', T, e[1], unpack(e[2]))
    copied = copied + 1
  end
  if #page < 500 then break end
  start = '(' .. page[#page][1]
end
local added, maxdel = field(info, 'entries-added'), field(info, 'max-deleted-entry-id')
if added and maxdel then
  redis.call('xsetid', T, field(info, 'last-generated-id'), 'ENTRIESADDED', added,
    'MAXDELETEDID', maxdel)
else
  redis.call('xsetid', T, field(info, 'last-generated-id'))
end
for _, g in ipairs(redis.call('xinfo', 'groups', S)) do
  local name, last, read = field(g, 'name'), field(g, 'last-delivered-id'), field(g, 'entries-read')
  if read then
    redis.call('xgroup', 'create', T, name, last, 'ENTRIESREAD', read)
  else
    redis.call('xgroup', 'create', T, name, last)
  end
  for _, c in ipairs(redis.call('xinfo', 'consumers', S, name)) do
    redis.pcall('xgroup', 'createconsumer', T, name, field(c, 'name'))
  end
  local from = '-'
  while true do
    local pending = redis.call('xpending', S, name, from, '+', 500)
    for _, p in ipairs(pending) do
      redis.call('xclaim', T, name, p[2], 0, p[1], 'IDLE', p[3], 'RETRYCOUNT', p[4], 'FORCE',
        'JUSTID')
    end
    if #pending < 500 then break end
    from = '(' .. pending[#pending][1]
  end
end
redis.call('rename', T, S)
return copied
"""
access.name_script("the worker's stream compaction script", _COMPACT)


def scratch_key(stream: str) -> str:
    return f"{stream}:compacting"


class Compactor:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._script = r.register_script(_COMPACT)

    def compact(self, stream: str) -> int:
        """Rebuild ``stream`` from its live entries (see the module docstring); the number of
        entries copied, 0 when there was nothing to rebuild."""
        done: Any = self._script(keys=[stream, scratch_key(stream)])
        return int(text(done) if isinstance(done, bytes) else done)
