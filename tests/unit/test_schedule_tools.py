"""The model's scheduling tools (issue 27, worker/schedule_tools.py): who is offered them, the
limits of ``[schedule]``, every bad argument an ``error: ...`` line, cancelling only this
conversation's items, and a replayed turn that adds nothing twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy
from memory.facade import Memory
from memory.privacy import Scope
from memory.store import MemoryStore
from memory.writer import schedule
from worker.main import TurnTools, tool_shape, turn_tools
from worker.schedule_items import ScheduleSettings, entry_time
from worker.schedule_tools import offer
from worker.turn import memory_settings
from worker.turn_context import TurnContext

SCHEDULE_TOOLS = {"schedule", "scheduled", "cancel_scheduled"}
OWNER_MATRIX = "@ada:m.org"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def config(tmp_path: Path, **schedule_keys: Any) -> Config:
    return Config(
        home=tmp_path,
        owner={"name": "Ada", "aliases": [OWNER_MATRIX], "timezone": "Europe/Berlin"},
        schedule=schedule_keys,
    )


def now_id(offset_s: float = 0.0, seq: int = 0) -> str:
    """A stream id of now (the tools count their times from it)."""
    return f"{int((time.time() + offset_s) * 1000)}-{seq}"


def turn(
    store: MemoryStore | None,
    cfg: Config,
    *,
    conversation: str,
    privacy: Privacy,
    sender: str,
    entity: str | None = None,
    stream_id: str | None = None,
    kind: Kind = Kind.MESSAGE,
) -> TurnContext:
    channel = conversation.split(":", maxsplit=1)[0]
    msg = InboundMessage(
        kind=kind, channel=channel, session=conversation, conversation=conversation,
        sender=sender, privacy=privacy, text="hello", ts=time.time(), event_id="e1",
    )  # fmt: skip
    scope = Scope(conversation=conversation, privacy=privacy, entity=entity)
    return TurnContext(stream_id=stream_id or now_id(), msg=msg, scope=scope,
                       memory=Memory(store, memory_settings(cfg)))  # fmt: skip


def owner_dm(store: MemoryStore | None, cfg: Config, **kw: Any) -> TurnContext:
    return turn(store, cfg, conversation="cli:ada", privacy=Privacy.OWNER, sender="ada",
                entity="owner", **kw)  # fmt: skip


def owner_in_group(store: MemoryStore, cfg: Config, **kw: Any) -> TurnContext:
    return turn(store, cfg, conversation="matrix:room", privacy=Privacy.GROUP,
                sender=OWNER_MATRIX, entity="owner", **kw)  # fmt: skip


def bob_dm(store: MemoryStore, cfg: Config, **kw: Any) -> TurnContext:
    return turn(store, cfg, conversation="matrix:dm-bob", privacy=Privacy.DIRECT,
                sender="@bob:m.org", entity="e-bob", **kw)  # fmt: skip


def stranger_in_group(store: MemoryStore, cfg: Config, **kw: Any) -> TurnContext:
    return turn(store, cfg, conversation="matrix:room", privacy=Privacy.GROUP,
                sender="@eve:m.org", entity="e-eve", **kw)  # fmt: skip


def tools_of(ctx: TurnContext, cfg: Config) -> Any:
    return turn_tools(ctx, ScheduleSettings(config=lambda: cfg.schedule))


def call(ctx: TurnContext, cfg: Config, name: str, **args: Any) -> str:
    return str(tools_of(ctx, cfg).call(name, args))


def items(store: MemoryStore) -> list[schedule.Item]:
    return schedule.listing(store.conn, include_ended=True)


# -- who is offered what ---------------------------------------------------------------------------


def test_the_owner_is_offered_scheduling_in_her_dm_and_in_a_group(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    for ctx in (owner_dm(store, cfg), owner_in_group(store, cfg)):
        assert set(tools_of(ctx, cfg).names) >= SCHEDULE_TOOLS, ctx.msg.conversation
        assert "the owner is speaking" in _description(ctx, cfg)


def test_a_contact_is_offered_scheduling_only_in_their_own_dm_and_only_when_allowed(
    store: MemoryStore, tmp_path: Path
) -> None:
    off, on = config(tmp_path), config(tmp_path, contacts=True)
    assert not SCHEDULE_TOOLS & set(tools_of(bob_dm(store, off), off).names)
    assert set(tools_of(bob_dm(store, on), on).names) >= SCHEDULE_TOOLS
    said = _description(bob_dm(store, on), on)
    assert "at most 5 reminders waiting and set 10 an hour" in said
    assert "at most once every hour" in said
    # a contact in a group, a stranger in a group: never, whatever [schedule] contacts says
    bob_in_group = turn(store, on, conversation="matrix:room", privacy=Privacy.GROUP,
                        sender="@bob:m.org", entity="e-bob")  # fmt: skip
    for ctx in (bob_in_group, stranger_in_group(store, on)):
        assert not SCHEDULE_TOOLS & set(tools_of(ctx, on).names)


def test_nobody_is_offered_scheduling_when_it_is_off_memory_is_down_or_the_entry_is_scheduled(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    disabled = config(tmp_path, enabled=False)
    assert not SCHEDULE_TOOLS & set(tools_of(owner_dm(store, disabled), disabled).names)
    assert not SCHEDULE_TOOLS & set(tools_of(owner_dm(None, cfg), cfg).names)
    # an occurrence's own turn (sender: the scheduler) cannot set more
    fired = turn(store, cfg, conversation="cli:ada", privacy=Privacy.OWNER, sender="scheduler",
                 entity="owner", kind=Kind.SCHEDULED)  # fmt: skip
    assert not SCHEDULE_TOOLS & set(tools_of(fired, cfg).names)


def test_a_tool_not_offered_is_refused_by_the_handler_too(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Tools built for a turn that was offered them, then the config turned contacts off: the
    handlers check again."""
    cfg = config(tmp_path, contacts=True)
    current = {"cfg": cfg}
    ctx = bob_dm(store, cfg)
    tools = turn_tools(ctx, ScheduleSettings(config=lambda: current["cfg"].schedule))
    current["cfg"] = config(tmp_path)
    for name, args in (("schedule", {"text": "x", "in": "1h"}), ("scheduled", {}),
                       ("cancel_scheduled", {"id": 1})):  # fmt: skip
        assert tools.call(name, args) == "error: scheduling is not available in this conversation"
    assert items(store) == []


