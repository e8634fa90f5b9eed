"""The replies a turn's model gave that memory has not durably recorded yet.

A reply is recorded in memory's open transaction; until a commit makes it durable it *lingers*
here. When memory refuses the write or the commit, or Redis goes away before the entries are
acked, the reply is kept (*unrecorded*) by each entry it answers, and recorded when those entries
come again, so the model is not asked twice, unless an erasure was applied since its turn
started (it may repeat what was erased).
"""

from __future__ import annotations

import structlog

from contract.messages import InboundMessage, Reply
from memory.errors import MemoryUnwritable
from memory.turns import Memory
from memory.types import LogRow
from worker.turn_result import Held, Outcome, reply_from_row

log = structlog.get_logger(__name__)

Ask = tuple[str, InboundMessage, LogRow | None, bool]  # stream id, message, its row, the owner's


class ReplyLedger:
    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        # replies the model gave that memory could not record yet, by each entry they answer
        self._unrecorded: dict[str, Held] = {}
        self._lingering: list[Held] = []  # recorded, not committed yet

    def keep(self, held: Held) -> None:
        """Keep a reply for when its entries come again."""
        for key in held.keys:
            self._unrecorded[key] = held

    def settled(self) -> None:
        """A commit made what lingered durable."""
        self._lingering.clear()

    def lost(self) -> None:
        """A commit failed: the replies it held are kept, to be recorded when their entries are
        handled again (the model is not asked twice)."""
        for held in self._lingering:
            for key in held.keys:
                self._unrecorded[key] = held
        self._lingering.clear()

    def record_held(
        self,
        asks: list[Ask],
        outcomes: list[Outcome | None],
    ) -> list[Ask]:
        """Replies the model gave before memory refused them are recorded now (the model is not
        asked twice); the messages they answer are done. What is left to ask the model."""
        left = []
        slots = [i for i, o in enumerate(outcomes) if o is None]
        taken: dict[str, Held] = {}  # recorded now: the group's other messages it answers
        for slot, ask in zip(slots, asks, strict=True):
            held = taken.get(ask[0]) or self.held_for(ask[0])
            if held is None:
                left.append(ask)
                continue
            if not any(key in taken for key in held.keys):
                for key in held.keys:
                    self._unrecorded.pop(key, None)
                    taken[key] = held
                held.reply = self.record(held, ask[1])
            mine = ask[0] == held.reply.answers
            outcomes[slot] = Outcome(reply=held.reply) if mine else Outcome()
        return left

    def held_for(self, key: str) -> Held | None:
        """The reply kept for this entry, unless an erasure was applied since its turn started
        (it may repeat what was erased: the model is asked again, from what memory holds now)."""
        held = self._unrecorded.get(key)
        if held is not None and held.erasures != self.memory.erasure_mark():
            log.info("turn.held_reply_dropped", reply_id=held.reply.reply_id,
                     reason="an erasure was applied since its turn started")  # fmt: skip
            for other in held.keys:
                self._unrecorded.pop(other, None)
            return None
        return held

    def record(self, held: Held, msg: InboundMessage) -> Reply:
        """Record a reply and the entries it answers; kept (:class:`Held`) if memory refuses, so
        the model is not asked again when the entries come again. The reply to queue: memory's,
        should it hold one for this entry already (the user gets the answer memory keeps)."""
        try:
            with self.memory.write():
                self._tool_results(held, msg)
                row = self.memory.record_reply(held.reply, msg.privacy, held.drew, held.keys[:-1])
        except MemoryUnwritable:
            for key in held.keys:
                self._unrecorded[key] = held
            raise
        self._lingering.append(held)
        if row.reply_id and row.reply_id != held.reply.reply_id:
            log.warning("turn.reply_recorded_before", reply_id=row.reply_id,
                        dropped=held.reply.reply_id)  # fmt: skip
            return reply_from_row(row, msg, in_reply_to=held.reply.in_reply_to)
        return held.reply

    def _tool_results(self, held: Held, msg: InboundMessage) -> None:
        """The results of the turn's MCP calls (worker/mcp_tools.py), as log rows of its
        conversation and privacy, before its reply; none when a reply to its entry is recorded
        already (a replay keeps what the first recording wrote)."""
        reply = held.reply
        if not held.tool_results or self.memory.recorded_reply(reply.answers) is not None:
            return
        for n, call in enumerate(held.tool_results, start=1):
            self.memory.record_tool_result(
                reply, msg.privacy, n, tool=call.exposed, server=call.server, text=call.text
            )
