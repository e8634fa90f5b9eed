"""Issue 24, items 2-4 and 10 (pure parts): a room's audience is everyone who can read it, now
or later; the owner's own room is only an invite-only room of the owner alone; in an encrypted
room a newcomer's audience starts at their join; a reply is checked again against the room as it
is when it is posted; a redaction is passed on to be erased."""

from __future__ import annotations

from typing import Any

import pytest

from contract.messages import InboundMessage, Privacy, Reply
from gateways.matrix.events import (
    Openness,
    Policy,
    Rejected,
    RoomState,
    classify,
    normalize_event,
    openness_of,
    room_facts,
)
from gateways.matrix.recheck import recheck

BOT, OWNER, CAROL, MALLORY = "@bot:x", "@owner:x", "@carol:x", "@mallory:x"
POLICY = Policy(own_user_id=BOT, owners=frozenset({OWNER}), dm_allowlist=frozenset({CAROL}))


def facts(*people: str, ever: frozenset[str] = frozenset(), **how: Any) -> Any:
    return room_facts(
        "!r:x", frozenset({BOT, *people}), own_user_id=BOT, ever=ever, display_names={},
        openness=Openness(**how),
    )  # fmt: skip


def said(sender: str, body: str = "what is my PIN?", event_id: str = "$q") -> dict[str, Any]:
    return {
        "type": "m.room.message", "event_id": event_id, "sender": sender,
        "origin_server_ts": 1_763_790_000_000, "content": {"msgtype": "m.text", "body": body},
    }  # fmt: skip


def message(event: dict[str, Any], room: Any) -> InboundMessage:
    out = normalize_event(event, room, POLICY)
    assert isinstance(out, InboundMessage), out
    return out