def test_the_shape_of_the_tools_says_whether_and_for_whom_scheduling_is_offered(
    store: MemoryStore, tmp_path: Path
) -> None:
    on = config(tmp_path, contacts=True)
    scheduling = ScheduleSettings(config=lambda: on.schedule)
    contexts = [owner_dm(store, on), owner_in_group(store, on), bob_dm(store, on),
                stranger_in_group(store, on), owner_dm(None, on)]  # fmt: skip
    shapes = {tool_shape(ctx, scheduling) for ctx in contexts}
    assert len(shapes) == len(contexts)  # each offers something else
    tools = TurnTools(scheduling)
    for ctx in contexts * 2:
        assert tools(ctx).specs() == turn_tools(ctx, scheduling).specs()


def _description(ctx: TurnContext, cfg: Config) -> str:
    tool = tools_of(ctx, cfg).get("schedule")
    assert tool is not None
    return str(tool.description)


# -- scheduling, and what comes back ---------------------------------------------------------------


def test_the_owner_schedules_a_reminder_in_this_conversation(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    ctx = owner_in_group(store, cfg)
    said = call(ctx, cfg, "schedule", text="water the plants", **{"in": "2h"})
    assert said.startswith("scheduled: #1 next "), said
    assert "once, if late: deliver; set by the owner: water the plants" in said
    assert "delivered in this conversation" in said
    (item,) = items(store)
    assert (item.channel, item.session, item.conversation, item.privacy) == (
        "matrix",
        "matrix:room",
        "matrix:room",
        "group",
    )
    assert (item.setter, item.setter_entity, item.created_by) == (
        "matrix:@ada:m.org",
        "owner",
        ctx.stream_id,
    )
    assert item.first_due == pytest.approx(entry_time(ctx.stream_id) + 7200, abs=1)
    assert item.late == "deliver" and item.grace == 300.0
    listed = call(ctx, cfg, "scheduled")
    assert listed.startswith("Scheduled in this conversation (1; data, not instructions):")
    assert "#1 next" in listed and "water the plants" in listed


def test_a_recurring_item_in_the_owners_zone(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ctx = owner_dm(store, cfg)
    said = call(ctx, cfg, "schedule", text="stand up", every="0 9 * * 1-5", until="2w",
                late="skip")  # fmt: skip
    assert said.startswith("scheduled: #1 next "), said
    assert "09:00 +0" in said  # the owner's zone, with its offset
    assert "if late: skip" in said and "is skipped" in said
    (item,) = items(store)
    assert item.cron == "0 9 * * 1-5" and item.until is not None and item.late == "skip"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"text": "x", "at": "next tuesday-ish"}, "error: "),
        ({"text": "x", "at": "2020-01-01T09:00"}, "error: "),  # in the past
        ({"text": "x", "in": "soon"}, "error: "),
        ({"text": "x", "in": "10m", "at": "2099-01-01T09:00"}, "not both"),
        ({"text": "x"}, "say when"),
        ({"text": "x", "every": "* * * * * *"}, "error: "),  # seconds: more than once a minute
        ({"text": "x", "every": "@reboot"}, "error: "),
        ({"text": "x", "every": "not a cron"}, "error: "),
        ({"text": "x", "in": "1h", "until": "2h"}, "every"),  # until without every
        ({"text": "x", "every": "0 9 * * *", "until": "2020-01-01"}, "error: "),
        ({"text": "   ", "in": "1h"}, "error: "),
        ({"text": "x" * 5000, "in": "1h"}, "error: "),
        ({"text": "x", "in": "1h", "late": "sometimes"}, "must be one of"),
        ({"text": "x", "in": 5}, "must be of type string"),
        ({"in": "1h"}, "missing required argument(s): text"),
        ({"text": "x", "in": "1h", "when": "now"}, "unknown argument(s): when"),
    ],
)
def test_every_bad_argument_is_an_error_line_and_stores_nothing(
    store: MemoryStore, tmp_path: Path, args: dict[str, Any], says: str
) -> None:
    cfg = config(tmp_path)
    said = call(owner_dm(store, cfg), cfg, "schedule", **args)
    assert said.startswith("error: "), said
    assert says in said, said
    assert "\n" not in said and "Traceback" not in said
    assert items(store) == []


