"""Matrix room events as normalized messages (pure: no I/O, no nio).

:func:`normalize_event` takes the event's JSON (as the homeserver sent it, ``event.source`` in
nio), the facts the gateway knows about the room and the policy, and returns either an
:class:`~contract.messages.InboundMessage` or a :class:`Rejected` value saying why it was dropped.
It never raises on a bad event.

- session = ``matrix:<room_id>`` (where replies go); the conversation is the room and its
  audience (:func:`room_facts`): the room itself where newcomers read its history (``shared``
  or ``world_readable``, not encrypted), else ``matrix:<room_id>/<audience key>``, a
  conversation per membership, so someone invited into a DM, or into an encrypted room, sees
  nothing of what was said before they came; the owner's own room is always keyed by its
  audience, so it is never the conversation of anyone else;
- privacy, from the audience (everyone who can read the event, now or later, the bot aside) and
  how open the room is (:attr:`RoomFacts.private`: invite-only, not world-readable): an
  invite-only room of the owner alone, the owner's own; of one other person, direct; any other
  room (several people, or anyone may join, knock, come in from another room, or read it
  without joining), a group. Where history is shared, everyone who was ever
  a member is in it: a room that shrinks stays a group;
- its own events are ignored; ``m.notice`` is never answered (bots talk in notices: no bot
  loops): in a group room that records everything it is recorded as the room's context (a CI
  bot's "build failed" is what the room talks about), elsewhere it is dropped;
- groups: ``open`` (everyone), ``mention`` (the bot is named in ``m.mentions``, or, for clients
  that do not send ``m.mentions``, in the body), ``allowlist`` (the owner and listed senders);
  what a group room's policy does not answer is still passed on, marked ``extra.no_reply`` (the
  worker records it as the room's context and does not answer it), unless the room records only
  what is addressed to the bot (``record = "addressed"``: then it is rejected);
- direct rooms: the owner and the allowlist; strangers are rejected;
- edits (``m.replace``) are messages with ``extra.edit_of`` naming the edited event; reactions
  are messages with ``extra.reaction``; attachments are described (name, type, size).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from contract.messages import (
    MAX_TEXT_CHARS,
    InboundMessage,
    Kind,
    Privacy,
    describe_validation_error,
)
from gateways.audience import audience_key

CHANNEL = "matrix"
ATTACHMENT_TYPES = {"m.image": "image", "m.file": "file", "m.audio": "audio", "m.video": "video"}


class GroupPolicy(StrEnum):
    OPEN = "open"
    MENTION = "mention"
    ALLOWLIST = "allowlist"


DEBUG, INFO, WARNING = "debug", "info", "warning"


@dataclass(frozen=True)
class Rejected:
    """An event that is not passed on, and why (logged by the gateway at ``level``: ``debug``
    for what a room is full of and nobody needs to see (state events, the bot's own events,
    notices, redacted messages), ``info`` for a policy's decision, ``warning`` for an event that
    is not what Matrix says it should be)."""

    reason: str
    event_id: str = ""
    level: str = INFO


@dataclass(frozen=True)
class RoomFacts:
    """What the gateway knows of a room when an event was sent (:func:`room_facts`)."""

    room_id: str
    member_count: int  # the audience with the bot: joined + invited (+ earlier members, shared)
    display_names: Mapping[str, str] = field(default_factory=dict)
    audience: frozenset[str] = frozenset()  # who can read the event, the bot aside
    epoch: str = ""  # the audience's key where newcomers do not read the history, else ""
    public: bool = False  # world_readable: anyone can read it, member or not
    open: bool = False  # anyone may join, knock, or come in from another room (guests too)

    @property
    def private(self) -> bool:
        """Only those the members invite can ever read it: invite-only, not world-readable. A
        room anyone may join (``public``, guests too where guest access is ``can_join``), ask
        to join (``knock``), enter from another room (``restricted``), or read without joining
        (``world_readable``), is not."""
        return not (self.public or self.open)

    @property
    def direct(self) -> bool:
        """Two people at most, in a room only its members let people into (:attr:`private`).
        ``m.direct`` / ``is_direct`` is not trusted for this: a room created as a DM can grow,
        and a third person must not see the owner's own context; a room anyone may join or read
        is a group however few its members are."""
        return self.member_count <= 2 and self.private

    @property
    def key(self) -> str:
        """The audience's key (part of a conversation id: gateways/audience.py)."""
        return self.epoch or audience_key(self.audience)


