"""What a ``scheduled`` entry becomes in the worker (worker/scheduled.py, worker/turn.py,
worker/admission.py): the fire job's entries (worker/schedule_job.py) read by the real consumer
against fakeredis, with the real memory store, an instant model and a schedule clock the test
sets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from structlog.testing import capture_logs

from contract.config import Config, OwnerConfig, RedisConfig, TurnsConfig
from contract.keys import Keys
from contract.liveness import process_identity
from contract.messages import InboundMessage, Kind, Privacy, Reply
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.schedule import Item
from memory.store import MemoryStore
from memory.writer import schedule
from tests.support.fakes import InstantModel
from tests.support.schedule import add_item
from tests.support.turns import record_turn
from tests.support.worker import handle_entries
from worker import occurrence
from worker.consumer import Consumer
from worker.main import assemble
from worker.model import NoModel
from worker.schedule_job import fire_due
from worker.tools import default_tools
from worker.turn import Turns

WORKER = process_identity("worker")
T0 = 1_800_000_000  # 2027-01-15 08:00 UTC: the occurrences of these tests


class Rig:
    def __init__(self, tmp_path: Path, r: fakeredis.FakeRedis) -> None:
        self.cfg = Config(
            home=tmp_path,
            redis=RedisConfig(prefix="sc:"),
            turns=TurnsConfig(mode="followup"),
            owner=OwnerConfig(name="Ada", timezone="Europe/Berlin"),
        )
        self.r, self.keys = r, self.cfg.keys
        self.store = MemoryStore(self.cfg.memory_path)
        self.model: Any = InstantModel()
        self.now = float(T0)
        self.consumers: list[Consumer] = []

    def consumer(self) -> Consumer:
        turns = Turns(self.cfg, self.store, self.model, default_tools(),
                      schedule_clock=lambda: self.now)  # fmt: skip
        c = assemble(self.cfg, self.r, turns, name=f"{WORKER}-{len(self.consumers)}")
        self.consumers.append(c)
        assert c.acquire(wait=False)
        c.reader.ensure_group()
        c.reader.recover()
        return c

    def add(self, **kw: Any) -> Item:
        kw.setdefault("first_due", T0)
        return add_item(self.store, **kw)

    def fire(self, due: int = T0) -> str:
        """The fire job of one second, as the jobs process runs it (memory read read-only)."""
        return fire_due(self.cfg, self.r, due)

    def xadd(self, msg: InboundMessage, stream: str | None = None) -> str:
        sid = self.r.xadd(stream or self.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
        return sid.decode()  # type: ignore[union-attr]

    def pump(self, c: Consumer) -> int:
        total = 0
        while entries := c.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(c, entries)
            total += len(entries)
        return total

    def replies(self, session: str = "cli:t") -> list[Reply]:
        return [Reply.from_json(x) for x in self.r.lrange(self.keys.reply(session), 0, -1)]

    def dead(self) -> list[dict[bytes, bytes]]:
        return [fields for _, fields in self.r.xrange(self.keys.dead, "-", "+")]

    def item(self, item_id: int) -> Item:
        found = schedule.get(self.store.conn, item_id)
        assert found is not None
        return found

    def close(self) -> None:
        for c in self.consumers:
            c.lease.release()
        self.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path, fakeredis.FakeRedis())
    yield rig
    rig.close()


def scheduled_rows(rig: Rig) -> list[Any]:
    return [r for r in rig.store.recent(50) if r.direction == "in" and r.kind == "scheduled"]


def test_an_occurrence_is_delivered_once_in_its_session_and_the_item_is_done(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="water the ferns")
    other = rig.add(text="not yet", first_due=T0 + 60)
    assert rig.fire() == "fired 1"
    entry = rig.r.xrange(rig.keys.inbound)[0][1]
    assert entry[b"text"] == b"" and b"ferns" not in b"".join(entry.values())  # routing only
    rig.now = T0 + 2
    rig.pump(c)
    (reply,) = rig.replies()
    assert reply.session == "cli:t" and "water the ferns" in reply.text
    assert reply.in_reply_to == ""  # no platform knows the occurrence's own event id
    (row,) = scheduled_rows(rig)
    assert row.sender == "scheduler" and row.privacy == "owner"
    assert not row.is_owner and row.entity != "owner"  # on the terminal too: the scheduler's
    assert row.event_id == f"schedule:{item.id}:{T0}"
    # the header: which reminder, when it was due (in the owner's zone), who set it
    assert row.text.startswith(f"Reminder #{item.id} due 2027-01-15 09:00 +01:00 (set by Ada on ")
    assert row.text.endswith(": water the ferns")
    done = rig.item(item.id)
    assert (done.status, done.fired, done.next_due, done.last_outcome) == (
        "done", 1, None, "delivered",
    )  # fmt: skip
    assert schedule.run_of(rig.store.conn, item.id, T0) == "delivered"
    assert rig.item(other.id).status == "active"
    # the model was told what this turn is
    system = rig.model.seen[-1][0]["content"]
    assert f"scheduled reminder #{item.id}" in system and "Deliver the reminder" in system


def test_the_same_occurrence_fired_again_or_replayed_adds_no_second_reply(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="call the plumber")
    rig.fire()
    rig.fire()  # the job ran twice (a jobs process killed after its XADD, the job put back)
    rig.pump(c)
    entry = occurrence.entry(item=item.id, occurrence=T0, channel="cli", session="cli:t",
                             conversation="cli:t", privacy="owner")  # fmt: skip
    rig.xadd(entry)  # and once more, later
    rig.pump(c)
    assert len(rig.replies()) == 1
    assert rig.model.calls == 1
    assert len(scheduled_rows(rig)) == 1
    assert rig.item(item.id).fired == 1


def test_a_worker_killed_after_recording_answers_the_occurrence_once_on_replay(rig: Rig) -> None:
    first = rig.consumer()
    item = rig.add(text="feed the cat", cron="0 9 * * *")
    rig.fire()
    entries = first.reader.read(block_ms=None)  # type: ignore[arg-type]
    (entry,) = entries
    turns = first.turns
    parsed = turns.parse(entry.sid, entry.fields, None)
    assert isinstance(parsed, InboundMessage)
    _, job = turns.begin([(entry.sid, parsed)])
    turns.settle()  # recorded and advanced, durably; the worker dies before the model answers
    assert job is not None
    advanced = rig.item(item.id).next_due
    assert advanced == T0 + 86_400
    first.lease.release()
    rig.consumers.remove(first)
    again = rig.consumer()  # the next worker claims the pending entry and replays it
    rig.pump(again)
    (reply,) = rig.replies()
    assert "feed the cat" in reply.text
    assert rig.item(item.id).next_due == advanced  # advanced once
    assert schedule.runs(rig.store.conn, [item.id])[item.id][0].outcome == "delivered"


def test_late_deliver_says_how_late_and_skip_records_the_skip(rig: Rig) -> None:
    c = rig.consumer()
    late = rig.add(text="take the pills", grace=300)
    skipped = rig.add(text="stand up", late="skip", cron="0 * * * *", conversation="cli:u")
    rig.fire()
    rig.now = T0 + 3 * 3600 + 5  # the worker was down for three hours
    rig.pump(c)
    (reply,) = rig.replies()
    assert "3 hours late" in reply.text and "take the pills" in reply.text
    assert "3 hours late" in rig.model.seen[-1][0]["content"]  # the model is told to say so
    assert rig.replies("cli:u") == []
    assert rig.item(late.id).last_outcome == "late"
    s = rig.item(skipped.id)
    assert (s.skipped, s.fired, s.last_outcome, s.status) == (1, 0, "skipped", "active")
    assert s.next_due == T0 + 4 * 3600  # the next hour after now, not each missed one
    assert len(scheduled_rows(rig)) == 1  # a skip records no message


def test_a_skip_is_silent_in_the_conversation_but_a_warning_in_the_log(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="stand up", late="skip", grace=60)
    rig.fire()
    rig.now = T0 + 3600
    with capture_logs() as logs:
        rig.pump(c)
    assert rig.replies() == [] and rig.item(item.id).last_outcome == "skipped"
    (said,) = [e for e in logs if e["event"] == "schedule.skipped"]
    assert said["log_level"] == "warning" and said["item"] == item.id
    assert "relaybot reminders --all" in said["detail"]


def test_the_advance_records_the_zone_it_was_computed_in(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="water the plants", cron="0 9 * * *", zone="Europe/Berlin")
    rig.fire()
    rig.cfg = rig.cfg.model_copy(
        update={"owner": OwnerConfig(name="Ada", timezone="America/New_York")}
    )
    for consumer in rig.consumers:
        consumer.turns.reconfigure(rig.cfg)
    rig.pump(c)
    it = rig.item(item.id)
    # T0 is 09:00 in Berlin; the next 09:00 is New York's, the zone in force when it advanced
    assert (it.zone, it.next_due) == ("America/New_York", T0 + 6 * 3600)


def test_a_recurring_item_that_missed_a_day_fires_once_and_moves_past_now(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="check the mail", cron="*/15 * * * *")
    rig.fire()
    rig.now = T0 + 86_400 + 100
    rig.pump(c)
    assert len(rig.replies()) == 1
    it = rig.item(item.id)
    assert it.fired == 1 and it.next_due == T0 + 86_400 + 900
    assert rig.fire(T0 + 900) == "fired 0"  # a missed second's job finds nothing due


def test_stale_cancelled_or_unknown_occurrences(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="old news")
    rig.fire()
    with rig.store.transaction():
        schedule.cancel(rig.store.conn, item.id, conversation=None, now=T0, reason="test")
    stale = occurrence.entry(item=item.id, occurrence=T0 - 60, channel="cli", session="cli:t",
                             conversation="cli:t", privacy="owner")  # fmt: skip
    rig.xadd(stale)
    unknown = occurrence.entry(item=999, occurrence=T0, channel="cli", session="cli:t",
                               conversation="cli:t", privacy="owner")  # fmt: skip
    rig.xadd(unknown)
    rig.pump(c)
    assert rig.replies() == []
    (dead,) = rig.dead()  # the cancelled ones are acked; an unknown item is no occurrence
    assert b"item #999" in dead[b"reason"]
    assert int(rig.r.xpending(rig.keys.inbound, Keys.GROUP)["pending"]) == 0


def test_an_entry_whose_routing_is_not_its_items_is_dead_lettered(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="private to the owner")
    wrong = occurrence.entry(item=item.id, occurrence=T0, channel="cli", session="cli:mallory",
                             conversation="cli:mallory", privacy="owner")  # fmt: skip
    rig.xadd(wrong)
    rig.pump(c)
    assert rig.replies("cli:mallory") == [] and rig.replies() == []
    (dead,) = rig.dead()
    assert b"is not its item's" in dead[b"reason"]
    assert rig.item(item.id).status == "active"  # the real occurrence still fires


def test_an_occurrence_before_its_second_is_dead_lettered_and_the_real_one_fires(
    rig: Rig,
) -> None:
    """An entry for the item's next occurrence written to the stream without a channel hours
    before it (an insider: only the worker's and jobs' accounts may write there) was delivered
    at once and recorded as on time."""
    c = rig.consumer()
    item = rig.add(text="not yet", first_due=T0 + 5 * 3600)
    early = occurrence.entry(item=item.id, occurrence=T0 + 5 * 3600, channel="cli",
                             session="cli:t", conversation="cli:t", privacy="owner")  # fmt: skip
    rig.xadd(early)
    rig.pump(c)
    assert rig.replies() == []
    (dead,) = rig.dead()
    assert b"before its time" in dead[b"reason"]
    assert rig.item(item.id).status == "active" and rig.item(item.id).fired == 0
    rig.now = float(T0 + 5 * 3600)  # its second comes: the jobs' entry is delivered
    assert rig.fire(T0 + 5 * 3600) == "fired 1"
    rig.pump(c)
    assert len(rig.replies()) == 1 and rig.item(item.id).status == "done"


def test_an_occurrence_the_jobs_fired_is_theirs_after_the_clock_stepped_back(
    tmp_path: Path,
) -> None:
    """Round 2: the jobs fired a second, then Redis's clock stepped back a minute (NTP) before
    the worker took the entry: it was dead-lettered as "before its time" and nothing fired it
    again for ten minutes. rq knows the fire job ran: the occurrence is delivered, once."""
    rig = Rig(tmp_path, fakeredis.FakeRedis())
    fired: list[int] = []
    try:
        turns = Turns(rig.cfg, rig.store, rig.model, default_tools(),
                      schedule_clock=lambda: rig.now,
                      schedule_fired=lambda due: due in fired)  # fmt: skip
        c = assemble(rig.cfg, rig.r, turns, name=f"{WORKER}-back")
        rig.consumers.append(c)
        assert c.acquire(wait=False)
        c.reader.ensure_group()
        item = rig.add(text="stepped back", first_due=T0)
        assert rig.fire(T0) == "fired 1"
        fired.append(T0)
        rig.now = float(T0 - 60)  # the clock stepped back after the fire
        rig.pump(c)
        assert rig.dead() == [] and len(rig.replies()) == 1
        assert rig.item(item.id).status == "done"
    finally:
        rig.close()


def test_scheduled_entries_come_only_from_the_jobs(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="on the cli stream")
    forged = occurrence.entry(item=item.id, occurrence=T0, channel="cli", session="cli:t",
                              conversation="cli:t", privacy="owner")  # fmt: skip
    rig.xadd(forged, rig.keys.inbound_of("cli"))
    # a message borrowing an occurrence's event id, which would take the occurrence's place
    borrowed = InboundMessage(channel="cli", session="cli:t", conversation="cli:t",
                              sender="ada", privacy=Privacy.OWNER, text="hi", ts=1.0,
                              event_id=f"schedule:{item.id}:{T0}")  # fmt: skip
    rig.xadd(borrowed, rig.keys.inbound_of("cli"))
    # on the stream without a channel, one not as the fire job makes it
    texted = forged.model_copy(update={"text": "injected"})
    rig.xadd(texted)
    rig.pump(c)
    reasons = sorted(d[b"reason"].decode() for d in rig.dead())
    assert len(reasons) == 3, reasons
    assert any("comes only from the jobs" in r for r in reasons)
    assert any("uses a scheduled occurrence's event id" in r for r in reasons)
    assert any("without text" in r for r in reasons)
    assert rig.replies() == []
    rig.fire()
    rig.pump(c)
    assert len(rig.replies()) == 1  # the real one is delivered


def test_the_model_down_delivers_the_text_as_written_marked(rig: Rig) -> None:
    rig.model = InstantModel(fail_with="connection refused")
    c = rig.consumer()
    rig.add(text="renew the passport")
    rig.add(text="late one", conversation="cli:u", first_due=T0)
    rig.fire()
    rig.now = T0 + 7200
    rig.pump(c)
    (reply,) = rig.replies()
    assert reply.text == (
        "\u23f0 Reminder: renew the passport\n"
        "(delivered as written, 2 hours late: the model is unavailable)"
    )
    assert reply.kind.value == "reply"


def test_no_model_configured_delivers_the_text_as_written(rig: Rig) -> None:
    rig.model = NoModel()
    c = rig.consumer()
    rig.add(text="buy bread")
    rig.fire()
    rig.pump(c)
    (reply,) = rig.replies()
    assert reply.text.startswith("\u23f0 Reminder: buy bread\n(delivered as written")


def _people(rig: Rig) -> str:
    """The owner's private words, Bob's DM, and a group; Bob's entity."""
    ident = Identity(OwnerResolver(["ada", "matrix:@ada:m.org"]), "Ada")
    with rig.store.transaction():
        record_turn(rig.store, ident, 1, conversation="cli:t", sender="ada",
                    text="my locker code is 4242", privacy=Privacy.OWNER)  # fmt: skip
        bob = record_turn(rig.store, ident, 2, conversation="matrix:!dm:m.org", sender="@bob:m.org",
                          text="my dog is called Rex", privacy=Privacy.DIRECT)  # fmt: skip
        record_turn(rig.store, ident, 3, conversation="matrix:!grp:m.org", sender="@ada:m.org",
                    text="welcome to the group", privacy=Privacy.GROUP)  # fmt: skip
    assert bob.entity is not None
    return bob.entity


