"""Erasure outside memory: delete what Redis holds of an erased text, then rewrite its files.

After ``memory.erase`` is committed (memory/erasure.py), the worker, before it answers the
command, deletes every copy Redis still holds (memory/copies.py says what they are known by):

- the entries of every inbound stream: the erased rows' own (by stream id), and for an erased
  person or conversation every entry of that sender or conversation still there (unread or
  pending ones too: they are not answered); and an entry the worker cannot read (malformed) or
  made a dead letter of, when it holds an erased text (worker/scrub_text.py): these go first,
  while the erased entries, from which a replayed erasure takes the texts, are still there;
- the replies waiting in reply queues or being delivered (in-flight queues) that answer an
  erased entry, are an erased reply, or belong to an erased conversation;
- the dead letters of such entries (the worker's keep the entry's fields, a gateway's keep the
  raw reply or mail), and every dead letter that holds an erased text;
- what a channel's gateway keeps of an erased message beyond these: its spec's erasure hook
  (contract.channels.Erasure, e.g. a mail's cached reply headers, and the subject in those of
  the kept mails whose subject repeated an erased one's: memory/subjects.py), which also says
  whether a raw payload its gateway made a dead letter of is an erased message's;

then rebuilds every inbound stream and the dead-letter stream from their live entries
(worker/compact.py: ``XDEL`` only flags an entry deleted inside its storage node, whose bytes
Redis would otherwise write out as they are), and has Redis rewrite its persistence files from
what is left: ``BGREWRITEAOF`` (the old
append-only file, which still holds every XADD, is replaced) when the AOF is on, and
``BGSAVE`` (an RDB snapshot, if Redis keeps one, is replaced too). Both wait for the rewrite in
progress first (it was forked before the deletions) and report ``pending`` when Redis has not
finished within ``timeout``: it finishes on its own. Idempotent: a replay deletes nothing more.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
import structlog

from contract import channels as registry
from contract.bus import text
from contract.keys import Keys
from memory.types import Copies
from worker.compact import Compactor
from worker.scrub_text import holds, is_malformed

log = structlog.get_logger(__name__)

PAGE = 1000


@dataclass
class Scrubbed:
    """What one erasure removed from Redis, and the state of Redis's files; ``channels``: the
    counts of the channels' erasure hooks (each named by its hook, 0 when it found nothing)."""

    stream_entries: int = 0
    queued_replies: int = 0
    inflight_replies: int = 0
    dead_letters: int = 0
    channels: dict[str, int] = field(default_factory=dict)
    streams: str = "not rebuilt"
    aof: str = "not enabled"
    rdb: str = "not written"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            k: v for k, v in self.__dict__.items() if k not in ("channels", "streams", "aof", "rdb")
        }
        out.update(self.channels)
        out.update(streams=self.streams, aof=self.aof, rdb=self.rdb)
        return out