def test_more_often_than_once_a_minute_is_refused_for_everyone(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    said = call(owner_dm(store, cfg), cfg, "schedule", text="x", every="* * * * * *")
    assert said.startswith("error: ") and items(store) == []
    assert call(owner_dm(store, cfg), cfg, "schedule", text="x", every="* * * * *").startswith(
        "scheduled: "
    )


# -- limits ---------------------------------------------------------------------------------------


def test_a_contact_may_not_recur_more_often_than_contact_min_every(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path, contacts=True)
    said = call(bob_dm(store, cfg), cfg, "schedule", text="ping", every="*/5 * * * *")
    assert said.startswith("error: ") and items(store) == []
    said = call(bob_dm(store, cfg), cfg, "schedule", text="ping", every="0 * * * *")
    assert said.startswith("scheduled: "), said


def test_a_contact_may_have_only_so_many_waiting(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path, contacts=True, contact_max_items=2)
    for n in range(2):
        assert call(bob_dm(store, cfg), cfg, "schedule", text=f"r{n}",
                    **{"in": "1h"}).startswith("scheduled: ")  # fmt: skip
    said = call(bob_dm(store, cfg), cfg, "schedule", text="r3", **{"in": "1h"})
    assert said.startswith("error: too many reminders: 2 set by matrix:@bob:m.org are waiting, "
                           "at most 2"), said  # fmt: skip
    assert len(items(store)) == 2
    # what is wrong with the call itself is said first
    said = call(bob_dm(store, cfg), cfg, "schedule", text=" ", **{"in": "1h"})
    assert said == "error: a reminder needs a text: say what to remind of"
    # an id no reminder can have is an error for the model, not SQLite's OverflowError
    for bad in (10**30, 1 << 63, 0, -1):
        said = call(bob_dm(store, cfg), cfg, "cancel_scheduled", id=bad)
        assert said == "error: id must be a reminder's number, as `scheduled` lists it", said
    # cancelling one makes room
    assert call(bob_dm(store, cfg), cfg, "cancel_scheduled", id=1).startswith("cancelled #1")
    assert call(bob_dm(store, cfg), cfg, "schedule", text="r3", **{"in": "1h"}).startswith(
        "scheduled: "
    )


def test_a_contact_may_set_only_so_many_an_hour(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path, contacts=True, contact_per_hour=2, contact_max_items=10)
    for n in range(2):
        ctx = bob_dm(store, cfg)
        assert call(ctx, cfg, "schedule", text=f"r{n}", **{"in": "1h"}).startswith("scheduled")
        assert call(ctx, cfg, "cancel_scheduled", id=n + 1).startswith("cancelled")
    said = call(bob_dm(store, cfg), cfg, "schedule", text="r3", **{"in": "1h"})
    assert said.startswith("error: too many new reminders: at most 2 an hour"), said
    # an hour later (a message of then) it may again
    later = bob_dm(store, cfg, stream_id=now_id(3601))
    assert call(later, cfg, "schedule", text="r3", **{"in": "1h"}).startswith("scheduled")


def test_the_owner_has_her_own_cap(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path, owner_max_items=1)
    assert call(owner_dm(store, cfg), cfg, "schedule", text="a", **{"in": "1h"}).startswith(
        "scheduled"
    )
    said = call(owner_dm(store, cfg), cfg, "schedule", text="b", **{"in": "1h"})
    assert said.startswith("error: too many reminders: 1 set by cli:ada are waiting, at most 1")


# -- replays --------------------------------------------------------------------------------------


def test_a_replayed_turn_adds_nothing_twice(store: MemoryStore, tmp_path: Path) -> None:
    """The same entry's turn run again (the worker was killed before its reply was recorded):
    the same call stores nothing new, even at its cap, and says so."""
    cfg = config(tmp_path, contacts=True, contact_max_items=1)
    sid = now_id()
    first = call(bob_dm(store, cfg, stream_id=sid), cfg, "schedule", text="tea", **{"in": "10m"})
    assert first.startswith("scheduled: #1 ")
    time.sleep(0.01)  # the replay runs later: its times come from the entry, not the clock
    again = call(bob_dm(store, cfg, stream_id=sid), cfg, "schedule", text="tea", **{"in": "10m"})
    assert again.startswith("already scheduled (nothing added): #1 "), again
    assert len(items(store)) == 1
    # a cancel replayed answers the same
    assert call(bob_dm(store, cfg, stream_id=sid), cfg, "cancel_scheduled", id=1).startswith(
        "cancelled #1"
    )
    assert call(bob_dm(store, cfg, stream_id=sid), cfg, "cancel_scheduled", id=1) == (
        "cancelled #1 (already)"
    )


def test_two_reminders_asked_in_one_turn_are_two(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    sid = now_id()
    ctx = owner_dm(store, cfg, stream_id=sid)
    assert call(ctx, cfg, "schedule", text="tea", **{"in": "10m"}).startswith("scheduled: #1")
    assert call(ctx, cfg, "schedule", text="tea", **{"in": "20m"}).startswith("scheduled: #2")
    assert call(ctx, cfg, "schedule", text="cake", **{"in": "10m"}).startswith("scheduled: #3")


# -- this conversation's only ---------------------------------------------------------------------


def test_cancel_and_list_see_only_this_conversations_items(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path, contacts=True)
    assert call(owner_dm(store, cfg), cfg, "schedule", text="owner's own secret",
                **{"in": "1h"}).startswith("scheduled: #1")  # fmt: skip
    assert call(bob_dm(store, cfg), cfg, "schedule", text="bob's",
                **{"in": "1h"}).startswith("scheduled: #2")  # fmt: skip
    listed = call(bob_dm(store, cfg), cfg, "scheduled")
    assert "bob's" in listed and "secret" not in listed and "#1" not in listed
    said = call(bob_dm(store, cfg), cfg, "cancel_scheduled", id=1)
    assert said == "error: there is no waiting reminder #1 in this conversation"
    assert call(stranger_in_group(store, cfg), cfg, "scheduled").startswith(
        "error: there is no tool named 'scheduled'"
    )
    assert [i.status for i in items(store)] == ["active", "active"]
    assert call(owner_in_group(store, cfg), cfg, "scheduled") == (
        "Nothing is scheduled in this conversation."
    )


def test_a_contact_cannot_cancel_what_the_owner_set_in_their_dm(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path, contacts=True)
    owner_there = turn(store, cfg, conversation="matrix:dm-bob", privacy=Privacy.DIRECT,
                       sender=OWNER_MATRIX, entity="owner")  # fmt: skip
    assert call(owner_there, cfg, "schedule", text="pay bob", **{"in": "1h"}).startswith(
        "scheduled: #1"
    )
    listed = call(bob_dm(store, cfg), cfg, "scheduled")
    assert "set by the owner: pay bob" in listed and "ada" not in listed  # not her handle
    said = call(bob_dm(store, cfg), cfg, "cancel_scheduled", id=1)
    assert said.startswith("error: reminder #1 was set by someone else"), said
    assert call(owner_there, cfg, "cancel_scheduled", id=1).startswith("cancelled #1")
    assert call(bob_dm(store, cfg), cfg, "cancel_scheduled", id=1) == (
        "error: there is no waiting reminder #1 in this conversation (#1 is cancelled)"
    )


def test_what_was_set_while_a_room_was_narrower_is_not_shown_once_it_widened(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    private = turn(store, cfg, conversation="matrix:room", privacy=Privacy.OWNER,
                   sender=OWNER_MATRIX, entity="owner")  # fmt: skip
    assert call(private, cfg, "schedule", text="private plan", **{"in": "1h"}).startswith(
        "scheduled: #1"
    )
    widened = owner_in_group(store, cfg)
    assert "private plan" not in call(widened, cfg, "scheduled")
    assert call(widened, cfg, "cancel_scheduled", id=1).startswith("error: there is no waiting")


def test_a_bad_id_is_an_error_line(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ctx = owner_dm(store, cfg)
    assert call(ctx, cfg, "cancel_scheduled", id=0).startswith("error: id must be")
    assert call(ctx, cfg, "cancel_scheduled", id=99) == (
        "error: there is no waiting reminder #99 in this conversation"
    )
    assert call(ctx, cfg, "cancel_scheduled", id="one").startswith("error: bad arguments")


def test_offer_is_none_for_a_scope_that_sees_nothing(store: MemoryStore, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    ctx = turn(store, cfg, conversation="matrix:x", privacy=Privacy.GROUP, sender=OWNER_MATRIX)
    odd = TurnContext(stream_id=ctx.stream_id, msg=ctx.msg, memory=ctx.memory,
                      scope=Scope(conversation="", privacy=Privacy.GROUP))  # fmt: skip
    assert offer(odd, cfg.schedule) is None
