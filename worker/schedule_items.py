"""Scheduled items as the tools and the owner's commands set them: what a request is, where an
item fires and who set it, and :func:`place`, which checks a request against ``[schedule]`` and
stores it through memory (memory/schedule.py).

The checks, in order: the late policy, the times (worker/schedule_rules.py ``plan``: ``at`` or
``in``, ``every``, ``until``, never more often than the setter's ``min_every``), then the
setter's limits: how many of their items wait, and (contacts) how many they set in the last hour.
Each refusal is a :class:`ScheduleError` or memory's :class:`ScheduleLimit`: one line that says
what to change. Nothing is stored then.

Times are counted from when the entry that asks arrived (:func:`entry_time`: its stream id's
time, on the scheduler's clock), not from when it is handled: a turn or command replayed after a
crash computes the same times, and memory's ``add`` is idempotent on (the entry's key, text,
first due time, cron). A replay is found before the limits are counted (they count the item it
stored), so a replay at the cap is not refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import Literal

from contract.config import ScheduleConfig
from contract.messages import stream_id_ms
from contract.timezone import stamp, zone_key
from memory.errors import ScheduleLimit
from memory.types import OWNER
from memory.writer import MemoryStore, schedule
from worker.schedule_rules import Plan, ScheduleError, describe_recurrence, parse_late, plan

__all__ = ["Offer", "Request", "Route", "ScheduleError", "ScheduleLimit", "ScheduleSettings",
           "Setter", "clipped", "describe", "entry_time", "place"]  # fmt: skip

HOUR = 3600.0
TEXT_SHOWN = 200  # characters of an item's text in a tool's answer


def _no_shift() -> float:
    return 0.0


@dataclass(frozen=True)
class ScheduleSettings:
    """What the scheduling tools and commands need beyond the turn: ``[schedule]`` as it is now
    (a function: a config reload changes it between turns) and the schedule clock's shift from
    Redis's time (contract/clock.py ``ScheduleClock.shift``: 0 but in tests, which move the
    worker's and the jobs' clocks with it), so an item's times are on the clock that fires it."""

    config: Callable[[], ScheduleConfig] = ScheduleConfig
    shift: Callable[[], float] = field(default=_no_shift)


@dataclass(frozen=True)
class Offer:
    """Who a turn's scheduling serves and the limits that follow (hashable: part of the shape of
    the turn's tools, worker/main.py ``tool_shape``, since the descriptions name them)."""

    who: Literal["owner", "contact"]
    min_every: float  # the most often an item may recur, seconds
    max_items: int  # items this sender may have waiting
    per_hour: int | None  # new items this sender may set in an hour (None: no cap)


@dataclass(frozen=True)
class Request:
    """A ``schedule`` call's (or ``relaybot reminders add``'s) arguments, as given."""

    text: str
    at: str | None = None
    in_: str | None = None
    every: str | None = None
    until: str | None = None
    late: str | None = None


@dataclass(frozen=True)
class Route:
    """Where an item fires: the conversation it was set in, as that conversation's entries name
    it, and the conversation's privacy class then."""

    channel: str
    session: str
    conversation: str
    privacy: str


@dataclass(frozen=True)
class Setter:
    """Who set an item: their handle (``channel:sender``, what the per-sender limits count) and
    their entity (what erasing a person finds), and the key of the turn or command that set it."""

    handle: str
    entity: str | None
    created_by: str


def entry_time(stream_id: str, shift: float = 0.0) -> float:
    """When the entry ``stream_id`` arrived, on the scheduler's clock: its stream id's time
    (Redis's, when it was added) plus the clock's shift. An id that is not a stream id (a test's)
    is the local time now."""
    try:
        return stream_id_ms(stream_id) / 1000 + shift
    except ValueError:
        return time.time() + shift


# -- the rules, shared with the owner's commands ---------------------------------------------------