@dataclass(frozen=True)
class Policy:
    own_user_id: str
    owners: frozenset[str]  # the owner's Matrix ids
    dm_allowlist: frozenset[str] = frozenset()
    group_policy: GroupPolicy = GroupPolicy.MENTION
    group_allowlist: frozenset[str] = frozenset()
    rooms: Mapping[str, tuple[GroupPolicy, frozenset[str]]] = field(default_factory=dict)
    own_names: Collection[str] = ()  # display names that count as a mention in the body
    # group rooms: whether what the policy does not answer is recorded as context (``record =
    # "all"``) or dropped (``"addressed"``); per room in ``room_record``
    record_all: bool = False
    room_record: Mapping[str, bool] = field(default_factory=dict)

    def room_policy(self, room_id: str) -> tuple[GroupPolicy, frozenset[str]]:
        return self.rooms.get(room_id, (self.group_policy, self.group_allowlist))

    def records_all(self, room_id: str) -> bool:
        return self.room_record.get(room_id, self.record_all)

    def may_invite(self, sender: str) -> bool:
        return sender in self.owners or sender in self.dm_allowlist


NOTICE = "m.notice (bots talk in notices; not answered)"
WORLD_READABLE = "world_readable"  # the conversation of a room while anyone may read it
SHARED_HISTORY = frozenset({"shared", "world_readable"})
# join rules that keep a room to those its members invite ("private" is the old name of invite);
# any other value, known (public, knock, restricted, knock_restricted) or not, lets people in
INVITE_ONLY = frozenset({"invite", "private"})
_MEMBER = frozenset({"join", "invite"})


@dataclass(frozen=True)
class Openness:
    """How a room lets people read it, from its state: ``m.room.join_rules``,
    ``m.room.guest_access``, ``m.room.history_visibility``, ``m.room.encryption``."""

    join_rule: str = "invite"
    guest_access: str = "forbidden"
    history_visibility: str = "shared"
    encrypted: bool = False

    @property
    def open(self) -> bool:
        """Anyone may come in without a member's invite. Guest access (``can_join``, which
        Matrix's ``private_chat`` preset sets) lets guests join only where the join rule lets
        them in: a guest needs an invite to an invite-only room, as anyone does."""
        return self.join_rule not in INVITE_ONLY

    @property
    def shared(self) -> bool:
        """Newcomers read what was said before they came: the history is shown to them and
        not encrypted (a newcomer gets no key for what was sent before their join, whatever
        ``history_visibility`` says)."""
        return self.history_visibility in SHARED_HISTORY and not self.encrypted


def openness_of(state: Sequence[Mapping[str, Any]]) -> Openness:
    """A room's openness from its state events (``GET /rooms/{id}/state``, ``/context``); a
    value that is missing is the spec's default, one that is malformed counts as open (fail
    closed)."""
    join_rule, guest, visibility, encrypted = "invite", "forbidden", "shared", False
    for event in state:
        if event.get("state_key") != "":
            continue
        content = event.get("content")
        content = content if isinstance(content, Mapping) else {}
        kind = event.get("type")
        if kind == "m.room.join_rules":
            value = content.get("join_rule")
            join_rule = value if isinstance(value, str) else "unknown"
        elif kind == "m.room.guest_access":
            value = content.get("guest_access")
            guest = value if isinstance(value, str) else "can_join"
        elif kind == "m.room.history_visibility":
            value = content.get("history_visibility")
            visibility = value if isinstance(value, str) else "world_readable"
        elif kind == "m.room.encryption" and content:
            encrypted = True
    return Openness(join_rule, guest, visibility, encrypted)


_OPENNESS_TYPES = frozenset(
    {"m.room.join_rules", "m.room.guest_access", "m.room.history_visibility", "m.room.encryption"}
)


@dataclass
class RoomState:
    """A room's members (joined or invited) and openness, followed event by event: what the room
    was when each event of a timeline was sent. It starts from the state at a batch's first
    event (``/context``: not the room's state now, which a batch read late, after a restart or
    from a gap, does not know yet) and each event is applied after the message before it was
    classified, so every message gets the audience it was said to."""

    members: set[str] = field(default_factory=set)
    settings: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # openness by type

    @classmethod
    def of(cls, state: Sequence[Mapping[str, Any]]) -> RoomState:
        room = cls()
        for event in state:
            room.apply(event)
        return room

    def apply(self, event: Mapping[str, Any]) -> None:
        kind, key = event.get("type"), event.get("state_key")
        content = event.get("content")
        content = content if isinstance(content, Mapping) else {}
        if kind == "m.room.member" and isinstance(key, str):
            if content.get("membership") in _MEMBER:
                self.members.add(key)
            else:
                self.members.discard(key)
        elif kind in _OPENNESS_TYPES and key == "":
            self.settings[str(kind)] = content

    def openness(self) -> Openness:
        return openness_of(
            [{"type": t, "state_key": "", "content": c} for t, c in self.settings.items()]
        )


