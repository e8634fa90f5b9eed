"""What changed in the log since a point: the deriver's view (worker/derive.py) of the
conversations that got new rows, and of those whose summaries an erasure blanked.

Read on the writer's connection, cheaply: each query starts above a bound the caller keeps.
"""

from __future__ import annotations

from memory.store import MemoryStore

_TOP = "SELECT COALESCE(MAX(id), 0) FROM log"
_CHANGES = (
    "SELECT conversation, MAX(id), MAX(recorded_ts) FROM log WHERE id > ? GROUP BY conversation"
)
_ERASED = "SELECT conversation, MAX(erased) FROM summary WHERE erased > ? GROUP BY conversation"
_CONVERSATION_TOP = "SELECT MAX(id) FROM log WHERE conversation = ?"


def log_top(store: MemoryStore) -> int:
    """The newest log id (0: an empty log)."""
    return int(store.conn.execute(_TOP).fetchone()[0])


def new_rows(store: MemoryStore, after_id: int) -> list[tuple[str, int, float]]:
    """Per conversation with rows above ``after_id``: its newest id and recorded time."""
    rows = store.conn.execute(_CHANGES, (after_id,)).fetchall()
    return [(str(c), int(last_id), float(last_ts)) for c, last_id, last_ts in rows]


def blanked_summaries(store: MemoryStore, after: int) -> list[tuple[str, int, int | None]]:
    """Per conversation whose summaries an erasure blanked after ``after``: the newest such
    erasure (summary.erased), and the conversation's newest log id (None: it has no rows left)."""
    conn = store.conn
    out = []
    for conversation, erased in conn.execute(_ERASED, (after,)).fetchall():
        top = conn.execute(_CONVERSATION_TOP, (conversation,)).fetchone()[0]
        out.append((str(conversation), int(erased), None if top is None else int(top)))
    return out