def place(
    store: MemoryStore,
    request: Request,
    *,
    route: Route,
    setter: Setter,
    rules: Offer,
    cfg: ScheduleConfig,
    zone: tzinfo,
    now: float,
) -> tuple[schedule.Item, bool]:
    """Check ``request`` against the rules and store it: (the item, True), or (the item stored
    before, False) for a replay. :class:`ScheduleError` or :class:`ScheduleLimit` (one line that
    says what to change) when it cannot be; nothing is stored then. ``now`` is the time the
    request is counted from (:func:`entry_time`)."""
    text = request.text.strip()
    if not text:
        raise ScheduleError("a reminder needs a text: say what to remind of")
    if len(text) > schedule.MAX_TEXT:
        raise ScheduleError(
            f"a reminder's text is at most {schedule.MAX_TEXT} characters (this one has "
            f"{len(text)}): shorten it"
        )
    late = parse_late(request.late, cfg.late)
    times = plan(at=request.at, in_=request.in_, every=request.every, until=request.until,
                 zone=zone, now=now, min_every=rules.min_every)  # fmt: skip
    conn = store.conn
    again = _stored_before(store, route.conversation, setter.created_by, text, times)
    if again is not None:
        return again, False
    waiting = schedule.count_active(conn, setter=setter.handle)
    if waiting >= rules.max_items:
        raise ScheduleLimit(
            f"too many reminders: {waiting} set by {setter.handle} are waiting, at most "
            f"{rules.max_items}; cancel one first (cancel_scheduled, or relaybot reminders cancel)"
        )
    if rules.per_hour is not None:
        recent = schedule.count_created_since(conn, setter=setter.handle, since=now - HOUR)
        if recent >= rules.per_hour:
            raise ScheduleLimit(
                f"too many new reminders: at most {rules.per_hour} an hour, and {recent} were "
                "set in the last hour; try again later"
            )
    return schedule.add(
        conn, created=now, created_by=setter.created_by, setter_entity=setter.entity,
        setter=setter.handle, channel=route.channel, session=route.session,
        conversation=route.conversation, privacy=route.privacy, text=text,
        first_due=times.first_due, cron=times.cron, until=times.until, late=late,
        grace=cfg.grace, zone=zone_key(zone),
    )  # fmt: skip


def _stored_before(
    store: MemoryStore, conversation: str, created_by: str, text: str, times: Plan
) -> schedule.Item | None:
    """The item this same request stored before (a replayed turn or command), so that the
    limits, which now count it, do not refuse its replay."""
    key = (created_by, times.first_due, times.cron)
    for item in schedule.in_conversation(store.conn, conversation, include_ended=True):
        same = (item.created_by, item.first_due, item.cron) == key
        if same and (item.text == text or item.status == "erased"):  # as memory's own add
            return item
    return None


def describe(item: schedule.Item, zone: tzinfo | None, *, text_chars: int = TEXT_SHOWN) -> str:
    """One line for the model: id, when next, how it recurs, the late policy, who set it (the
    owner as "the owner": her handles are not this conversation's to learn) and its text (cut to
    ``text_chars``)."""
    when = _when(item, zone)
    how = "once" if item.cron is None else describe_recurrence(item.cron)
    if item.until is not None:
        how += f" until {stamp(item.until, _stamp_zone(zone))}"
    text = clipped(item.text, text_chars)
    who = "the owner" if item.setter_entity == OWNER else item.setter
    return f"#{item.id} {when}, {how}, if late: {item.late}; set by {who}: {text}"


def clipped(text: str, chars: int = TEXT_SHOWN) -> str:
    """``text`` cut to ``chars`` characters (an ellipsis says so)."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _stamp_zone(zone: tzinfo | None) -> tzinfo | None:
    return None if zone is UTC else zone


def _when(item: schedule.Item, zone: tzinfo | None) -> str:
    if item.status == "active" and item.next_due is not None:
        return f"next {stamp(item.next_due, _stamp_zone(zone))}"
    return item.status
