"""Issue 24, item 10b: a Matrix redaction erases the redacted event from memory, as
``relaybot memory erase --id`` would (its edits, the reply to it, what derived from it), within
its own room only; it is never recorded as a message nor answered; replays and unknown events
are no-ops. Entries are handled as the worker handles them (worker/turn.py), XADDed the way the
Matrix gateway publishes a redaction: ``text="[redaction]"``, ``extra={"room_id", "redacts",
"no_reply": "redaction"}``, ``sender`` who redacted, ``event_id`` the redaction's own id."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import Config, OwnerAlias, OwnerConfig
from contract.messages import InboundMessage, Privacy
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.worker import handle_entry
from worker.tools import default_tools
from worker.turn import Outcome, Turns

SECRET = "zanzibarquux"
_n = itertools.count(1)


class Room:
    def __init__(self, tmp_path: Path) -> None:
        cfg = Config(
            home=tmp_path,
            owner=OwnerConfig(aliases=[OwnerAlias(address="@ada:m.org", channel="matrix")]),
        )
        self.store = MemoryStore(tmp_path / "memory.sqlite3")
        self.turns = Turns(cfg, self.store, InstantModel(), default_tools())  # type: ignore[arg-type]

    def entry(
        self, text: str, *, room: str = "!r:m.org", conversation: str | None = None,
        sender: str = "@bob:m.org", event_id: str | None = None, **extra: Any,
    ) -> tuple[str, dict[str, str], str]:  # fmt: skip
        n = next(_n)
        conv = conversation or f"matrix:{room}"
        msg = InboundMessage(
            channel="matrix", session=f"matrix:{room}", conversation=conv, sender=sender,
            privacy=Privacy.GROUP, text=text, ts=1_795_000_000.0 + n,
            event_id=event_id or f"$ev{n}", extra=extra,
        )  # fmt: skip
        return f"matrix/{1_795_000_000_000 + n}-0", msg.to_fields(), msg.event_id

    def say(self, text: str, **kw: Any) -> tuple[str, str]:
        sid, fields, event = self.entry(text, **kw)
        self.handle(sid, fields)
        return sid, event

    def redact(self, event: str, *, room: str = "!r:m.org", sid: str | None = None,
               by: str = "@bob:m.org", **kw: Any) -> Outcome:  # fmt: skip
        extra = {"room_id": room, "redacts": event, "no_reply": "redaction"}
        extra.update(kw.pop("extra", {}))
        new_sid, fields, _ = self.entry("[redaction]", room=room, sender=by, **{**extra, **kw})
        return self.handle(sid or new_sid, fields)

    def handle(self, sid: str, fields: dict[str, str]) -> Outcome:
        outcome = handle_entry(self.turns, sid, fields, channel="matrix")
        self.turns.settle()
        return outcome

    def q(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.store.conn.execute(sql, params).fetchall()

    def texts(self) -> list[str]:
        return [str(t) for (t,) in self.q("SELECT text FROM log ORDER BY id")]


@pytest.fixture
def room(tmp_path: Path) -> Iterator[Room]:
    r = Room(tmp_path)
    yield r
    r.store.close()


def test_a_redaction_erases_the_event_its_edit_and_its_reply_and_is_not_recorded(
    room: Room,
) -> None:
    _, event = room.say(f"my pin is {SECRET}")
    room.say(f"[edit] my pin is {SECRET}!", edit_of=event, no_reply=True)
    room.say("unrelated")
    rows_before = len(room.texts())
    outcome = room.redact(event)
    assert outcome.reply is None and outcome.dead_reason is None
    assert isinstance(outcome.erasure, int)
    texts = room.texts()
    assert len(texts) == rows_before  # the redaction is not a message of the log
    assert not [t for t in texts if SECRET in t or "[redaction]" in t]
    assert "unrelated" in texts
    (reason, by, kind, detail) = room.q(
        "SELECT reason, requested_by, target_kind, detail FROM erasure"
    )[0]
    assert reason == "Matrix redaction by @bob:m.org" and by == "@bob:m.org" and kind == "id"
    assert json.loads(detail)["redaction"]["redacts"] == event


def test_a_replayed_redaction_adds_nothing(room: Room) -> None:
    _, event = room.say(f"my pin is {SECRET}")
    first = room.redact(event, sid="matrix/1-0")
    again = room.redact(event, sid="matrix/1-0")
    assert first.erasure == again.erasure
    assert room.q("SELECT count(*) FROM erasure") == [(1,)]


def test_a_redaction_in_another_room_or_of_an_unknown_event_erases_nothing(room: Room) -> None:
    _, event = room.say(f"my pin is {SECRET}")
    room.say(f"same room id prefix {SECRET}", room="!r:m.org2")
    _, other = room.say(f"in the longer room {SECRET}", room="!r:m.org2")
    for outcome in (room.redact(event, room="!elsewhere:m.org"), room.redact("$never-seen"),
                    room.redact(other, room="!r:m.org")):  # fmt: skip
        assert outcome.erasure is None and outcome.reply is None and outcome.dead_reason is None
    assert room.q("SELECT count(*) FROM erasure") == [(0,)]
    said = [str(t) for (t,) in room.q("SELECT text FROM log WHERE direction = 'in'")]
    assert sum(SECRET in t for t in said) == 3
    assert not [t for t in room.texts() if "[redaction]" in t]


def test_a_redaction_reaches_every_epoch_of_its_room(room: Room) -> None:
    """A room that hides its history from newcomers is a conversation per membership epoch
    (``matrix:<room>/<epoch>``): the redaction comes in the newest, the event was in an older."""
    _, event = room.say(f"my pin is {SECRET}", conversation="matrix:!r:m.org/e1")
    outcome = room.redact(event, conversation="matrix:!r:m.org/e2")
    assert outcome.erasure is not None
    assert not [t for t in room.texts() if SECRET in t]


def test_a_malformed_redaction_is_a_dead_letter(room: Room) -> None:
    _, event = room.say(f"my pin is {SECRET}")
    # no "redacts"
    sid, fields, _ = room.entry("[redaction]", room="!r:m.org", no_reply="redaction",
                                room_id="!r:m.org")  # fmt: skip
    assert "redacts" in (room.handle(sid, fields).dead_reason or "")
    sid, fields, _ = room.entry("[redaction]", room="!r:m.org", no_reply="redaction",
                                room_id="!other:m.org", redacts=event)  # fmt: skip
    assert "room" in (room.handle(sid, fields).dead_reason or "")
    assert room.q("SELECT count(*) FROM erasure") == [(0,)]
    assert not [t for t in room.texts() if "[redaction]" in t]


def test_only_a_channel_with_redactions_has_them(room: Room, tmp_path: Path) -> None:
    """An e-mail entry that says ``no_reply: "redaction"`` is a mail recorded unanswered, never
    an erasure of anything."""
    _, event = room.say(f"my pin is {SECRET}")
    msg = InboundMessage(
        channel="email", session="email:t", conversation="email:t", sender="eve@example.org",
        privacy=Privacy.DIRECT, text="[redaction]", ts=1.0, event_id="<x@y>",
        extra={"no_reply": "redaction", "room_id": "!r:m.org", "redacts": event},
    )  # fmt: skip
    outcome = handle_entry(room.turns, "email/1-0", msg.to_fields(), channel="email")
    room.turns.settle()
    assert outcome.erasure is None
    assert room.q("SELECT count(*) FROM erasure") == [(0,)]
    assert any(SECRET in t for t in room.texts())
