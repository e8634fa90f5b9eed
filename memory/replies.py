"""Replies as memory recorded them, for the worker to put back on their queues.

After Redis lost data, a reply memory holds may never have reached its queue (worker/replies.py
reconciles). A reply row keeps what its queue entry held: its id, the entry it answers, its kind,
channel, session, conversation, text and creation time, and the audience it was written for
(:func:`written_for`); the platform event it replies to is the one of the inbound row of the same
stream id.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from contract.messages import Reply, ReplyKind
from memory.rows import NOT_ERASED
from memory.store import MemoryStore

_FINAL = ("delivered", "failed", "expired", "withheld")
_KINDS = frozenset(k.value for k in ReplyKind)

# the newest rows only (``id >`` a bound): a bounded scan whatever the size of the log
_UNSETTLED = f"""
SELECT o.reply_id, o.stream_id, o.kind, o.channel, o.session, o.conversation, o.text,
       o.platform_ts, coalesce(i.event_id, ''), o.extra
FROM log o LEFT JOIN log i ON i.direction = 'in' AND i.stream_id = o.stream_id
WHERE o.direction = 'out' AND o.id > ? AND o.recorded_ts >= ? AND o.{NOT_ERASED}
  AND NOT EXISTS (SELECT 1 FROM reply_status s
                  WHERE s.reply_id = o.reply_id AND s.status IN {_FINAL})
ORDER BY o.id
"""  # noqa: S608  (constants only)


WRITTEN_FOR = ("privacy", "sender", "audience")


def written_for(raw: object) -> dict[str, Any]:
    """What a reply row's ``extra`` says of the audience its reply was written for (the
    gateway checks it again before posting: its recheck)."""
    try:
        extra = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    if not isinstance(extra, dict):
        return {}
    return {k: extra[k] for k in WRITTEN_FOR if k in extra}


def unsettled_replies(store: MemoryStore, window_s: float, limit: int) -> list[Reply]:
    """See memory.facade.Memory.unsettled_replies."""
    conn = store.conn
    top = conn.execute(
        "SELECT max(id), max(recorded_ts) FROM log WHERE direction = 'out'"
    ).fetchone()
    if top is None or top[0] is None:
        return []
    last_id = conn.execute("SELECT max(id) FROM log").fetchone()[0]
    rows = conn.execute(_UNSETTLED, (int(last_id) - 2 * limit, float(top[1]) - window_s))
    out: list[Reply] = []
    for rid, sid, kind, channel, session, conversation, body, created, event, raw in rows:
        try:
            out.append(
                Reply(
                    reply_id=rid,
                    answers=sid,
                    kind=ReplyKind(kind)
                    if kind in ReplyKind._value2member_map_
                    else ReplyKind.REPLY,
                    channel=channel,
                    session=session,
                    conversation=conversation,
                    in_reply_to=event,
                    text=body,
                    created=float(created),
                    extra=written_for(raw),
                )
            )
        except ValidationError:  # a row the wire would refuse: not queued again
            continue
    return out


def inbound_event(store: MemoryStore, stream_id: str) -> str | None:
    """The platform event id of the inbound entry ``stream_id`` as memory recorded it."""
    found = store.conn.execute(
        "SELECT event_id FROM log WHERE direction = 'in' AND stream_id = ?", (stream_id,)
    ).fetchone()
    return None if found is None or found[0] is None else str(found[0])
