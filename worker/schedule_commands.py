"""The owner's scheduling commands, applied by the worker: ``schedule.add`` and
``schedule.cancel`` (``relaybot reminders add|cancel``, relaybot/cli_reminders.py).

They come from the owner's terminal as owner commands (worker/commands.py checks that) and go
through the same rules as the model's ``schedule`` tool (worker/schedule_items.py ``place``),
with the owner's limits. The item fires in the session named (``--session``): a terminal
session (``cli:NAME``, or just ``NAME``) is the owner's own; any other session's conversation and
privacy are those of its newest message in memory (a session memory has never seen is refused:
nothing says who would read it). Without a session, the owner's newest terminal chat session.

A command may be replayed (a crash before its ack): ``add`` is idempotent on the command's entry
(memory/schedule.py ``command_key``), and a ``cancel`` recorded with the entry's stream id answers
the same again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, tzinfo
from typing import Any

import structlog

from contract.messages import CHANNELS, Privacy
from contract.timezone import stamp
from memory.errors import ScheduleLimit
from memory.turns import Memory
from memory.types import OWNER
from memory.writer import MemoryStore, schedule
from worker.commands import CommandEntry
from worker.schedule_items import (
    Offer,
    Request,
    Route,
    ScheduleError,
    ScheduleSettings,
    Setter,
    entry_time,
    place,
)
from worker.schedule_rules import describe_recurrence

log = structlog.get_logger(__name__)

TERMINAL = "cli"


def _fail(error: str) -> dict[str, object]:
    return {"ok": False, "error": error}


def _text_arg(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ScheduleError(f"{key} must be a string")
    return value.strip() or None


def session_name(name: str) -> str:
    """A session as ``relaybot reminders add --session`` takes it: ``channel:…`` as is, a bare
    name a terminal session (``NAME`` is ``cli:NAME``, as ``relaybot chat --session NAME``)."""
    channel, sep, _ = name.partition(":")
    return name if sep and channel in CHANNELS else f"{TERMINAL}:{name}"


def route_of(store: MemoryStore, session: str | None) -> Route:
    """Where a command's item fires (see the module docstring); :class:`ScheduleError` when the
    session is unknown."""
    if session is None:
        row = store.owner_row(not_session="", channels=[TERMINAL])
        if row is None:
            raise ScheduleError(
                "no terminal chat session to deliver it in yet: name one with --session NAME "
                "(relaybot chat --session NAME shows what it was sent)"
            )
        session = row.session
    session = session_name(session)
    channel = session.partition(":")[0]
    if channel == TERMINAL:
        return Route(TERMINAL, session, session, Privacy.OWNER.value)
    newest = store.newest_in_session(session)
    if newest is None:
        raise ScheduleError(
            f"unknown session {session!r}: memory has no message in it, so who would read the "
            "reminder is not known (relaybot memory search shows sessions' conversations)"
        )
    return Route(newest.channel, session, newest.conversation, newest.privacy)


def add_command(
    scheduling: ScheduleSettings, memory: Memory, args: dict[str, Any], entry: CommandEntry
) -> dict[str, object]:
    """``schedule.add``: ``{text, at | in, every?, until?, late?, session?}`` → the item set
    (``created`` False for a replay)."""
    cfg = scheduling.config()
    if not cfg.enabled:
        return _fail("scheduling is turned off ([schedule] enabled = false in config.toml)")
    zone = memory.settings.timezone
    now = entry_time(entry.stream_id, scheduling.shift())
    rules = Offer("owner", cfg.min_every, cfg.owner_max_items, None)
    setter = Setter(
        handle=f"{entry.msg.channel}:{entry.msg.sender}",
        entity=OWNER,
        created_by=schedule.command_key(entry.stream_id),
    )

    def run(store: MemoryStore) -> dict[str, object]:
        try:
            request = Request(
                text=_text_arg(args, "text") or "",
                at=_text_arg(args, "at"),
                in_=_text_arg(args, "in"),
                every=_text_arg(args, "every"),
                until=_text_arg(args, "until"),
                late=_text_arg(args, "late"),
            )
            route = route_of(store, _text_arg(args, "session"))
            item, created = place(store, request, route=route, setter=setter, rules=rules,
                                  cfg=cfg, zone=zone or UTC, now=now)  # fmt: skip
        except (ScheduleError, ScheduleLimit) as exc:
            return _fail(str(exc))
        log.info("schedule.added", item=item.id, created=created, due=item.next_due,
                 recurring=item.cron is not None, by="owner command")  # fmt: skip
        return {"created": created, **shown(item, zone)}

    return _applied(memory, run)


def cancel_command(
    scheduling: ScheduleSettings, memory: Memory, args: dict[str, Any], entry: CommandEntry
) -> dict[str, object]:
    """``schedule.cancel``: ``{id}`` → the item cancelled."""
    item_id = args.get("id")
    if not isinstance(item_id, int) or isinstance(item_id, bool) or item_id < 1:
        return _fail("schedule.cancel takes {id}: a reminder's number (relaybot reminders)")
    now = entry_time(entry.stream_id, scheduling.shift())
    reason = f"cancelled by the owner (entry {entry.stream_id})"
    zone = memory.settings.timezone

    def run(store: MemoryStore) -> dict[str, object]:
        done = schedule.cancel(store.conn, item_id, conversation=None, now=now, reason=reason)
        if done is None:
            item = schedule.get(store.conn, item_id)
            if item is None:
                return _fail(f"there is no reminder #{item_id} (relaybot reminders lists them)")
            if item.status != "cancelled" or item.end_reason != reason:  # else: a replay
                return _fail(
                    f"reminder #{item_id} is {item.status} already: nothing to cancel "
                    "(relaybot reminders --all shows it)"
                )
            done = item
        else:
            log.info("schedule.cancelled", item=item_id, by="owner command")
        return shown(done, zone)

    return _applied(memory, run)


def shown(item: schedule.Item, zone: tzinfo | None) -> dict[str, object]:
    """The answer's fields: the item as stored, and its next time and recurrence in words."""
    how = describe_recurrence(item.cron) if item.cron is not None else "once"
    if item.until is not None:  # as `relaybot reminders` shows it
        how += f" until {stamp(item.until, zone)}"
    return {
        "item": item.record(),
        "next": stamp(item.next_due, zone) if item.next_due is not None else None,
        "recurrence": how,
    }


def _applied(memory: Memory, run: Callable[[MemoryStore], dict[str, object]]) -> dict[str, object]:
    """``run`` on the writer's store; memory failing (degraded mode) is the command's error."""
    result: dict[str, object] | None = memory.use(run)
    if result is None:
        return _fail(
            "memory failed while applying the command; nothing was changed (see the worker "
            "log); it is safe to run it again"
        )
    if "error" in result:
        return result
    return {"ok": True, **result}