# -- item 2: a room anyone may join is not private --------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        {"join_rule": "public"},
        {"join_rule": "knock"},
        {"join_rule": "restricted"},
        {"join_rule": "knock_restricted"},
        {"join_rule": "some_future_rule"},
        {"join_rule": "public", "guest_access": "can_join"},
        {"history_visibility": "world_readable"},
    ],
)
def test_a_room_people_can_come_into_is_never_the_owners_own(how: dict[str, str]) -> None:
    room = facts(OWNER, **how)
    assert not room.private and not room.direct
    assert classify(room, OWNER, POLICY) is Privacy.GROUP
    assert classify(room, CAROL, POLICY) is Privacy.GROUP
    # a group: the owner's message without a mention is the room's talk, not answered
    out = normalize_event(said(OWNER), room, POLICY)
    assert isinstance(out, Rejected) and "not mentioned" in out.reason
    asked = {**said(OWNER), "content": {"msgtype": "m.text", "body": "bot?",
                                        "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    assert message(asked, room).privacy is Privacy.GROUP


def test_only_an_invite_only_room_of_the_owner_alone_is_the_owners_own() -> None:
    assert facts(OWNER, guest_access="can_join").private  # the private_chat preset's
    alone = facts(OWNER)
    assert alone.private and alone.direct
    msg = message(said(OWNER), alone)
    assert msg.privacy is Privacy.OWNER
    assert msg.conversation.startswith("matrix:!r:x/")  # keyed by its audience
    invited = facts(OWNER, CAROL)  # carol invited, not joined yet: she can read it already
    assert classify(invited, OWNER, POLICY) is Privacy.GROUP
    # with one contact only it is direct (history hidden from newcomers), else a group
    assert classify(facts(CAROL, history_visibility="joined"), CAROL, POLICY) is Privacy.DIRECT
    assert classify(facts(CAROL), CAROL, POLICY) is Privacy.GROUP
    assert classify(facts(MALLORY), MALLORY, POLICY) is None  # a stranger's DM: refused


def test_the_owners_room_and_the_room_after_an_invite_are_two_conversations() -> None:
    """Where newcomers read the history (shared, not encrypted), the owner's own room is still
    a conversation of its own audience: someone invited starts another one."""
    alone = message(said(OWNER), facts(OWNER))
    ask = {**said(OWNER), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    grown = message(ask, facts(OWNER, CAROL))
    assert alone.session == grown.session
    assert alone.conversation != grown.conversation
    assert grown.conversation == "matrix:!r:x"  # a group that shows its history: the room


def test_state_events_give_the_rooms_openness_and_a_malformed_one_opens_it() -> None:
    def state(kind: str, content: Any) -> dict[str, Any]:
        return {"type": kind, "state_key": "", "content": content}

    how = openness_of([
        state("m.room.join_rules", {"join_rule": "invite"}),
        state("m.room.history_visibility", {"history_visibility": "joined"}),
        state("m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"}),
        {"type": "m.room.member", "state_key": OWNER, "content": {"membership": "join"}},
    ])  # fmt: skip
    assert how == Openness("invite", "forbidden", "joined", encrypted=True)
    assert not how.open and not how.shared
    assert openness_of([state("m.room.join_rules", {"join_rule": 7})]).open
    assert openness_of([state("m.room.join_rules", {})]).open
    # guest access alone opens nothing: a guest needs an invite to an invite-only room
    assert not openness_of([state("m.room.guest_access", {"guest_access": "can_join"})]).open
    assert openness_of([state("m.room.history_visibility", {})]).history_visibility == (
        "world_readable"
    )
    assert openness_of([]) == Openness()  # the spec's defaults


# -- item 3: encrypted rooms ------------------------------------------------------------------


def test_in_an_encrypted_room_a_newcomers_audience_starts_at_their_join() -> None:
    """``shared`` history, encrypted: a newcomer has no key for what was said before, so the
    room is a conversation per audience (as ``joined`` is), and nobody earlier is counted."""
    before = facts(OWNER, encrypted=True)
    after = facts(OWNER, CAROL, ever=frozenset({MALLORY}), encrypted=True)
    assert before.epoch and after.epoch and before.epoch != after.epoch
    assert after.audience == {OWNER, CAROL}  # mallory, who left, reads nothing new
    ask = {**said(CAROL), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    a, b = message(said(OWNER), before), message(ask, after)
    assert a.conversation != b.conversation
    assert (a.privacy, b.privacy) == (Privacy.OWNER, Privacy.GROUP)
    # not encrypted, the same history is one conversation of everyone who was ever in it
    plain = facts(OWNER, CAROL, ever=frozenset({MALLORY}))
    assert plain.audience == {OWNER, CAROL, MALLORY} and not plain.epoch


# -- item 4: checked again when posted --------------------------------------------------------


def reply_to(msg: InboundMessage) -> Reply:
    return Reply(
        reply_id="r1", answers="matrix/1-0", channel="matrix", session=msg.session,
        conversation=msg.conversation, in_reply_to=msg.event_id, text="your PIN is 4321",
        created=1.0, extra={"privacy": msg.privacy.value, "sender": msg.sender,
                            "audience": msg.extra["audience"]},
    )  # fmt: skip


def test_a_reply_for_the_owner_alone_is_withheld_once_someone_else_can_read_the_room() -> None:
    reply = reply_to(message(said(OWNER), facts(OWNER)))
    assert recheck(reply, facts(OWNER), POLICY) is None  # nothing changed: posted
    for changed in (
        facts(OWNER, MALLORY),  # invited (not even joined)
        facts(OWNER, join_rule="public"),
        facts(OWNER, join_rule="knock"),
        facts(OWNER, join_rule="restricted"),
        facts(OWNER, join_rule="public", guest_access="can_join"),
        facts(OWNER, history_visibility="world_readable"),
        facts(OWNER, MALLORY, encrypted=True),
    ):
        verdict = recheck(reply, changed, POLICY)
        assert verdict is not None, changed
        assert verdict.report["privacy"] == "group"
    verdict = recheck(reply, facts(OWNER, MALLORY), POLICY)
    assert verdict is not None
    assert "@mallory:x" in verdict.reason
    assert verdict.report["audience"] == [MALLORY, OWNER]
    assert verdict.report["conversation"] != reply.conversation  # a new audience


def test_a_direct_reply_withheld_when_the_room_opens_a_group_one_when_its_epoch_ends() -> None:
    direct = reply_to(message(said(CAROL), facts(CAROL, history_visibility="joined")))
    assert direct.extra["privacy"] == "direct"
    assert recheck(direct, facts(CAROL, history_visibility="joined"), POLICY) is None
    opened = recheck(direct, facts(CAROL, history_visibility="joined", join_rule="public"), POLICY)
    assert opened is not None
    assert opened.report["conversation"] == direct.conversation  # same people: same conversation
    ask = {**said(CAROL), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    hidden = reply_to(message(ask, facts(OWNER, CAROL, history_visibility="joined")))
    assert recheck(hidden, facts(OWNER, CAROL, MALLORY, history_visibility="joined"), POLICY)
    shared = reply_to(message(ask, facts(OWNER, CAROL)))
    # newcomers read a shared group's whole history anyway: its reply is posted
    assert recheck(shared, facts(OWNER, CAROL, MALLORY), POLICY) is None


def test_a_reply_not_saying_who_it_was_written_for_is_posted_only_where_it_was_before() -> None:
    bare = Reply(reply_id="r", answers="matrix/1-0", channel="matrix", session="matrix:!r:x",
                 conversation="matrix:!r:x", text="t", created=1.0)  # fmt: skip
    assert recheck(bare, facts(OWNER, CAROL), POLICY) is None
    # a room whose newcomers no longer read the history: each audience its own conversation
    assert recheck(bare, facts(OWNER, CAROL, history_visibility="joined"), POLICY) is not None


# -- item 10: redactions ----------------------------------------------------------------------


def test_a_redaction_is_passed_on_to_be_erased_never_answered() -> None:
    redaction = {"type": "m.room.redaction", "event_id": "$red", "sender": OWNER,
                 "redacts": "$q", "content": {}, "origin_server_ts": 1_763_790_001_000}  # fmt: skip
    out = message(redaction, facts(OWNER))
    assert out.extra["redacts"] == "$q"
    assert out.extra["no_reply"] == "redaction"
    assert out.record_only
    assert out.conversation == message(said(OWNER), facts(OWNER)).conversation
    # room version 11 moved ``redacts`` into the content
    v11 = {**redaction, "redacts": None, "content": {"redacts": "$q2"}}
    del v11["redacts"]
    assert message(v11, facts(OWNER)).extra["redacts"] == "$q2"
    # the bot's own message: memory knows it by its reply id
    own = normalize_event(
        redaction, facts(OWNER), POLICY, redacted=lambda e: ("reply-7", "matrix/5-0")
    )
    assert isinstance(own, InboundMessage)
    assert (own.extra["redacts"], own.extra["redacts_event"]) == ("reply-7", "$q")
    assert own.extra["redacts_reply"] == "matrix/5-0"
    # a stranger's redaction in a DM-shaped room is passed on too (the server allowed it)
    assert message({**redaction, "sender": MALLORY}, facts(MALLORY)).privacy is Privacy.GROUP
    bad = normalize_event({**redaction, "redacts": 5}, facts(OWNER), POLICY)
    assert isinstance(bad, Rejected) and "target" in bad.reason


def test_a_room_that_narrowed_before_the_reply_was_posted_still_gets_it() -> None:
    """Found by the adversarial review: a group room made encrypted while a turn ran lost its
    answer ("written for fewer people"). Encryption, or hiding the history from newcomers,
    narrows who reads the reply: it is posted."""
    ask = {**said(CAROL), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    shared = reply_to(message(ask, facts(OWNER, CAROL)))
    assert recheck(shared, facts(OWNER, CAROL, encrypted=True), POLICY) is None
    assert recheck(shared, facts(OWNER, CAROL, history_visibility="joined"), POLICY) is None
    # ... but not to someone who was not in its audience
    assert recheck(shared, facts(OWNER, CAROL, MALLORY, encrypted=True), POLICY) is not None
    # a room anyone may join whose newcomers read its history: anyone reads the reply later
    hidden = reply_to(message(ask, facts(OWNER, CAROL, history_visibility="joined")))
    assert recheck(hidden, facts(OWNER, CAROL, join_rule="public"), POLICY) is not None


def test_a_room_whose_history_is_shown_to_newcomers_now_gets_no_reply_written_before() -> None:
    """Found by the production-path property test (tests/integration/
    test_privacy_invariant_production.py, CI of issue 29): an invite-only room whose history
    was hidden from newcomers (``joined``) shows it to them (``shared``) before the reply is
    posted; the same members, but whoever is invited later would read the reply, and not the
    message it answers (Matrix keeps each event's visibility as it was sent)."""
    ask = {**said(CAROL), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    hidden = reply_to(message(ask, facts(OWNER, CAROL, history_visibility="joined")))
    verdict = recheck(hidden, facts(OWNER, CAROL), POLICY)
    assert verdict is not None and "invited later" in verdict.reason
    assert verdict.report["conversation"] == "matrix:!r:x"  # answered again there
    # still hidden (or hidden another way: encrypted): posted
    assert recheck(hidden, facts(OWNER, CAROL, history_visibility="joined"), POLICY) is None
    assert recheck(hidden, facts(OWNER, CAROL, encrypted=True), POLICY) is None
    # the owner's own room keeps its conversation whatever newcomers may read: posted
    own = reply_to(message(said(OWNER), facts(OWNER, history_visibility="joined")))
    assert recheck(own, facts(OWNER), POLICY) is None


def test_a_room_made_world_readable_is_another_conversation() -> None:
    """Found by the production-path property test: a room whose history was shown to members
    (``shared``) and then to anyone (``world_readable``) was one conversation, so turns whose
    replies anyone reads saw what only members could read (Matrix keeps each event's visibility
    as it was when it was sent)."""
    ask = {**said(CAROL), "content": {"msgtype": "m.text", "body": "bot?",
                                      "m.mentions": {"user_ids": [BOT]}}}  # fmt: skip
    members = message(ask, facts(OWNER, CAROL))
    anyone = message(ask, facts(OWNER, CAROL, history_visibility="world_readable"))
    assert members.conversation == "matrix:!r:x"
    assert anyone.conversation == "matrix:!r:x/world_readable"
    # a reply written for the members is not posted to the room that anyone reads now
    assert recheck(reply_to(members), facts(OWNER, CAROL, history_visibility="world_readable"),
                   POLICY) is not None  # fmt: skip


def test_a_room_is_followed_event_by_event_from_its_state_at_the_first() -> None:
    """Found by the second adversarial round: a message read late (the gateway restarted after
    an outage) got the room's later audience: said while the owner was alone, recorded in the
    conversation of the owner and the friend she invited since. The state the gateway starts a
    batch from is the room's state at the batch's first event, then each event is applied."""

    def state(kind: str, content: dict[str, Any], key: str = "") -> dict[str, Any]:
        return {"type": kind, "state_key": key, "content": content}

    room = RoomState.of([
        state("m.room.member", {"membership": "join"}, OWNER),
        state("m.room.member", {"membership": "join"}, BOT),
        state("m.room.join_rules", {"join_rule": "invite"}),
        state("m.room.history_visibility", {"history_visibility": "shared"}),
    ])  # fmt: skip
    assert room.members == {OWNER, BOT} and room.openness() == Openness()
    room.apply(state("m.room.member", {"membership": "invite"}, CAROL))
    room.apply(state("m.room.join_rules", {"join_rule": "invite"}, "x"))  # a decoy: ignored
    room.apply(state("m.room.history_visibility", {"history_visibility": "world_readable"}))
    assert room.members == {OWNER, BOT, CAROL}
    assert room.openness() == Openness(history_visibility="world_readable")
    room.apply(state("m.room.member", {"membership": "leave"}, CAROL))
    room.apply(state("m.room.encryption", {"algorithm": "m.megolm.v1.aes-sha2"}))
    assert room.members == {OWNER, BOT} and room.openness().encrypted
    room.apply(state("m.room.join_rules", {}))  # malformed: open
    assert room.openness().open