def test_a_group_reminder_cannot_draw_on_private_memory_and_a_dm_one_is_bobs(rig: Rig) -> None:
    rig.cfg = rig.cfg.model_copy(update={"owner": OwnerConfig(name="Ada", aliases=["ada"])})
    c = rig.consumer()
    bob = _people(rig)
    group = rig.add(text="standup in 5 minutes (locker? code?)", conversation="matrix:!grp:m.org",
                    privacy="group", setter="@ada:m.org", created_by="3-0")  # fmt: skip
    dm = rig.add(text="walk the dog", conversation="matrix:!dm:m.org", privacy="direct",
                 setter="@bob:m.org", setter_entity=bob, created_by="2-0")  # fmt: skip
    rig.fire()
    rig.pump(c)
    asked = {m[-1]["content"].rsplit(": ", 1)[-1]: m for m in rig.model.seen}
    group_input = json.dumps(asked["standup in 5 minutes (locker? code?)"])
    assert "4242" not in group_input and "Rex" not in group_input  # nobody's private memory
    assert "welcome to the group" in group_input  # its own conversation
    dm_input = json.dumps(asked["walk the dog"])
    assert "4242" not in dm_input and "Rex" in dm_input
    (g,) = rig.replies("matrix:!grp:m.org")
    (d,) = rig.replies("matrix:!dm:m.org")
    assert rig.replies() == []  # nothing in the owner's own session
    # each reply is written for the audience of the message that set it, and answers it
    assert (g.extra["privacy"], g.extra["sender"], g.in_reply_to) == ("group", "@ada:m.org", "ev3")
    assert (d.extra["privacy"], d.extra["sender"], d.in_reply_to) == ("direct", "@bob:m.org", "ev2")
    row = next(r for r in scheduled_rows(rig) if r.conversation == "matrix:!dm:m.org")
    assert json.loads(row.extra)["setter_entity"] == bob
    assert group.id != dm.id