class Scrubber:
    def __init__(self, r: redis.Redis, keys: Keys, *, timeout: float = 60.0) -> None:
        self.r, self.keys, self.timeout = r, keys, timeout
        self.compactor = Compactor(r)
        self.streams: dict[str, str | None] = {keys.inbound: None}
        self.streams.update({keys.inbound_of(c): c for c in registry.names()})
        self.hooks = registry.erasures()

    def scrub(self, copies: Copies) -> Scrubbed:
        done = Scrubbed(channels={n: 0 for h in self.hooks.values() for n in h.counts})
        if not copies.texts:  # a replay after a crash: the texts the erased entries still hold
            copies = copies.with_texts(self._known_texts(copies))
        # the copies found only by the text go first, while the entries that hold it are there
        if copies.texts:
            made_of = self._dead_sources(copies)
            for stream in self.streams:
                found = partial(_text_copy, copies, made_of, stream)
                done.stream_entries += self._xdel(stream, found)
        done.dead_letters = self._xdel(self.keys.dead, lambda _i, f: self._dead(copies, f))
        for stream, channel in self.streams.items():
            done.stream_entries += self._xdel(stream, _entry_matcher(copies, channel))
        done.queued_replies = self._lists(self.keys.reply_pattern(), copies)
        done.inflight_replies = self._lists(self.keys.inflight_pattern(), copies)
        for channel, hook in self.hooks.items():
            erased = [e for c, e in sorted(copies.event_ids) if c == channel]
            subjects = [e for c, e in sorted(copies.subject_event_ids) if c == channel]
            if erased or subjects:
                for name, count in hook.scrub(self.r, self.keys, erased, subjects).items():
                    done.channels[name] = done.channels.get(name, 0) + count
        done.streams, done.aof, done.rdb = self.rewrite_files()
        log.info("memory.erasure_scrubbed", erasure=copies.erasure, **done.as_dict())
        return done

    def delete_entry(self, stream: str, raw_id: str) -> None:
        self.r.xdel(stream, raw_id)

    # -- finding ---------------------------------------------------------------------------------

    def _xdel(self, stream: str, match: Callable[[str, dict[str, str]], bool]) -> int:
        doomed = [raw_id for raw_id, fields in _entries(self.r, stream) if match(raw_id, fields)]
        for i in range(0, len(doomed), PAGE):
            self.r.xdel(stream, *doomed[i : i + PAGE])
        return len(doomed)

    def _lists(self, pattern: str, copies: Copies) -> int:
        removed = 0
        for key in self.r.scan_iter(match=pattern, count=PAGE):
            for raw in self.r.lrange(key, 0, -1):
                if _reply(copies, _json(raw)):
                    removed += int(self.r.lrem(key, 0, raw))  # type: ignore[arg-type]
        return removed

    def _known_texts(self, copies: Copies) -> list[str]:
        """The texts of the erased entries, and of the dead letters made of them, still here."""
        found: list[str] = []
        for stream, channel in self.streams.items():
            for raw_id, fields in _entries(self.r, stream):
                sid = raw_id if channel is None else f"{channel}/{raw_id}"
                if sid in copies.entries and fields.get("text"):
                    found.append(fields["text"])
        for _raw_id, fields in _entries(self.r, self.keys.dead):
            stream = fields.get("source_stream", "")
            channel = self.streams.get(stream)
            source = fields.get("source_id", "")
            sid = source if channel is None else f"{channel}/{source}"
            if stream in self.streams and sid in copies.entries and fields.get("orig.text"):
                found.append(fields["orig.text"])
        return found

    def _dead_sources(self, copies: Copies) -> set[tuple[str, str]]:
        """(stream, entry id) of the entries whose dead letter holds an erased text."""
        return {
            (fields.get("source_stream", ""), fields.get("source_id", ""))
            for _raw_id, fields in _entries(self.r, self.keys.dead)
            if holds(copies, fields)
        }

    def _dead(self, copies: Copies, fields: dict[str, str]) -> bool:
        if holds(copies, fields):  # found by the text itself (worker/scrub_text.py)
            return True
        stream = fields.get("source_stream", "")
        if stream in self.streams and fields.get("source_id"):
            channel = self.streams[stream]
            orig = {k.removeprefix("orig."): v for k, v in fields.items() if k.startswith("orig.")}
            if _entry(copies, channel, fields["source_id"], orig):
                return True
        raw = fields.get("raw")
        if raw is None:
            return False
        parsed = _json(raw)
        if parsed:
            return _reply(copies, parsed)
        return any(
            hook.dead_letter(
                raw,
                partial(_event_erased, copies, channel),
                partial(copies.sender_erased, channel),
            )
            for channel, hook in self.hooks.items()
            if hook.dead_letter is not None
        )

    # -- persistence -----------------------------------------------------------------------------

    def rewrite_files(self) -> tuple[str, str, str]:
        """Rebuild the streams, then rewrite the AOF (if on) and the RDB snapshot from the data
        as it is now: (streams, aof, rdb), each a status."""
        streams = self.compact_streams()
        info: Any = self.r.info("persistence")
        aof = "not enabled"
        if int(info.get("aof_enabled", 0)):
            aof = self._background(
                self.r.bgrewriteaof, ("aof_rewrite_in_progress", "aof_rewrite_scheduled"),
                "aof_last_bgrewrite_status",
            )  # fmt: skip
        rdb = self._background(
            self.r.bgsave, ("rdb_bgsave_in_progress", "aof_rewrite_in_progress"),
            "rdb_last_bgsave_status",
        )  # fmt: skip
        return streams, aof, rdb

    def compact_streams(self) -> str:
        """Rebuild the inbound and dead-letter streams so no storage node keeps the bytes of a
        deleted entry (worker/compact.py): every one, not only those this erasure deleted from
        (a replayed erasure deletes nothing, but a crash may have come before the rebuild)."""
        rebuilt, failed = 0, []
        for stream in [*self.streams, self.keys.dead]:
            try:
                rebuilt += int(self.compactor.compact(stream) > 0)
            except redis.ResponseError as exc:
                failed.append(f"{stream}: {exc}")
        if failed:
            log.error("memory.erasure_stream_not_rebuilt", failed=failed)
            return "failed (deleted entries' bytes may stay in Redis's files): " + "; ".join(failed)
        return f"rebuilt ({rebuilt} streams)"

    def _background(self, command: Callable[[], Any], busy: tuple[str, ...], status: str) -> str:
        deadline = time.monotonic() + self.timeout
        started = False
        while time.monotonic() < deadline:
            info: Any = self.r.info("persistence")
            if any(int(info.get(b, 0)) for b in busy):
                time.sleep(0.05)  # one forked before the deletions, or ours, is running
                continue
            if started:
                ok = str(info.get(status, "ok")) == "ok"
                return "rewritten" if ok else f"failed ({status}: {info.get(status)})"
            try:
                command()
            except redis.ResponseError as exc:
                if "in progress" in str(exc) or "can't" in str(exc).lower():
                    time.sleep(0.05)
                    continue
                return f"failed ({exc})"
            started = True
        return f"pending (Redis was still writing after {self.timeout:.0f} s; it finishes alone)"