def room_facts(
    room_id: str,
    members: frozenset[str],
    *,
    own_user_id: str,
    history_visibility: str = "shared",
    ever: frozenset[str],
    display_names: Mapping[str, str],
    openness: Openness | None = None,
) -> RoomFacts:
    """The facts of an event sent while ``members`` were in the room. Where newcomers read the
    room's history (``shared``, ``world_readable``: Matrix's default, and not encrypted),
    everyone who was ever a member (``ever``) can read it, and the room is one conversation;
    where they do not (``invited``, ``joined``, or an encrypted room), the audience is who is in
    the room now, and each audience is a conversation of its own (its key in ``epoch``), which
    sees nothing of the others'. ``openness`` is the room's state (else only
    ``history_visibility`` is known: an invite-only room without guests)."""
    how = openness or Openness(history_visibility=history_visibility)
    audience = frozenset((ever | members) if how.shared else members) - {own_user_id}
    return RoomFacts(
        room_id,
        member_count=len(audience) + 1,
        display_names=display_names,
        audience=audience,
        epoch="" if how.shared else audience_key(audience),
        public=how.history_visibility == "world_readable",
        open=how.open,
    )


def session_of(room_id: str) -> str:
    return f"{CHANNEL}:{room_id}"


def room_of(session: str) -> str:
    return session[len(CHANNEL) + 1 :]


def _human_size(size: Any) -> str:
    if not isinstance(size, int) or size < 0:
        return "size unknown"
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} bytes"  # pragma: no cover


def describe_attachment(content: Mapping[str, Any]) -> str:
    kind = ATTACHMENT_TYPES.get(str(content.get("msgtype")), "file")
    info_raw = content.get("info")
    info: Mapping[str, Any] = info_raw if isinstance(info_raw, Mapping) else {}
    body = str(content.get("body") or "")
    name = str(content.get("filename") or body or "unnamed")
    mimetype = str(info.get("mimetype") or "type unknown")
    line = f"[attachment: {kind} {name!r} ({mimetype}, {_human_size(info.get('size'))})]"
    caption = body if content.get("filename") and body and body != name else ""
    return f"{caption}\n{line}" if caption else line


def is_mentioned(content: Mapping[str, Any], text: str, policy: Policy) -> bool:
    mentions = content.get("m.mentions")
    if isinstance(mentions, Mapping):
        ids = mentions.get("user_ids")
        return isinstance(ids, list) and policy.own_user_id in ids
    lowered = text.lower()  # an old client: the body is all there is
    localpart = policy.own_user_id.split(":", 1)[0].lstrip("@")
    names = [policy.own_user_id, localpart, *policy.own_names]
    return any(n and n.lower() in lowered for n in names)


def _text_of(content: Mapping[str, Any]) -> str | Rejected:
    msgtype = content.get("msgtype")
    if msgtype in ATTACHMENT_TYPES:
        return describe_attachment(content)
    body = content.get("body")
    if not isinstance(body, str) or not body.strip():
        return Rejected(f"no text body (msgtype {msgtype!r})", level=DEBUG)  # e.g. redacted
    return f"* {body}" if msgtype == "m.emote" else body


def _text_and_extra(
    event: Mapping[str, Any], content: Mapping[str, Any], extra: dict[str, Any]
) -> str | Rejected:
    """The text of a message, edit or reaction; what it relates to goes into ``extra``."""
    etype = event.get("type")
    relates_raw = content.get("m.relates_to")
    relates: Mapping[str, Any] = relates_raw if isinstance(relates_raw, Mapping) else {}
    if etype == "m.reaction":
        target, key = relates.get("event_id"), relates.get("key")
        if relates.get("rel_type") != "m.annotation" or not isinstance(target, str):
            return Rejected("reaction without an annotation", level=WARNING)
        extra["reaction"] = {"key": str(key), "to": target}
        return f"[reaction {key!s} to message {target}]"
    if etype != "m.room.message":
        return Rejected(f"event type {etype!r} is not a message", level=DEBUG)  # state events
    if relates.get("rel_type") == "m.replace":
        new = content.get("m.new_content")
        if not isinstance(new, Mapping) or not isinstance(relates.get("event_id"), str):
            return Rejected("edit without m.new_content", level=WARNING)
        found = _text_of(new)
        if isinstance(found, Rejected):
            return Rejected(f"edit: {found.reason}", level=found.level)
        extra["edit_of"] = relates["event_id"]
        return f"[edit of an earlier message] {found}"
    if content.get("msgtype") == "m.notice":
        extra["notice"] = True
    if relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        extra["thread_root"] = relates["event_id"]
    reply_to = relates.get("m.in_reply_to")
    text = _text_of(content)
    if isinstance(reply_to, Mapping) and isinstance(reply_to.get("event_id"), str):
        extra["reply_to"] = reply_to["event_id"]
        if isinstance(text, str) and content.get("msgtype") not in ATTACHMENT_TYPES:
            text = strip_reply_fallback(text)
            if not text.strip():
                return Rejected("reply with no text of its own", level=DEBUG)
    return text