def test_an_occurrence_set_aside_is_delivered_as_written_and_advanced(rig: Rig) -> None:
    c = rig.consumer()
    item = rig.add(text="the poison pill", cron="0 9 * * *")
    rig.fire()
    (entry,) = c.reader.read(block_ms=None)  # type: ignore[arg-type]
    msg = InboundMessage.from_fields(entry.fields)
    assert msg.kind is Kind.SCHEDULED
    done = c.turns.set_aside(entry.sid, msg, "delivered too often")
    assert done.reply is not None and done.reply.text.startswith("\u23f0 Reminder: the poison pill")
    assert rig.item(item.id).next_due == T0 + 86_400  # it does not come back


def test_an_occurrence_answered_again_keeps_the_scope_of_whoever_set_it(rig: Rig) -> None:
    """A gateway withheld an occurrence's reply and the worker answers it again (its row is the
    current message, the report the entry): the person of a direct scope is the setter, never
    the scheduler (whose rows elsewhere are other conversations' reminders)."""
    c = rig.consumer()
    bob = _people(rig)
    rig.add(text="walk the dog", conversation="matrix:!dm:m.org", privacy="direct",
            setter="@bob:m.org", setter_entity=bob)  # fmt: skip
    rig.fire()
    rig.pump(c)
    (row,) = scheduled_rows(rig)
    report = InboundMessage(kind=Kind.DERIVED, channel="matrix", session="matrix:!dm:m.org",
                            conversation="matrix:!dm:m.org", sender="matrix", text="",
                            privacy=Privacy.DIRECT, ts=1.0, event_id="report-1",
                            extra={"type": "reply_status", "status": "withheld"})  # fmt: skip
    assert c.turns.memory.scope_of(report, row).entity == row.entity  # the scheduler's
    assert row.entity not in (None, bob)
    assert c.turns.occurrences.scope_of(report, row).entity == bob
