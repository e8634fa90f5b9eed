"""The inbound streams as the worker reads them: one per channel, read together, in one order.

Each gateway writes only its own channel's stream (``<prefix>inbound:<channel>``; the shipped
Redis ACL gives each gateway's account that one stream), so what arrives on a stream is the
word of that channel's gateway, and the worker holds it to that (worker/turn.py: an entry must
be of its stream's channel). The stream without a channel (``<prefix>inbound``) is written only by
the worker's and the jobs' accounts, and holds what was written before the streams were split;
its entries are taken as they say.

An entry is known by its *stream id*: ``<channel>/<id in its stream>`` (the bare id on the stream
without a channel), unique across the streams; memory deduplicates and replies answer by it.
Everything is read with one consumer group per stream, each stream in order (a session lives on
one stream: its order is the stream's; there is none across streams).
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from contract import access
from contract.bus import text
from contract.keys import Keys
from contract.messages import CHANNELS
from worker.deadletter import LUA_BURY, Limits

log = structlog.get_logger(__name__)

# Reads entries for the consumer ARGV[1] of group ARGV[2] and dead-letters, in the same atomic
# step, those the worker must not hold (worker/deadletter.py), so it never receives them.
# KEYS: the dead-letter stream, then the inbound streams.
# ARGV: consumer, group, mode (">": new entries, "0": our oldest pending one), count, max
#       fields, max field bytes, max entry bytes, max attempts, dead-letter maxlen, now, the
#       channels (comma-separated), then per stream its channel ("": the stream without one).
# Returns {items: {"ok", stream index, id, flat fields} | {"dead", index, id, reason}
#                 | {"aside", index, id, reason, flat fields} (delivered too often, within the
#                   bounds: not buried, the worker tells its sender, dead-letters it and acks it
#                   in one step; twice at most, then the read buries it)
#                 | {"gone", index, id} (deleted while pending: acked);
#          per stream (mode ">" only): the group's last delivered id after the read, or "$"}.
# An entry is judged on XRANGE's copy and then delivered with XREADGROUP (same entries: the
# script is atomic), so the results of XREADGROUP are not needed.
_READ = (
    """
local DEAD, TOKEN, GROUP, MODE = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local COUNT = tonumber(ARGV[4])
local MAXF, MAXFB, MAXEB = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local MAXATT, DEAD_MAXLEN, NOW = tonumber(ARGV[8]), ARGV[9], ARGV[10]
local KNOWN, NAMES = {}, ARGV[11]
for c in string.gmatch(ARGV[11], '[^,]+') do KNOWN[c] = true end
"""
    + LUA_BURY
    + """
-- the entry's size in bytes and why it cannot be handled (nil: it can)
local function judge(fields, k)
  local total, why = 0, nil
  local nfields = #fields / 2
  for j = 1, #fields, 2 do
    local name, value = fields[j], fields[j + 1]
    total = total + #name + #value
    if why == nil and #name > MAXFB then
      why = 'entry too large: a field name of ' .. #name .. ' bytes (at most ' .. MAXFB .. ')'
    elseif why == nil and #value > MAXFB then
      why = 'entry too large: field ' .. string.format('%q', string.sub(name, 1, 60)) ..
        ' is ' .. #value .. ' bytes (at most ' .. MAXFB .. ')'
    end
  end
  if nfields > MAXF then
    why = 'entry too large: ' .. nfields .. ' fields (at most ' .. MAXF .. ')'
  elseif why == nil and total > MAXEB then
    why = 'entry too large: ' .. total .. ' bytes (at most ' .. MAXEB .. ')'
  end
  if why == nil and ARGV[11 + k] == '' then
    for j = 1, #fields, 2 do
      if fields[j] == 'channel' and not KNOWN[fields[j + 1]] then
        why = 'no gateway serves channel ' .. string.format('%q', string.sub(fields[j + 1], 1, 60))
          .. ' (the channels are ' .. NAMES .. ')'
      end
    end
  end
  return total, why
end

