"""Matrix room events (recorded payloads) normalized, or rejected with a reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage, Privacy
from gateways.audience import audience_key
from gateways.matrix.events import (
    GroupPolicy,
    Policy,
    Rejected,
    RoomFacts,
    normalize_event,
    room_facts,
    room_of,
    session_of,
)

EVENTS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "matrix_events.json").read_text(encoding="utf-8")
)
BOT = "@bot:localhost"
DM = RoomFacts("!dm:localhost", member_count=2, audience=frozenset({"@owner:localhost"}))
GROUP = RoomFacts("!group:localhost", member_count=5, display_names={"@carol:localhost": "Carol"})
POLICY = Policy(
    own_user_id=BOT,
    owners=frozenset({"@owner:localhost"}),
    dm_allowlist=frozenset({"@carol:localhost"}),
    own_names=("relaybot",),
)


def ok(name: str, room: RoomFacts = DM, policy: Policy = POLICY) -> InboundMessage:
    out = normalize_event(EVENTS[name], room, policy)
    assert isinstance(out, InboundMessage), out
    return out


def rejected(name: str, room: RoomFacts = DM, policy: Policy = POLICY) -> str:
    out = normalize_event(EVENTS[name], room, policy)
    assert isinstance(out, Rejected), out
    return out.reason


def test_owner_dm_is_the_owners_own() -> None:
    msg = ok("text")
    assert msg.channel == "matrix"
    assert msg.session == "matrix:!dm:localhost"
    # the owner's own room is a conversation of its audience: someone invited later (who may
    # read the room's history there) starts another one, which sees nothing of it
    assert msg.conversation == f"matrix:!dm:localhost/{audience_key(['@owner:localhost'])}"
    assert msg.privacy == Privacy.OWNER
    assert (msg.sender, msg.text, msg.event_id) == ("@owner:localhost", "hello bot", "$txt1")
    assert msg.ts == 1763790000.0
    assert InboundMessage.from_fields(msg.to_fields()) == msg


def test_allowlisted_dm_is_direct_and_stranger_is_rejected() -> None:
    assert EVENTS["no_mention"]["sender"] == "@carol:localhost"
    hidden = RoomFacts("!dm:localhost", member_count=2, epoch="k1")  # history_visibility joined
    assert ok("no_mention", hidden).privacy == Privacy.DIRECT  # carol in a DM: allowlisted
    assert "allowlist" in rejected("stranger")


def test_a_dm_that_shows_its_history_to_newcomers_sees_only_itself() -> None:
    """Found by tests/unit/test_privacy_invariant.py: in a DM whose history a later member can
    read (``shared``, Matrix's default), a direct conversation's reply quoting what carol said
    elsewhere was read by whoever carol let in next. Such a DM is answered (no mention needed)
    but sees only itself; a world-readable room is public, never the owner's own."""
    assert ok("no_mention").privacy == Privacy.GROUP  # DM: no epoch, history shared
    facts = room_facts(
        "!pub:localhost",
        frozenset({"@owner:localhost", BOT}),
        own_user_id=BOT,
        history_visibility="world_readable",
        ever=frozenset(),
        display_names={},
    )
    assert not facts.direct
    assert "not mentioned" in rejected("text", facts)
    owner_dm = room_facts(
        "!dm:localhost",
        frozenset({"@owner:localhost", BOT}),
        own_user_id=BOT,
        history_visibility="shared",
        ever=frozenset(),
        display_names={},
    )
    assert ok("text", owner_dm).privacy == Privacy.OWNER  # the owner lets people in: theirs


def test_a_room_of_three_is_a_group_even_if_created_as_a_dm() -> None:
    room = RoomFacts("!x:localhost", member_count=3)
    assert "not mentioned" in rejected("text", room)
    assert ok("old_client_mention", room).privacy == Privacy.GROUP


def test_own_events_and_notices_are_ignored() -> None:
    assert rejected("own") == "own event"
    assert "notice" in rejected("notice")
    assert "not a message" in rejected("member")
    assert "no text body" in rejected("no_body")


def test_group_mention_policy() -> None:
    msg = ok("mention", GROUP)
    assert msg.privacy == Privacy.GROUP
    assert msg.sender_name == "Carol"
    assert "not mentioned" in rejected("no_mention", GROUP)
    # no m.mentions at all: the body is read instead
    assert ok("old_client_mention", GROUP).event_id == "$men3"
    # the owner must mention the bot in a mention room too
    assert "not mentioned" in rejected("text", GROUP)


def test_group_open_and_allowlist_policies() -> None:
    open_policy = Policy(own_user_id=BOT, owners=POLICY.owners, group_policy=GroupPolicy.OPEN)
    assert ok("no_mention", GROUP, open_policy).privacy == Privacy.GROUP
    allow = Policy(
        own_user_id=BOT,
        owners=POLICY.owners,
        rooms={"!group:localhost": (GroupPolicy.ALLOWLIST, frozenset({"@dave:localhost"}))},
    )
    assert "allowlist" in rejected("no_mention", GROUP, allow)
    assert ok("text", GROUP, allow).privacy == Privacy.GROUP  # the owner is always allowed
    assert ok("no_mention", RoomFacts("!other:localhost", 5), open_policy)


def test_edit_is_recorded_as_an_edit() -> None:
    msg = ok("edit")
    assert msg.extra["edit_of"] == "$txt1"
    assert msg.text == "[edit of an earlier message] hello bot, corrected"


def test_reaction_goes_through_the_same_filters() -> None:
    msg = ok("reaction")
    assert msg.extra["reaction"] == {"key": "👍", "to": "$botreply1"}
    assert "👍" in msg.text
    stranger = {**EVENTS["reaction"], "sender": "@mallory:localhost"}
    assert isinstance(normalize_event(stranger, DM, POLICY), Rejected)
    assert "reaction" in rejected("reaction", GROUP)


def test_attachments_are_described() -> None:
    img = ok("image").text
    assert img == "[attachment: image 'cat.png' (image/png, 20.0 KiB)]"
    doc = ok("file_caption").text
    assert doc.startswith("please read this\n")
    assert "'report.pdf' (application/pdf, 3.0 MiB)" in doc


def test_thread_and_emote() -> None:
    msg = ok("thread")
    assert msg.extra["thread_root"] == "$thr1"
    assert msg.extra["reply_to"] == "$thr1"
    assert ok("emote").text == "* waves"


@pytest.mark.parametrize(
    "event",
    [
        {},
        {"event_id": "$a"},
        {"event_id": "$a", "sender": "@x:y", "content": "nope"},
        {"event_id": "$a", "sender": "@x:y", "type": "m.reaction", "content": {}},
        {"event_id": "$a", "sender": "@x:y", "type": "m.room.message",
         "content": {"body": "x", "m.relates_to": {"rel_type": "m.replace"}}},
    ],
)  # fmt: skip
def test_bad_events_are_values_not_exceptions(event: dict[str, Any]) -> None:
    assert isinstance(normalize_event(event, DM, POLICY), Rejected)


def test_session_round_trip() -> None:
    assert room_of(session_of("!abc:example.org")) == "!abc:example.org"


# -- audiences (issue 10, case 4) -----------------------------------------------------------------


@pytest.mark.parametrize("visibility", ["joined", "invited"])
def test_a_room_hiding_its_history_is_a_conversation_per_audience(visibility: str) -> None:
    def facts(*people: str) -> RoomFacts:
        return room_facts(
            "!r:x", frozenset({BOT, *people}), own_user_id=BOT,
            history_visibility=visibility, ever=frozenset(), display_names={},
        )  # fmt: skip

    dm, grown = facts("@owner:x"), facts("@owner:x", "@carol:x")
    assert (dm.member_count, grown.member_count) == (2, 3)
    assert dm.epoch and grown.epoch and dm.epoch != grown.epoch
    policy = Policy(own_user_id=BOT, owners=frozenset({"@owner:x"}))
    content = {"msgtype": "m.text", "body": "hi", "m.mentions": {"user_ids": [BOT]}}
    asked = {"type": "m.room.message", "event_id": "$e", "sender": "@owner:x", "content": content}
    a, b = normalize_event(asked, dm, policy), normalize_event(asked, grown, policy)
    assert isinstance(a, InboundMessage) and isinstance(b, InboundMessage)
    assert a.session == b.session == "matrix:!r:x"  # replies go to the room
    assert a.conversation != b.conversation  # memory keeps the audiences apart
    assert (a.privacy, b.privacy) == (Privacy.OWNER, Privacy.GROUP)
    assert b.extra["audience"] == ["@carol:x", "@owner:x"]


def test_a_room_showing_its_history_counts_everyone_who_was_ever_in_it() -> None:
    shrunk = room_facts("!r:x", frozenset({BOT, "@bob:x"}), own_user_id=BOT,
                        history_visibility="shared", ever=frozenset({"@carol:x"}),
                        display_names={})  # fmt: skip
    assert shrunk.audience == {"@bob:x", "@carol:x"}
    assert (shrunk.member_count, shrunk.epoch) == (3, "")  # a group, one conversation


RECORD_ALL = Policy(
    own_user_id=BOT,
    owners=POLICY.owners,
    dm_allowlist=POLICY.dm_allowlist,
    own_names=("relaybot",),
    record_all=True,
    rooms={"!quiet:localhost": (GroupPolicy.MENTION, frozenset())},
    room_record={"!quiet:localhost": False},
)


def test_room_talk_not_addressed_is_passed_on_as_context_not_to_be_answered() -> None:
    """``record = "all"``: a mention-only room's talk reaches the worker marked ``no_reply``
    (recorded as the room's context, never answered), with the room's audience."""
    room = RoomFacts("!group:localhost", 5, audience=frozenset({"@carol:localhost", "@d:x"}))
    talk = ok("no_mention", room, RECORD_ALL)
    assert talk.extra["no_reply"] == "not mentioned in a mention-only room"
    assert talk.privacy == Privacy.GROUP
    assert talk.extra["audience"] == ["@carol:localhost", "@d:x"]
    assert "no_reply" not in ok("mention", room, RECORD_ALL).extra  # asked: answered
    reaction = ok("reaction", room, RECORD_ALL)
    assert reaction.extra["no_reply"] == "reaction in a mention-only room"
    allow = Policy(
        own_user_id=BOT,
        owners=POLICY.owners,
        record_all=True,
        rooms={"!group:localhost": (GroupPolicy.ALLOWLIST, frozenset({"@dave:localhost"}))},
    )
    assert ok("no_mention", room, allow).extra["no_reply"] == "sender not on this room's allowlist"
    # another bot's notice (a CI's "build failed") is the room's talk too, never answered, even
    # in an open room; in a DM it is dropped
    notice = ok("notice", room, RECORD_ALL)
    assert notice.extra["no_reply"].startswith("m.notice") and notice.text == "I am a bot"
    open_room = Policy(own_user_id=BOT, owners=POLICY.owners, group_policy=GroupPolicy.OPEN,
                       record_all=True)  # fmt: skip
    assert ok("notice", room, open_room).extra["no_reply"].startswith("m.notice")
    assert "notice" in rejected("notice", DM, RECORD_ALL)
    # DMs are not rooms' talk: a stranger's is still refused
    stranger = {**EVENTS["text"], "sender": "@mallory:localhost"}
    assert isinstance(normalize_event(stranger, DM, RECORD_ALL), Rejected)


def test_a_room_recording_only_what_is_addressed_drops_the_rest() -> None:
    quiet = RoomFacts("!quiet:localhost", 5)
    assert "not mentioned" in rejected("no_mention", quiet, RECORD_ALL)
    assert "no_reply" not in ok("mention", quiet, RECORD_ALL).extra


def test_what_a_room_is_full_of_is_logged_at_debug_and_broken_events_at_warning() -> None:
    def level(event: dict[str, Any], room: RoomFacts = GROUP) -> str:
        out = normalize_event(event, room, POLICY)
        assert isinstance(out, Rejected), out
        return out.level

    assert level(EVENTS["member"]) == "debug"  # state events: every join, name, topic
    assert level(EVENTS["own"]) == "debug"
    assert level(EVENTS["notice"]) == "debug"
    assert level(EVENTS["no_body"]) == "debug"  # a redacted message has no body
    assert level(EVENTS["no_mention"]) == "info"  # a policy's decision
    assert level({**EVENTS["text"], "sender": "@mallory:localhost"}, DM) == "info"
    assert level({"type": "m.room.message", "sender": "@a:x", "content": {}}) == "warning"
    assert level({**EVENTS["text"], "content": "not an object"}) == "warning"


def test_record_all_is_the_default_and_a_room_can_record_only_what_is_addressed() -> None:
    from contract.config import Config
    from gateways.matrix.gateway import build_policy

    cfg = Config.model_validate(
        {
            "home": "/nonexistent",
            "matrix": {"rooms": {"!q:x": {"record": "addressed"}, "!open:x": {"policy": "open"}}},
        }
    )
    policy = build_policy(cfg, BOT)
    assert policy.records_all("!any:x") and policy.records_all("!open:x")
    assert not policy.records_all("!q:x")
    quiet = Config.model_validate({"home": "/nonexistent", "matrix": {"record": "addressed"}})
    assert not build_policy(quiet, BOT).records_all("!any:x")


def reply_event(body: str, *, reply: bool = True) -> dict[str, Any]:
    content: dict[str, Any] = {
        "msgtype": "m.text",
        "body": body,
        "format": "org.matrix.custom.html",
        "formatted_body": "<mx-reply><blockquote>my passport number is P1234567</blockquote>"
        "</mx-reply>and my pin?",
    }
    if reply:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": "$orig"}}
    return {
        "type": "m.room.message",
        "event_id": "$reply1",
        "sender": "@owner:localhost",
        "origin_server_ts": 1763790000000,
        "content": content,
    }


def test_a_replys_fallback_quote_is_stripped_and_the_relation_kept() -> None:
    """The spec's reply fallback is a copy of the earlier message: kept, the model would read it
    as said now, and erasing the original would leave it in the reply's row."""
    quote = "> <@bob:localhost> my passport number is P1234567\n> second line\n\n"
    body = quote + "and my pin?\n> not ours"
    msg = normalize_event(reply_event(body), DM, POLICY)
    assert isinstance(msg, InboundMessage), msg
    assert msg.text == "and my pin?\n> not ours" and "P1234567" not in msg.to_fields().__repr__()
    assert msg.extra["reply_to"] == "$orig"
    # without the relation, a leading "> " is the sender's own text (a quote they typed)
    plain = normalize_event(reply_event(body, reply=False), DM, POLICY)
    assert isinstance(plain, InboundMessage) and plain.text == body
    only_quote = normalize_event(reply_event("> <@bob:localhost> hi"), DM, POLICY)
    assert isinstance(only_quote, Rejected)
