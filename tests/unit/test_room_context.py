"""A mention-only room's talk that the bot was not asked about: recorded as the room's context
(``extra.no_reply`` from the Matrix gateway), never answered, never a model call, recorded once
even when published again; a later mentioned turn sees it (issue 13)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import ModelConfig, TurnsConfig
from contract.messages import InboundMessage, Privacy
from tests.support.fakes import InstantModel
from tests.unit.test_consumer import Rig
from worker.consumer import Consumer
from worker.model import Completion

ROOM = "!team:hs"
SESSION = f"matrix:{ROOM}"
NOT_MENTIONED = "not mentioned in a mention-only room"


def said(text: str, sender: str, *, addressed: bool, n: int) -> InboundMessage:
    extra: dict[str, object] = {"room_id": ROOM, "audience": ["@bob:hs", "@carol:hs"]}
    if not addressed:
        extra["no_reply"] = NOT_MENTIONED
    return InboundMessage(
        channel="matrix", session=SESSION, conversation=SESSION, sender=sender,
        privacy=Privacy.GROUP, text=text, ts=1_795_000_000.0 + n, event_id=f"$ev{n}",
        extra=extra,
    )  # fmt: skip


@pytest.fixture(params=["collect", "followup"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path, fakeredis.FakeRedis())
    rig.cfg = rig.cfg.model_copy(update={"turns": TurnsConfig(mode=request.param)})
    yield rig
    rig.close()


def publish(rig: Rig, m: InboundMessage) -> str:
    sid = rig.r.xadd(rig.keys.inbound_of("matrix"), m.to_fields())  # type: ignore[arg-type]
    return f"matrix/{sid.decode()}"  # type: ignore[union-attr]


def room_replies(rig: Rig) -> list[str]:
    return [r.answers for r in rig.replies(SESSION)]


def test_room_talk_is_recorded_without_a_model_call_and_a_mention_sees_it(rig: Rig) -> None:
    c = rig.consumer()
    publish(rig, said("we ship on friday", "@bob:hs", addressed=False, n=1))
    publish(rig, said("friday works, the demo is at 3", "@carol:hs", addressed=False, n=2))
    rig.pump(c)
    assert rig.model.calls == 0  # nothing was asked
    assert room_replies(rig) == []
    assert rig.pending() == 0  # acked: recorded, nothing to answer

    asked = publish(rig, said("bot, when is the demo?", "@bob:hs", addressed=True, n=3))
    rig.pump(c)
    assert rig.model.calls == 1
    assert room_replies(rig) == [asked]
    system = rig.model.seen[-1][0]["content"]
    assert "we ship on friday" in system and "the demo is at 3" in system  # the room's talk
    assert "[matrix / @carol:hs]" in system or "@carol:hs" in system

    rows = list(reversed(rig.store.recent(10)))
    assert [(r.direction, r.text) for r in rows] == [
        ("in", "we ship on friday"),
        ("in", "friday works, the demo is at 3"),
        ("in", "bot, when is the demo?"),
        ("out", rows[-1].text),
    ]
    assert {r.privacy for r in rows} == {"group"}  # the room's audience, as for any message
    assert json.loads(rows[0].extra)["no_reply"] == NOT_MENTIONED


def test_room_talk_waiting_with_a_mention_keeps_its_order_and_one_reply(rig: Rig) -> None:
    """Read together (the worker was busy): the talk before the mention is recorded before the
    turn starts (the turn sees it), the mention alone is answered, the talk after it is recorded
    and not answered."""
    c = rig.consumer()
    publish(rig, said("the build is red", "@carol:hs", addressed=False, n=1))
    asked = publish(rig, said("bot, why is the build red?", "@bob:hs", addressed=True, n=2))
    publish(rig, said("never mind, fixed", "@carol:hs", addressed=False, n=3))
    rig.pump(c)
    assert rig.model.calls == 1
    assert room_replies(rig) == [asked]
    assert "the build is red" in rig.model.seen[0][0]["content"]
    inbound = [r.text for r in reversed(rig.store.recent(10)) if r.direction == "in"]
    assert inbound == ["the build is red", "bot, why is the build red?", "never mind, fixed"]
    assert rig.pending() == 0


def test_room_talk_published_twice_is_recorded_once(rig: Rig) -> None:
    """A gateway whose cursor rolled back publishes the same event again (a new stream id)."""
    c = rig.consumer()
    talk = said("only once", "@bob:hs", addressed=False, n=1)
    publish(rig, talk)
    rig.pump(c)
    publish(rig, talk)
    c.lease.release()
    rig.pump(rig.consumer())  # another worker, after a restart
    assert [r.text for r in rig.store.recent(10)] == ["only once"]
    assert rig.model.calls == 0 and rig.pending() == 0


class WaitingModel(InstantModel):
    """A model call that lasts until ``check`` holds (or 5 s): what was done meanwhile."""

    def __init__(self, check: Callable[[], bool]) -> None:
        super().__init__()
        self.check = check
        self.held: bool | None = None

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if self.held is None:
            deadline = time.monotonic() + 5
            while not (held := self.check()) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.held = held
        return super().complete(messages, tools)


def test_room_talk_is_recorded_while_every_model_slot_is_taken(tmp_path: Path) -> None:
    """A record-only entry needs no model slot: with the one slot taken by another room's turn,
    the talk is recorded at once (it used to wait for the slot, its room showing "typing")."""
    rig = Rig(tmp_path, fakeredis.FakeRedis())
    rig.cfg = rig.cfg.model_copy(update={"model": ModelConfig(concurrency=1)})
    other = "matrix:!other:hs"
    c: Consumer | None = None

    def talk_taken() -> bool:
        return c is not None and SESSION not in c.writer.sessions.waiting

    rig.model = WaitingModel(talk_taken)
    try:
        c = rig.consumer()
        slow = said("bot, a long question", "@bob:hs", addressed=True, n=1)
        slow = slow.model_copy(update={"session": other, "conversation": other})
        asked = publish(rig, slow)
        publish(rig, said("meanwhile in the team room", "@carol:hs", addressed=False, n=2))
        rig.pump(c)
        assert rig.model.held is True  # the talk was taken while the other turn ran
        assert [r.answers for r in rig.replies(other)] == [asked]
        assert room_replies(rig) == [] and rig.model.calls == 1
        texts = [r.text for r in rig.store.recent(10) if r.direction == "in"]
        assert "meanwhile in the team room" in texts
        assert rig.pending() == 0
    finally:
        rig.close()