local items, delivered = {}, {}
for k = 1, #KEYS - 1 do
  local s = KEYS[k + 1]
  delivered[k] = '$'
  if MODE == '0' then
    -- our oldest pending entries, at most COUNT (and about MAXEB bytes), each delivered on its
    -- own (XREADGROUP from the previous one's id: only what is returned counts a delivery)
    local p = redis.call('xpending', s, GROUP, '-', '+', COUNT, TOKEN)
    if #p > 0 then
      local out, prev, total = {}, '0', 0
      for _, q in ipairs(p) do
        if #out > 0 and total >= MAXEB then break end
        local id, times = q[1], tonumber(q[4]) + 1
        redis.call('xreadgroup', 'GROUP', GROUP, TOKEN, 'COUNT', 1, 'STREAMS', s, prev)
        prev = id
        local e = redis.call('xrange', s, id, id)
        if #e == 0 then
          redis.call('xack', s, GROUP, id)
          out[#out + 1] = {'gone', k, id}
        else
          local fields = e[1][2]
          local nbytes, why = judge(fields, k)
          total = total + nbytes
          if why == nil and times > MAXATT and times <= MAXATT + 2 then
            -- delivered too often: handed over, not buried, so the worker tells its sender,
            -- dead-letters and acks it in one step (its commit script); should two more
            -- workers die on it, the next delivery buries it here (so no entry can loop)
            why = 'delivered ' .. times ..
              ' times without completing (it may be crashing the worker)'
            out[#out + 1] = {'aside', k, id, why, fields}
          elseif why == nil and times > MAXATT then
            why = 'delivered ' .. times ..
              ' times without completing (it may be crashing the worker)'
            bury(s, id, fields, why, #fields / 2, nbytes)
            out[#out + 1] = {'dead', k, id, why}
          elseif why then
            bury(s, id, fields, why, #fields / 2, nbytes)
            out[#out + 1] = {'dead', k, id, why}
          else
            out[#out + 1] = {'ok', k, id, fields}
          end
        end
      end
      return {out}
    end
  else
    local last = nil
    for _, g in ipairs(redis.call('xinfo', 'groups', s)) do
      local name, delivered = nil, nil
      for j = 1, #g, 2 do
        if g[j] == 'name' then name = g[j + 1] end
        if g[j] == 'last-delivered-id' then delivered = g[j + 1] end
      end
      if name == GROUP then last = delivered end
    end
    if last then
      delivered[k] = last
      local range = redis.call('xrange', s, '(' .. last, '+', 'COUNT', COUNT)
      local take, used, verdicts = 0, 0, {}
      for i, e in ipairs(range) do
        local nbytes, why = judge(e[2], k)
        if why == nil then
          if take > 0 and used + nbytes > MAXEB then break end
          used = used + nbytes
        end
        verdicts[i] = {nbytes, why}
        take = i
      end
      if take > 0 then
        redis.call('xreadgroup', 'GROUP', GROUP, TOKEN, 'COUNT', take, 'STREAMS', s, '>')
        for i = 1, take do
          local e, v = range[i], verdicts[i]
          if v[2] then
            bury(s, e[1], e[2], v[2], #e[2] / 2, v[1])
            items[#items + 1] = {'dead', k, e[1], v[2]}
          else
            items[#items + 1] = {'ok', k, e[1], e[2]}
          end
        end
        delivered[k] = range[take][1]
      end
    end
  end
end
return {items, delivered}
"""
)
access.name_script("the worker's read script", _READ)


@dataclass(frozen=True)
class Entry:
    """One stream entry as read: where from, its stream id, its raw fields."""

    stream: str  # the Redis key of its stream
    raw_id: str  # its id in that stream
    sid: str  # its stream id: "<channel>/<raw id>", the raw id on the stream without a channel
    channel: str | None  # the channel of its stream (None: the stream without a channel)
    fields: dict[bytes, bytes]
    # delivered too often (max_attempts + 1 or + 2 times): why. Workers kept dying while it
    # was in hand (it may be what kills them, or only what was in flight): the worker tells
    # its sender, without asking the model, and dead-letters and acks it with that reply
    # (Turns.set_aside)
    aside: str = ""

    @property
    def order(self) -> tuple[int, int]:
        """Its place in the one order across the streams (its id's time, then sequence)."""
        return _order(self.raw_id)


def _order(raw_id: str) -> tuple[int, int]:
    ms, _, seq = raw_id.partition("-")
    return int(ms), int(seq or 0)


class InboundStreams:
    """The worker's view of the inbound streams (see the module docstring)."""

    def __init__(
        self, r: redis.Redis, keys: Keys, consumer: str, limits: Limits | None = None
    ) -> None:
        self.r, self.keys, self.consumer = r, keys, consumer
        self.limits = limits or Limits()
        self.channels: dict[str, str | None] = {keys.inbound: None}
        self.channels.update({keys.inbound_of(c): c for c in CHANNELS})
        self._streams = list(self.channels)
        self._read_script = r.register_script(_READ)
        self._progress = False  # the last read script did something (read, buried or acked)
        self.dead_lettered = 0  # by the read script, since this process started
        self._waiter: Any = None  # the connection _wait blocks on

    def sid(self, stream: str, raw_id: str) -> str:
        channel = self.channels[stream]
        return raw_id if channel is None else f"{channel}/{raw_id}"

    def ensure_groups(self) -> None:
        for stream in self.channels:
            try:
                self.r.xgroup_create(stream, Keys.GROUP, id="0", mkstream=True)
                log.info("worker.group_created", stream=stream)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def recover(self) -> dict[str, int]:
        """Claim what dead consumers left pending; how often each of our pending entries was
        delivered, by stream id. XCLAIM with JUSTID does not count as a delivery, so
        ``times_delivered`` counts the worker processes that were handed the entry."""
        deliveries: dict[str, int] = {}
        claimed = 0
        for stream in self.channels:
            claimed += self._claim(stream)
            for info in self.r.xinfo_consumers(stream, Keys.GROUP):
                name = text(info["name"])
                if name != self.consumer and int(info["pending"]) == 0:
                    self.r.xgroup_delconsumer(stream, Keys.GROUP, name)
            pending: Any = self.r.xpending_range(
                stream, Keys.GROUP, min="-", max="+", count=100_000, consumername=self.consumer
            )
            for p in pending:
                deliveries[self.sid(stream, text(p["message_id"]))] = int(p["times_delivered"]) + 1
        if deliveries:
            log.info("worker.recovered", claimed=claimed, pending=len(deliveries))
        return deliveries

    def _claim(self, stream: str) -> int:
        claimed, start = 0, "-"
        while True:
            page: Any = self.r.xpending_range(stream, Keys.GROUP, min=start, max="+", count=1000)
            others = [p["message_id"] for p in page if text(p["consumer"]) != self.consumer]
            if others:
                self.r.xclaim(stream, Keys.GROUP, self.consumer, 0, others, justid=True)
                claimed += len(others)
            if len(page) < 1000:
                return claimed
            start = "(" + text(page[-1]["message_id"])

    def read_new(
        self,
        *,
        block_ms: int | None,
        count: int,
        wake: int | None = None,
        only: Sequence[str] | None = None,
    ) -> tuple[list[Entry], list[Entry]]:
        """New entries of every stream (``only``: of these streams), each stream in order, and
        the ones deleted from their stream meanwhile (nothing to answer: to be acked; always
        none since entries are read by the script, which acks such entries itself).

        Entries are read by a script that dead-letters, inside Redis, what the worker must not
        hold (worker/deadletter.py). A script cannot block, so with ``block_ms`` an idle worker
        waits with :meth:`_wait` and then runs the script again.

        A read takes at most ``count`` of each stream (fewer when they are large). There is no
        order across the streams: a session lives on one stream (its channel's), and the worker
        keeps each session in order (worker/sessions.py), so a flood on one stream does not hold
        back what another brings (the owner's terminal). The entries returned are sorted by id.

        ``wake``: a file descriptor that ends the wait when it becomes readable (a turn
        finished: worker/pool.py)."""
        streams = list(only) if only is not None else self._streams
        deadline = None if block_ms is None else time.monotonic() + block_ms / 1000
        while True:
            found, delivered = self._run(">", count, streams)
            if found:
                break
            if self._progress:  # all it took was dead-lettered: read on at once
                continue
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0 or not self._wait(streams, delivered, left, wake):
                break
        return found, []

    def read_pending(self, count: int = 1) -> tuple[list[Entry], list[Entry]]:
        """Our oldest pending entries of the first stream that has some: at most ``count``
        (and about ``max_entry_bytes`` in all). Each read counts as a delivery of what it
        returns, so a batch charges every entry in it should one of them crash the worker: the
        caller reads one at a time once an entry may be doing so (worker/reader.py). One
        delivered more than ``max_attempts`` times, or that is beyond the bounds, is
        dead-lettered by the script, and one deleted from its stream meanwhile is acked by it;
        the next one is read then. Nothing found: nothing is pending (the second list, entries
        to ack, is always empty)."""
        while True:
            found, _ = self._run("0", count, self._streams)
            if found:
                return found, []
            if not self._progress:
                return [], []

    def _wait(
        self, streams: list[str], after: list[str], seconds: float, wake: int | None = None
    ) -> bool:
        """Block until an entry comes after ``after`` (per stream, the group's last delivered
        id) or ``seconds`` pass, without reading it: XREAD returns whole entries, and one may be
        huge, so its reply is left unread (at most one socket read of it is buffered) and the
        connection dropped. The connection is the waiter's own, so it reconnects at the start of
        the next wait, not on the way to the entry that ended this one. False when ``wake``
        ended it (the caller has other work)."""
        if self._waiter is None:
            self._waiter = self.r.connection_pool.make_connection()
        conn = self._waiter
        try:
            ms = max(1, int(seconds * 1000))
            conn.send_command("XREAD", "BLOCK", ms, "COUNT", 1, "STREAMS", *streams, *after)
            # Our own clock ends the wait, not Redis's answer: Redis notices a BLOCK timeout
            # only when its event loop wakes, as late as its next cron tick (hz 10: 100 ms),
            # and the writer's short waits (until the next flush is due) must end on time.
            if wake is None:
                conn.can_read(timeout=seconds)
                return True
            sock = conn._sock
            waits: list[Any] = [wake] if sock is None else [sock, wake]
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select(waits, [], [], seconds)
                return wake not in ready
            return True
        finally:
            conn.disconnect()

    def _run(self, mode: str, count: int, streams: list[str]) -> tuple[list[Entry], list[str]]:
        """One run of the read script over ``streams``: the entries fit to handle, and per
        stream the group's last delivered id after the read ("$" for a stream without the
        group)."""
        lim = self.limits
        args: list[str | int] = [
            self.consumer, Keys.GROUP, mode, count, lim.max_fields, lim.max_field_bytes,
            lim.max_entry_bytes, lim.max_attempts, lim.dead_max_len, f"{time.time():.3f}",
            ",".join(CHANNELS), *(self.channels[s] or "" for s in streams),
        ]  # fmt: skip
        resp: Any = self._read_script(keys=[self.keys.dead, *streams], args=args)
        delivered = [text(x) for x in resp[1]] if len(resp) > 1 else []
        found: list[Entry] = []
        self._progress = False
        for item in resp[0]:
            tag, k, rid = text(item[0]), int(item[1]), text(item[2])
            stream = streams[k - 1]
            self._progress = True
            if tag == "dead":
                self.dead_lettered += 1
                log.warning(
                    "entry.dead_lettered", stream_id=self.sid(stream, rid), reason=text(item[3])
                )
            elif tag == "gone":
                log.info("entry.gone_while_pending", stream_id=self.sid(stream, rid))
            elif tag == "aside":
                why = text(item[3])
                flat = item[4]
                fields = {flat[j]: flat[j + 1] for j in range(0, len(flat), 2)}
                found.append(
                    Entry(stream, rid, self.sid(stream, rid), self.channels[stream], fields, why)
                )
            else:
                flat = item[3]
                fields = {flat[j]: flat[j + 1] for j in range(0, len(flat), 2)}
                found.append(
                    Entry(stream, rid, self.sid(stream, rid), self.channels[stream], fields)
                )
        found.sort(key=lambda e: e.order)
        return found, delivered

    def trim(self, retention: float) -> None:
        """Drop read-and-acked entries older than ``retention`` seconds.

        Never past what the worker has still to do: not past the group's last delivered id
        (everything after it is unread, however old: messages queued while no worker ran wait
        for one) nor past its oldest pending entry. A stream without the group is not trimmed."""
        now_ms = int(time.time() * 1000)
        for stream in self._streams:
            floor = (max(0, now_ms - int(retention * 1000)), 0)
            groups: Any = self.r.xinfo_groups(stream)
            ours = [g for g in groups if text(g["name"]) == Keys.GROUP]
            if not ours:
                continue
            ms, seq = _order(text(ours[0]["last-delivered-id"]))
            floor = min(floor, (ms, seq + 1))  # MINID keeps ids >= floor: the unread stay
            summary: Any = self.r.xpending(stream, Keys.GROUP)
            if summary and summary.get("min"):
                floor = min(floor, _order(text(summary["min"])))
            self.r.xtrim(stream, minid=f"{floor[0]}-{floor[1]}", approximate=True)

    def trim_dead(self) -> None:
        """Keep the dead-letter stream within ``dead_max_len`` entries and ``dead_retention``
        seconds (gateways' letters too: they add theirs without a cap). Exact, not ``~``: the
        stream is small, and once a minute the cost is nothing."""
        floor_ms = max(0, int((time.time() - self.limits.dead_retention) * 1000))
        self.r.xtrim(self.keys.dead, minid=f"{floor_ms}-0", approximate=False)
        self.r.xtrim(self.keys.dead, maxlen=self.limits.dead_max_len, approximate=False)