REDACTION_TEXT = "[redaction]"


def _redaction(
    event: Mapping[str, Any],
    content: Mapping[str, Any],
    room: RoomFacts,
    policy: Policy,
    *,
    redacted: Callable[[str], tuple[str, str] | None],
) -> InboundMessage | Rejected:
    """A redaction, passed on for the worker to erase what it removes from memory (as ``memory
    erase --id`` would): ``extra.redacts`` names the redacted event (for one of the bot's own
    replies: the reply id, with the entry it answers in ``extra.redacts_reply``), never
    answered. The homeserver checked that its sender may redact it (its author, or a moderator
    of the room)."""
    event_id, sender = str(event.get("event_id")), str(event.get("sender"))
    target = event.get("redacts", content.get("redacts"))  # top level before room version 11
    if not isinstance(target, str) or not target:
        return Rejected("redaction without a target", event_id, level=WARNING)
    privacy = classify(room, sender, policy) or Privacy.GROUP
    own = redacted(target)
    extra: dict[str, Any] = {
        "room_id": room.room_id,
        "audience": sorted(room.audience),
        "redacts": own[0] if own else target,
        "no_reply": "redaction",
        **({"redacts_event": target, "redacts_reply": own[1]} if own else {}),
    }
    ts_ms = event.get("origin_server_ts")
    try:
        return InboundMessage(
            kind=Kind.MESSAGE,
            channel=CHANNEL,
            session=session_of(room.room_id),
            conversation=conversation_of(room, privacy),
            sender=sender,
            sender_name=room.display_names.get(sender, "")[:320],
            privacy=privacy,
            text=REDACTION_TEXT,
            ts=ts_ms / 1000 if isinstance(ts_ms, int | float) and ts_ms > 0 else 0.0,
            event_id=event_id,
            extra=extra,
        )
    except ValidationError as exc:
        return Rejected(
            f"not a valid redaction: {describe_validation_error(exc)}", event_id, level=WARNING
        )


def strip_reply_fallback(body: str) -> str:
    """A reply's body without the quote of the message it answers (the Matrix spec's reply
    fallback: leading ``> `` lines, then a blank line). That quote is a copy of an earlier
    message, not something the sender said now; the relation (``reply_to``) is kept."""
    emote = body.startswith("* > ")  # _text_of marks an emote before we see it
    lines = (body[2:] if emote else body).split("\n")
    cut = 0
    while cut < len(lines) and lines[cut].startswith(">"):
        cut += 1
    if cut == 0:
        return body
    if cut < len(lines) and not lines[cut].strip():
        cut += 1  # the blank line that ends the fallback
    rest = "\n".join(lines[cut:])
    return f"* {rest}" if emote else rest


def classify(room: RoomFacts, sender: str, policy: Policy) -> Privacy | None:
    """The privacy class of a message from ``sender`` in ``room`` (None: a stranger in a direct
    room, not answered). Only an invite-only room of the owner alone is the owner's own; only
    an invite-only room of one allowlisted contact that hides its history from newcomers is
    direct; every other room is a group."""
    if not room.direct:
        return Privacy.GROUP
    if sender in policy.owners:
        return Privacy.OWNER if room.audience <= policy.owners else Privacy.GROUP
    if sender in policy.dm_allowlist:
        # where the room shows its history to newcomers (no epoch), what is said here is said
        # to whoever joins later too: the conversation sees only itself (and public
        # knowledge), not what this person told the assistant elsewhere
        return Privacy.DIRECT if room.epoch else Privacy.GROUP
    return None


def conversation_of(room: RoomFacts, privacy: Privacy) -> str:
    """The conversation a message of class ``privacy`` in ``room`` belongs to: the room and
    its audience's key where newcomers do not read its history, and always for the owner's own
    room (someone invited later starts another conversation, whatever they may read there);
    the room itself for a group whose history everyone who joins reads."""
    session = session_of(room.room_id)
    if room.epoch or privacy is Privacy.OWNER:
        return f"{session}/{room.key}"
    if room.public:
        # anyone reads what is said while the room is world-readable, but what was said while
        # it was not stays for its members (Matrix decides an event's visibility by the setting
        # it was sent under): a conversation of its own
        return f"{session}/{WORLD_READABLE}"
    return session


