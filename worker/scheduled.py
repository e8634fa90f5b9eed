"""What a ``scheduled`` entry becomes in the worker: one occurrence of an item, delivered once,
in its conversation, for that conversation's audience.

The fire job (worker/schedule_job.py) put only routing on the stream. Taken in on the writer,
inside memory's write (worker/turn.py ``Turns.begin``), an occurrence is:

1. *known* — memory has its inbound row (this entry again after a crash, or the same occurrence
   fired twice): the turn's usual replay path takes it (the reply recorded before is queued
   again only if Redis lost it; an unanswered one is answered once);
2. *refused* — its item is unknown, the entry's channel, session, conversation or privacy are
   not the item's, or its second has not come (more than :data:`EARLY` seconds ahead of the
   schedule's clock) and rq ran no fire job for it: dead-lettered with the reason (the jobs copy
   the routing from the item and fire a second once it has come; anything else was not made by
   them; a clock that stepped back after their fire does not make theirs a forgery);
3. *stale* — the item is no longer active or waits for another occurrence (cancelled, erased, or
   already advanced): acked, with a log line, nothing delivered;
4. *skipped* — later than its grace window under ``late = "skip"``: the skip is recorded and
   the item advanced, no turn. Nothing is said in the conversation (that is what skip means),
   but it is not silent to the owner: ``schedule.skipped`` is logged as a warning, and
   ``relaybot status`` and doctor count the skips of the last day (memory's ``health``);
5. *delivered* — recorded in the log as the item's text under a header (``Reminder #12 due …``,
   how late when late), sent by the scheduler, in the item's conversation with its privacy, so it
   is private to that conversation's audience in search and context like any message; and in the
   same memory transaction the occurrence's run is recorded and the item advanced: a cron item to
   its next occurrence strictly after both now and this one (several missed occurrences fire once),
   a one-off to ``done``. Its turn then runs with the scope a message from whoever set the item
   would have in that conversation (:meth:`Occurrences.scope`: a group's in a group, never the
   owner's private memory; Bob's in Bob's DM); a system note tells the model to deliver the
   reminder now, and when the model is down the text goes out as written, marked
   (:meth:`Occurrences.fallback`).

Lateness is measured on the schedule's clock (contract/clock.py), the one the jobs fire by.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any, TypeVar

import structlog

from contract import timezone
from contract.config import Config
from contract.messages import InboundMessage, Kind
from memory.errors import MemoryUnwritable
from memory.turns import Memory
from memory.types import OWNER, LogRow, ScheduledItem, Scope
from memory.writer import MemoryStore, schedule
from worker import occurrence
from worker.agent import TurnResult
from worker.occurrence import AUDIENCE, LATE, REPLY_TO, SETTER, SETTER_ENTITY
from worker.schedule_rules import (
    describe_late,
    describe_recurrence,
    late_decision,
    next_occurrence,
)
from worker.turn_result import Job, Outcome

log = structlog.get_logger(__name__)

T = TypeVar("T")

MODEL_DOWN = "the model is unavailable"
EARLY = 5.0  # seconds an occurrence may come before its second (one clock, Redis's: jitter only)


# a message recorded (worker/turn.py ``Turns._record``): as recorded, the entry that first recorded
# it, its row, whether the owner sent it, whether it was recorded just now
Recorded = tuple[InboundMessage, str, LogRow | None, bool, bool]


@dataclass(frozen=True)
class Taken:
    """A scheduled entry taken in: done now (``done``), or the message to answer (``msg``,
    recorded under the entry ``first``: this one, or the entry that recorded the occurrence
    before; ``row`` its inbound row, ``fresh`` whether it was recorded just now)."""

    done: Outcome | None = None
    msg: InboundMessage | None = None
    first: str = ""
    row: LogRow | None = None
    fresh: bool = False


class Occurrences:
    """The worker's handling of occurrences (see the module docstring). ``cfg`` gives the
    configuration in force (the owner's name and zone); ``clock`` is the schedule's clock."""

    def __init__(
        self,
        memory: Memory,
        cfg: Callable[[], Config],
        clock: Callable[[], float],
        *,
        fired: Callable[[int], bool] | None = None,
    ) -> None:
        """``fired``: whether the jobs ran the fire job of a second (rq knows): an entry whose
        second the schedule's clock has not reached is theirs all the same when they did (the
        clock stepped back since: an NTP correction of Redis's host), a forgery when not."""
        self.memory, self.cfg, self.clock = memory, cfg, clock
        self.fired = fired or (lambda _due: False)

    def take(self, stream_id: str, msg: InboundMessage) -> Taken:
        """Take a ``scheduled`` entry in: inside ``memory.write()``, so the occurrence's row,
        its run and the item's advance are one transaction. :class:`MemoryUnwritable` when
        memory fails (the entry stays pending, tried again)."""
        item_id, occ = occurrence.ids(msg)
        first = self.memory.first_of_event(msg, stream_id)
        known = self._read(lambda s: s.inbound_row(first))
        if known is not None:  # case 1: recorded before
            log.info("schedule.known", item=item_id, occurrence=occ, first=first)
            return Taken(msg=as_recorded(msg, known), first=first, row=known)
        item = self._read(lambda s: schedule.get(s.conn, item_id))
        refused = refusal(msg, item)
        if refused or item is None:  # case 2
            log.warning("schedule.refused", item=item_id, occurrence=occ, reason=refused)
            return Taken(done=Outcome(dead_reason=refused, fields=msg.to_fields()))
        if not item.active or item.next_due != occ:  # case 3
            ran = self._read(lambda s: schedule.run_of(s.conn, item_id, occ))
            log.info("schedule.stale", item=item_id, occurrence=occ, status=item.status,
                     next_due=item.next_due, recorded=ran)  # fmt: skip
            return Taken(done=Outcome())
        now = self.clock()
        if occ > now + EARLY and not self._fired(occ):  # not made by the jobs (case 2)
            reason = (
                f"a scheduled entry for item #{item_id} at {occ} came {occ - now:.0f} s before "
                "its time (the jobs fire an occurrence only once its second has come)"
            )
            log.warning("schedule.refused", item=item_id, occurrence=occ, reason=reason)
            return Taken(done=Outcome(dead_reason=reason, fields=msg.to_fields()))
        decision, seconds = late_decision(occ, now, grace=item.grace, late=item.late)
        following = self._following(item, occ, now)
        if decision == "skip":  # case 4
            self._record(item, occ, "skipped", stream_id, now=now, following=following)
            log.warning("schedule.skipped", item=item_id, occurrence=occ,
                        late_s=round(seconds), next_due=following,
                        detail="late = skip: not delivered (relaybot reminders --all)")  # fmt: skip
            return Taken(done=Outcome())
        late = seconds if decision == "late" else None  # case 5
        said = self._message(msg, item, occ, late)
        row, _ = self.memory.record_inbound(said, stream_id)
        outcome = "late" if late else "delivered"
        self._record(item, occ, outcome, stream_id, now=now, following=following)
        log.info("schedule.delivering", item=item_id, occurrence=occ, next_due=following,
                 late_s=None if late is None else round(late))  # fmt: skip
        return Taken(msg=said, first=stream_id, row=row, fresh=self.memory.first_sight(row))

    def _fired(self, due: int) -> bool:
        try:
            return bool(self.fired(due))
        except Exception as exc:  # Redis away: not known to be theirs
            log.warning("schedule.fired_unknown", due=due, error=str(exc))
            return False

    def record(self, stream_id: str, msg: InboundMessage) -> Outcome | Recorded:
        """:meth:`take` in memory's write, as the turn records a message (worker/turn.py
        ``Turns._record``): done now, or :data:`Recorded` (never the owner's)."""
        with self.memory.write():
            taken = self.take(stream_id, msg)
        if taken.done is not None or taken.msg is None:
            return taken.done or Outcome()
        return taken.msg, taken.first, taken.row, False, taken.fresh

    # -- the turn ---------------------------------------------------------------------------------

    def prepare(self, msg: InboundMessage, messages: list[dict[str, str]]) -> str | None:
        """An occurrence's model input gets its system note (:meth:`note`); the text to deliver
        when the model cannot word it (:meth:`fallback`). Nothing for any other message."""
        if msg.kind is not Kind.SCHEDULED:
            return None
        messages[0] = {**messages[0], "content": messages[0]["content"] + self.note(msg)}
        return self.fallback(msg)

    def worded(self, job: Job, result: TurnResult, *, no_model: bool) -> TurnResult:
        """The turn's result, or, when the model could not word a reminder (it failed, or none
        is configured), the reminder's text as written, marked."""
        if job.fallback is None or not (result.error or no_model):
            return result
        why = result.text if result.error else "no model is configured"
        log.warning("schedule.delivered_as_written", stream_id=job.keys[-1], error=why)
        return dataclasses.replace(result, text=job.fallback, error=False)

    def scope_of(self, msg: InboundMessage, row: LogRow | None) -> Scope:
        """The scope of a turn (memory's ``scope_of``), but where its current message is an
        occurrence — this turn's, or one answered again after its gateway withheld the reply —
        the person is whoever set the item, never the scheduler: a direct conversation sees
        what its person said elsewhere, and the scheduler's rows elsewhere are every other
        conversation's reminders. Unknown: nobody, the conversation alone."""
        scope = self.memory.scope_of(msg, row)
        if msg.kind is Kind.SCHEDULED:
            entity = msg.extra.get(SETTER_ENTITY)
        elif row is not None and row.kind == Kind.SCHEDULED.value:
            entity = _extra(row).get(SETTER_ENTITY)
        else:
            return scope
        return Scope(
            conversation=scope.conversation,
            privacy=scope.privacy,
            entity=entity if isinstance(entity, str) and entity else None,
        )

    def note(self, msg: InboundMessage) -> str:
        """The system note of an occurrence's turn: what it is and what to do with it."""
        item_id, _ = occurrence.ids(msg)
        who = self._who(msg.extra.get(SETTER), msg.extra.get(SETTER_ENTITY))
        late = msg.extra.get(LATE)
        said = (
            f"\n\nThis turn was not started by anyone writing: the current message is scheduled "
            f"reminder #{item_id}, which {who} set earlier in this conversation, and it is due "
            "now. Deliver the reminder to this conversation now, in your own words, keeping "
            "everything it says; do not set it again and do not ask whether to deliver it."
        )
        if isinstance(late, int | float) and late > 0:
            said += (
                f" It comes {describe_late(float(late))} (the assistant was not running): say so."
            )
        return said

    def fallback(self, msg: InboundMessage) -> str | None:
        """The reply when the model cannot word it: the text as written, marked (None when
        there is no text left: the item was erased)."""
        item_id, _ = occurrence.ids(msg)
        item = self.memory.use(lambda s: schedule.get(s.conn, item_id))
        text = item.text if item is not None else ""
        if not text:
            return None
        late = msg.extra.get(LATE)
        how = "delivered as written"
        if isinstance(late, int | float) and late > 0:
            how += f", {describe_late(float(late))}"
        return f"\u23f0 Reminder: {text}\n({how}: {MODEL_DOWN})"

    # -- parts ------------------------------------------------------------------------------------

    def _message(
        self, msg: InboundMessage, item: ScheduledItem, occ: int, late: float | None
    ) -> InboundMessage:
        """The occurrence as recorded: the item's text under its header, and what the turn
        needs of the item in ``extra`` (never its text)."""
        zone = self._zone()
        head = f"Reminder #{item.id} due {timezone.stamp(occ, _shown(zone))}"
        if late is not None:
            head += f", delivered {describe_late(late)}"
        details = [] if item.cron is None else [describe_recurrence(item.cron)]
        who = self._who(item.setter, item.setter_entity)
        details.append(f"set by {who} on {timezone.stamp(item.created, _shown(zone))}")
        setting = self._setting(item)
        extra: dict[str, Any] = {
            **msg.extra,
            SETTER: item.setter,
            SETTER_ENTITY: item.setter_entity,
            LATE: None if late is None else round(late, 1),
            REPLY_TO: setting[0],
            AUDIENCE: setting[1],
        }
        text = f"{head} ({'; '.join(details)}): {item.text}"
        return msg.model_copy(
            update={"text": text, "extra": {k: v for k, v in extra.items() if v is not None}}
        )

    def _setting(self, item: ScheduledItem) -> tuple[str | None, Any]:
        """The platform event id and the audience of the message that set the item, when it
        was a message of the item's conversation (an owner command is none)."""
        row = self.memory.use(lambda s: s.inbound_row(item.created_by))
        if row is None or row.conversation != item.conversation:
            return None, None
        audience = _extra(row).get("audience")
        return row.event_id or None, audience if isinstance(audience, list) else None

    def _following(self, item: ScheduledItem, occ: int, now: float) -> int | None:
        """The item's next occurrence: strictly after both now and this one, in the owner's zone
        now (None: this was its last; memory ends it at its ``until`` too)."""
        if item.cron is None:
            return None
        try:
            return next_occurrence(item.cron, self._zone(), max(now, float(occ)))
        except ValueError as exc:  # not a cron memory should hold: ended rather than stuck
            log.error("schedule.bad_cron", item=item.id, cron=item.cron, error=str(exc))
            return None

    def _record(
        self,
        item: ScheduledItem,
        occ: int,
        outcome: str,
        stream_id: str,
        *,
        now: float,
        following: int | None,
    ) -> None:
        """The occurrence's run, and the item advanced to ``following`` (memory/schedule.py
        ``record_run``), in the transaction of its row."""
        self._read(lambda s: schedule.record_run(s.conn, item.id, occ, outcome=outcome,
                                                  stream_id=stream_id, at=now,
                                                  next_due=following,
                                                  zone=self._zone_key()))  # fmt: skip

    def _read(self, op: Callable[[MemoryStore], T]) -> T:
        """A read or write of the occurrence's transaction: memory failing raises (the entry
        is tried again later), never a guess (a read that failed is not "not recorded")."""
        box = self.memory.use(lambda s: (op(s),))
        if box is None:
            raise MemoryUnwritable("memory failed while taking a scheduled occurrence")
        return box[0]

    def _zone(self) -> tzinfo:
        return timezone.resolve(self.cfg().owner.timezone).info

    def _zone_key(self) -> str:
        """The zone :meth:`_following` computes in, as memory records it with the advance."""
        return timezone.zone_key(self._zone())

    def _who(self, setter: object, entity: object) -> str:
        if entity == OWNER:
            name = self.cfg().owner.name.strip()
            return name if name and name != "owner" else "the owner"
        return setter if isinstance(setter, str) and setter else "someone"


def _shown(zone: tzinfo) -> tzinfo | None:
    """The zone as :func:`contract.timezone.stamp` takes it (None: UTC)."""
    return None if zone is UTC else zone


def refusal(msg: InboundMessage, item: ScheduledItem | None) -> str:
    """Why an occurrence entry is not one of its item ("" when it is)."""
    item_id, _ = occurrence.ids(msg)
    if item is None:
        return f"a scheduled entry names item #{item_id}, which memory does not have"
    said = {"channel": msg.channel, "session": msg.session,
            "conversation": msg.conversation, "privacy": msg.privacy.value}  # fmt: skip
    for what, value in said.items():
        if value != getattr(item, what):
            return (
                f"a scheduled entry's {what} {value!r} is not its item's ({getattr(item, what)!r})"
            )
    return ""


def _extra(row: LogRow) -> dict[str, Any]:
    try:
        extra = json.loads(row.extra or "{}")
    except ValueError:
        return {}
    return extra if isinstance(extra, dict) else {}


def as_recorded(msg: InboundMessage, row: LogRow) -> InboundMessage:
    """An occurrence's entry as memory recorded it (its text and extra: a replay's turn is
    the first one's)."""
    extra = _extra(row)
    kept = extra if extra.get("type") == occurrence.TYPE else msg.extra
    return msg.model_copy(update={"text": row.text, "extra": kept})
