"""Driving the worker's production path from a test, one step at a time.

The running worker (worker/consumer.py ``Consumer._serve_once``) reads, hands what it read to the
writer (``Writer.take``), advances it (take in, dispatch to sessions, the pool and the turns,
complete, hand over to the committer), and drains what is in hand when it stops. These helpers
call exactly those methods; they add no path of their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contract.messages import Kind
from worker.consumer import Consumer
from worker.redactions import is_redaction
from worker.streams import Entry
from worker.turn import Outcome, Turns


def handle_entries(consumer: Consumer, entries: Sequence[Entry]) -> None:
    """Handle what was read to the end: every turn finished, recorded, queued and acked (the
    reading loop does the same piece by piece while it reads on: ``Writer.take``, then
    ``Consumer.drain``, which advances the writer until nothing is in hand). Stopping, no new
    turn starts: the entries not started stay pending."""
    if not entries and not consumer.writer.in_hand():
        consumer.turns.memory.idle()
        return
    consumer.writer.take(entries)
    consumer.drain()


def handle_entry(
    turns: Turns,
    stream_id: str,
    raw: Mapping[bytes, bytes] | Mapping[str, str],
    *,
    channel: str | None = None,
) -> Outcome:
    """One entry through the turn's steps on this thread, in the writer's order
    (worker/writer.py): ``Turns.parse`` as it is taken in; a derived entry, an owner command or
    a redaction ``Turns.apply``-ed (a withheld reply's question then answered again as a
    message); a message recorded and its turn begun (``Turns.begin``), memory settled before the
    model call, the call (``Turns.run``, which the pool runs), its reply recorded
    (``Turns.finish``). Its outcome is what the committer would queue and ack once memory
    commits (``channel``: the stream's channel; None, the stream without one)."""
    parsed = turns.parse(stream_id, raw, channel)
    if isinstance(parsed, Outcome):
        return parsed
    if parsed.kind is not Kind.MESSAGE or is_redaction(parsed):
        applied = turns.apply(stream_id, parsed)
        if applied.again is None:
            return applied
        parsed = applied.again  # a withheld reply's question, answered again now
    outcomes, job = turns.begin([(stream_id, parsed)])
    if job is None:
        return outcomes[0] or Outcome()
    turns.settle()  # no write transaction is held across the model call
    return turns.finish(job, turns.run(job))
