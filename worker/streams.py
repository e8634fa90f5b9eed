"""The inbound streams as the worker reads them: one per channel, read together, in one order.

Each gateway writes only its own channel's stream (``<prefix>inbound:<channel>``; the shipped
Redis ACL gives each gateway's account that one stream), so what arrives on a stream is the
word of that channel's gateway, and the worker holds it to that (worker/turn.py: an entry must
be of its stream's channel). The stream without a channel (``<prefix>inbound``) is written only by
the worker's and the jobs' accounts, and holds what was written before the streams were split;
its entries are taken as they say.

An entry is known by its *stream id*: ``<channel>/<id in its stream>`` (the bare id on the stream
without a channel), unique across the streams; memory deduplicates and replies answer by it.
Everything is read with one consumer group per stream, oldest first across the streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from contract.bus import text
from contract.keys import Keys
from contract.messages import CHANNELS

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Entry:
    """One stream entry as read: where from, its stream id, its raw fields."""

    stream: str  # the Redis key of its stream
    raw_id: str  # its id in that stream
    sid: str  # its stream id: "<channel>/<raw id>", the raw id on the stream without a channel
    channel: str | None  # the channel of its stream (None: the stream without a channel)
    fields: dict[bytes, bytes]


def _order(raw_id: str) -> tuple[int, int]:
    ms, _, seq = raw_id.partition("-")
    return int(ms), int(seq or 0)


class InboundStreams:
    """The worker's view of the inbound streams (see the module docstring)."""

    def __init__(self, r: redis.Redis, keys: Keys, consumer: str) -> None:
        self.r, self.keys, self.consumer = r, keys, consumer
        self.channels: dict[str, str | None] = {keys.inbound: None}
        self.channels.update({keys.inbound_of(c): c for c in CHANNELS})
        self._held: list[Entry] = []  # read, newer than what a fuller stream may still hold

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

    def read_new(self, *, block_ms: int | None, count: int) -> tuple[list[Entry], list[Entry]]:
        """New entries of every stream, oldest first across them, and the ones deleted from
        their stream meanwhile (nothing to answer: to be acked).

        One order across the streams: a read takes at most ``count`` of each, so a stream that
        gave ``count`` may hold more, older than what a quieter stream gave. Only entries up to
        the last one read from such a stream are returned; the newer ones are held for the next
        read (they are this consumer's pending entries, so a crash loses none of them)."""
        held, self._held = self._held, []
        found, gone = self._read(
            dict.fromkeys(self.channels, ">"), block_ms=None if held else block_ms, count=count
        )
        per_stream: dict[str, list[Entry]] = {}
        for entry in found:
            per_stream.setdefault(entry.stream, []).append(entry)
        merged = sorted(held + found, key=lambda e: _order(e.raw_id))
        cut = min(
            (_order(got[-1].raw_id) for got in per_stream.values() if len(got) >= count),
            default=None,
        )
        if cut is not None:
            self._held = [e for e in merged if _order(e.raw_id) > cut]
            merged = [e for e in merged if _order(e.raw_id) <= cut]
        return merged, gone

    def read_pending(self) -> tuple[list[Entry], list[Entry]]:
        """Our oldest pending entry of the first stream that has one (at most one entry: each
        read counts as a delivery of what it returns, so a batch would charge every entry
        queued behind one that crashed the worker), and deleted ones met on the way. Nothing
        found and nothing deleted: nothing is pending."""
        gone: list[Entry] = []
        for stream in self.channels:
            found, deleted = self._read({stream: "0"}, block_ms=None, count=1)
            gone += deleted
            if found:
                return found, gone
        return [], gone

    def _read(
        self, streams: dict[Any, Any], *, block_ms: int | None, count: int
    ) -> tuple[list[Entry], list[Entry]]:
        resp: Any = self.r.xreadgroup(
            Keys.GROUP, self.consumer, streams, count=count, block=block_ms
        )
        found: list[Entry] = []
        gone: list[Entry] = []
        for raw_stream, items in resp or []:
            stream = text(raw_stream)
            for raw_id, fields in items:
                rid = text(raw_id)
                entry = Entry(
                    stream, rid, self.sid(stream, rid), self.channels[stream], fields or {}
                )
                (found if fields is not None else gone).append(entry)
        found.sort(key=lambda e: _order(e.raw_id))
        return found, gone

    def trim(self, retention: float) -> None:
        """Drop acked entries older than ``retention`` seconds; pending ones are never trimmed."""
        now = time.time()
        for stream in self.channels:
            floor_ms = int((now - retention) * 1000)
            summary: Any = self.r.xpending(stream, Keys.GROUP)
            if summary and summary.get("min"):
                floor_ms = min(floor_ms, int(text(summary["min"]).split("-")[0]))
            self.r.xtrim(stream, minid=f"{floor_ms}-0", approximate=True)