# -- matching (pure) ------------------------------------------------------------------------------


def _text_copy(
    copies: Copies, made_of: set[tuple[str, str]], stream: str, raw_id: str, fields: dict[str, str]
) -> bool:
    """An entry no reader needs (malformed, or dead-lettered) that holds an erased text."""
    if (stream, raw_id) not in made_of and not is_malformed(fields):
        return False
    return holds(copies, fields)


def _entry_matcher(copies: Copies, channel: str | None) -> Callable[[str, dict[str, str]], bool]:
    return lambda raw_id, fields: _entry(copies, channel, raw_id, fields)


def _entry(copies: Copies, channel: str | None, raw_id: str, fields: dict[str, str]) -> bool:
    sid = raw_id if channel is None else f"{channel}/{raw_id}"
    if sid in copies.entries:
        return True
    if fields.get("conversation") in copies.conversations:
        return True
    return copies.sender_erased(fields.get("channel", ""), fields.get("sender", ""))


def _reply(copies: Copies, reply: dict[str, Any]) -> bool:
    return (
        str(reply.get("answers", "")) in copies.answers
        or str(reply.get("reply_id", "")) in copies.reply_ids
        or str(reply.get("conversation", "")) in copies.conversations
    )


def _event_erased(copies: Copies, channel: str, event_id: str) -> bool:
    return (channel, event_id) in copies.event_ids


def _json(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (ValueError, TypeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _entries(r: redis.Redis, stream: str) -> Iterator[tuple[str, dict[str, str]]]:
    start = "-"
    while True:
        page: Any = r.xrange(stream, min=start, max="+", count=PAGE)
        for raw_id, fields in page:
            yield (
                text(raw_id),
                {
                    text(k): v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                    for k, v in (fields or {}).items()
                },
            )
        if len(page) < PAGE:
            return
        start = "(" + text(page[-1][0])
