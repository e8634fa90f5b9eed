"""Dead letters that cannot fail, and the bounds an inbound entry is read within.

A stream entry is whatever a gateway's Redis account chose to XADD: thousands of fields, a field
of 100 MB. The worker must neither crash on it nor hold it, so:

- **bounded on read** -- an entry with more than ``max_entry_fields`` fields, a field name or
  value over ``max_field_bytes`` or more than ``max_entry_bytes`` in all is dead-lettered inside
  Redis, by the script that reads the streams (worker/streams.py), before the worker sees a byte
  of it. So is an entry delivered more than ``max_attempts`` times (it kept killing the worker),
  and one on the stream without a channel that names a channel no gateway serves (its reply
  would wait in a queue nobody reads).
- **a bounded copy** -- a dead letter keeps the reason, where the entry was (``source_stream``,
  ``source_id``), how big it was (``orig_fields``, ``orig_bytes``) and at most
  ``DEAD_COPY_FIELDS`` of its fields as ``orig.<name>``, names and values together at most
  ``DEAD_COPY_BYTES`` (``truncated`` is ``1`` when something was left out). The same layout is
  written by Lua (the read script) and by Python (:func:`dead_letter`, for the consumer's own
  reasons), and the erasure scrubber reads it back (worker/scrub.py).
- **a bounded stream** -- every dead letter is added with ``MAXLEN ~ dead_max_len``, and the worker
  trims letters older than ``dead_retention`` (worker/streams.py), gateways' letters included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contract.config import WorkerConfig

DEAD_COPY_BYTES = 64 * 1024  # of the original entry's names and values, kept in its dead letter
DEAD_COPY_FIELDS = 64
DEAD_NAME_BYTES = 200  # a field name longer than this is cut in the copy
DEAD_REASON_CHARS = 2000


@dataclass(frozen=True)
class Limits:
    """What the worker reads of an inbound entry and keeps of a dead one (WorkerConfig)."""

    max_fields: int = 64
    max_field_bytes: int = 1 << 20
    max_entry_bytes: int = 2 << 20
    max_attempts: int = 5
    dead_max_len: int = 10_000
    dead_retention: float = 30 * 24 * 3600.0

    @classmethod
    def of(cls, worker: WorkerConfig) -> Limits:
        return cls(
            max_fields=worker.max_entry_fields,
            max_field_bytes=worker.max_field_bytes,
            max_entry_bytes=worker.max_entry_bytes,
            max_attempts=worker.max_attempts,
            dead_max_len=worker.dead_max_len,
            dead_retention=worker.dead_retention,
        )


def _cut(value: str, limit: int) -> tuple[str, bool]:
    """``value`` cut to at most ``limit`` UTF-8 bytes (never inside a character)."""
    raw = value.encode("utf-8", "replace")
    if len(raw) <= limit:
        return value, False
    return raw[:limit].decode("utf-8", "ignore"), True


def bounded_copy(fields: Mapping[str, str]) -> tuple[list[str], bool]:
    """The ``orig.<name>``/value pairs a dead letter keeps of ``fields``, and whether anything
    was left out (see the module docstring for the bounds)."""
    out: list[str] = []
    used, truncated = 0, False
    for n, (key, value) in enumerate(fields.items()):
        room = DEAD_COPY_BYTES - used
        if n >= DEAD_COPY_FIELDS or room <= 0:
            return out, True
        name, cut_name = _cut(key, min(DEAD_NAME_BYTES, room))
        kept, cut_value = _cut(value, room - len(name.encode()))
        out += [f"orig.{name}", kept]
        used += len(name.encode()) + len(kept.encode())
        truncated |= cut_name or cut_value
    return out, truncated


def dead_letter(
    *,
    reason: str,
    stream: str,
    raw_id: str,
    consumer: str,
    fields: Mapping[str, str],
    dead_at: float,
    max_len: int,
) -> list[str]:
    """The arguments of the XADD (after the key) of one dead letter: ``MAXLEN ~ max_len *``, then
    flat fields; at most a bounded number of them, each of bounded size, whatever ``fields`` is."""
    copy, truncated = bounded_copy(fields)
    size = sum(len(k.encode("utf-8", "replace")) + len(v.encode("utf-8", "replace"))
               for k, v in fields.items())  # fmt: skip
    return [
        "MAXLEN", "~", str(max_len), "*",
        "reason", _cut(reason, DEAD_REASON_CHARS)[0],
        "source_stream", stream,
        "source_id", raw_id,
        "dead_at", f"{dead_at:.3f}",
        "consumer", consumer,
        "orig_fields", str(len(fields)),
        "orig_bytes", str(size),
        "truncated", "1" if truncated else "0",
        *copy,
    ]  # fmt: skip


# Lua, for the read script: dead-letter entry ``id`` of stream ``stream`` (flat ``fields`` as
# XRANGE gives them) with ``reason``, in the layout of :func:`dead_letter`, and ack it.
# Needs DEAD (the dead-letter key), GROUP, TOKEN (the consumer), NOW, DEAD_MAXLEN in scope.
LUA_BURY = f"""
local function bury(stream, id, fields, reason, nfields, nbytes)
  local out = {{}}
  local used, truncated = 0, 0
  local j = 1
  while j <= #fields do
    local room = {DEAD_COPY_BYTES} - used
    if (j - 1) / 2 >= {DEAD_COPY_FIELDS} or room <= 0 then truncated = 1; break end
    local name = fields[j]
    local value = fields[j + 1]
    local nlimit = math.min({DEAD_NAME_BYTES}, room)
    if #name > nlimit then name = string.sub(name, 1, nlimit); truncated = 1 end
    local vlimit = room - #name
    if #value > vlimit then value = string.sub(value, 1, vlimit); truncated = 1 end
    out[#out + 1] = 'orig.' .. name
    out[#out + 1] = value
    used = used + #name + #value
    j = j + 2
  end
  redis.call('xadd', DEAD, 'MAXLEN', '~', DEAD_MAXLEN, '*',
    'reason', string.sub(reason, 1, {DEAD_REASON_CHARS}), 'source_stream', stream,
    'source_id', id, 'dead_at', NOW, 'consumer', TOKEN, 'orig_fields', tostring(nfields),
    'orig_bytes', tostring(nbytes), 'truncated', tostring(truncated), unpack(out))
  redis.call('xack', stream, GROUP, id)
end
"""