def _admit(
    event: Mapping[str, Any],
    *,
    content: Mapping[str, Any],
    text: str,
    extra: Mapping[str, Any],
    room: RoomFacts,
    policy: Policy,
) -> tuple[Privacy, str] | Rejected:
    """The conversation's privacy class, and why it is not answered ("" when it is)."""
    sender = str(event.get("sender"))
    if room.direct:
        if extra.get("notice"):
            return Rejected(NOTICE, level=DEBUG)
        privacy = classify(room, sender, policy)
        if privacy is None:
            return Rejected("direct message from a sender not on the allowlist")
        return privacy, ""
    unanswered = _unanswered(event, content=content, text=text, extra=extra, room=room,
                             policy=policy)  # fmt: skip
    if unanswered and not policy.records_all(room.room_id):
        return Rejected(unanswered, level=DEBUG if unanswered == NOTICE else INFO)
    return Privacy.GROUP, unanswered


def _unanswered(
    event: Mapping[str, Any],
    *,
    content: Mapping[str, Any],
    text: str,
    extra: Mapping[str, Any],
    room: RoomFacts,
    policy: Policy,
) -> str:
    """Why the group room's policy does not answer this event ("" when it does)."""
    if extra.get("notice"):
        return NOTICE
    sender = str(event.get("sender"))
    mode, allowed = policy.room_policy(room.room_id)
    if mode == GroupPolicy.ALLOWLIST and sender not in allowed | policy.owners:
        return "sender not on this room's allowlist"
    if mode == GroupPolicy.MENTION:
        if event.get("type") == "m.reaction":
            return "reaction in a mention-only room"
        source = content.get("m.new_content") if "edit_of" in extra else content
        if not isinstance(source, Mapping) or not is_mentioned(source, text, policy):
            return "not mentioned in a mention-only room"
    return ""


def normalize_event(
    event: Mapping[str, Any],
    room: RoomFacts,
    policy: Policy,
    *,
    redacted: Callable[[str], tuple[str, str] | None] = lambda _e: None,
) -> InboundMessage | Rejected:
    """One room event as a normalized message, or the reason it is not one. ``redacted`` names
    the reply id of one of the bot's own events and the entry it answers (for a redaction of
    it), else None."""
    event_id = event.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        return Rejected("event without an event_id", level=WARNING)
    sender = event.get("sender")
    if not isinstance(sender, str) or not sender:
        return Rejected("event without a sender", event_id, level=WARNING)
    if sender == policy.own_user_id:
        return Rejected("own event", event_id, level=DEBUG)
    content = event.get("content")
    if not isinstance(content, Mapping):
        return Rejected("event without content", event_id, level=WARNING)
    if event.get("type") == "m.room.redaction":
        return _redaction(event, content, room, policy, redacted=redacted)
    extra: dict[str, Any] = {"room_id": room.room_id}
    found = _text_and_extra(event, content, extra)
    if isinstance(found, Rejected):
        return Rejected(found.reason, event_id, level=found.level)
    admitted = _admit(event, content=content, text=found, extra=extra, room=room, policy=policy)
    if isinstance(admitted, Rejected):
        return Rejected(admitted.reason, event_id, level=admitted.level)
    privacy, unanswered = admitted
    if unanswered:  # recorded as the room's context, not answered (worker/turn.py)
        extra["no_reply"] = unanswered
    text = found
    if len(text) > MAX_TEXT_CHARS:
        note = f"\n[truncated by relaybot: the message had {len(text)} characters]"
        text = text[: MAX_TEXT_CHARS - len(note)] + note
    ts_ms = event.get("origin_server_ts")
    ts = ts_ms / 1000 if isinstance(ts_ms, int | float) and ts_ms > 0 else 0.0
    extra["audience"] = sorted(room.audience)
    session = session_of(room.room_id)
    try:
        return InboundMessage(
            kind=Kind.MESSAGE,
            channel=CHANNEL,
            session=session,
            conversation=conversation_of(room, privacy),
            sender=sender,
            sender_name=room.display_names.get(sender, "")[:320],
            privacy=privacy,
            text=text,
            ts=ts,
            event_id=event_id,
            extra=extra,
        )
    except ValidationError as exc:
        return Rejected(
            f"not a valid message: {describe_validation_error(exc)}", event_id, level=WARNING
        )
