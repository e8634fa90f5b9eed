"""The privacy invariant (DESIGN.md, "The invariant under it") on the production path (issue 24).

    Apart from the owner's own conversations, no text reaches a turn whose audience includes
    anyone who was not in that text's audience when it was said (public knowledge and a
    person's own words excepted) ... it is checked again when a reply is posted.

tests/unit/test_privacy_invariant.py checks this over generated histories with ``Turns.handle``
on one thread. Here the same kind of history runs where production runs it: each message is made
by its gateway's own pure function (``normalize_event`` over ``room_facts`` with the room's
``Openness``; ``parse_email``; ``gateways.cli.normalize``; owner commands as
``relaybot.owner_commands.command_message``) and XADDed to its channel's stream on a real Redis;
the real ``Consumer`` reads the streams, records on its writer, runs the turns (the real
``Turns`` and tools, a scripted model) on its turn pool, queues the replies and acks. Replies are
posted the way the gateways post them: ``deliver_next`` from the reply queues, with the Matrix
gateway's check of the room *as it is at posting time* (``recheck``; ``Withheld`` when it
fails), the e-mail and terminal ones with a plain send. A withheld reply's report goes back to
the worker, which answers again or tells the owner, as in production.

The generated steps: people join, are invited to and leave two Matrix rooms; a room's join rule
changes (invite, public, knock, restricted), its ``history_visibility`` changes, encryption is
turned on (one way); people say something in a room, mail the bot (threads whose recipients
change), the owner types in the terminal and keeps notes; the owner erases a conversation, a
person or one log entry (``memory.erase`` on the terminal's stream); replies are delivered
(``deliver``) or left queued while the rooms change; the worker drains its streams (``drain``),
so turns of several sessions run on the pool side by side.

Every message carries one unique word. The oracle knows who can read each word on its platform
(:class:`Origin`) and who reads what is said where (:class:`Reach`):

- a room whose newcomers read its history (``shared``/``world_readable``, not encrypted) that
  anyone may join (join rule other than invite) or read (``world_readable``): anyone;
  an invite-only one: everyone who was ever in it, and whoever is let in later (its words
  become anyone's as soon as the room is opened);
- an encrypted room, or ``joined``/``invited`` history: the members at that moment only;
- a mail: its From, To and Cc; the terminal: the owner;
- the owner's own conversation (the terminal, an invite-only room of the owner alone that is
  not world-readable, a mail to the bot alone) sees everything, and what its reply quotes is
  said again, when it is posted, to that conversation's audience;
- an erased word is readable by nobody.

It checks every word of every model input and tool result against the audience of its turn,
every word of every posted reply against who can read the room (the mail's recipients) at
posting time, and, after an erasure, that no erased word is anywhere in Redis under the
instance's prefix. The worker is driven as its serving loop drives itself (read, take in,
advance, wait for the pool), until nothing is in hand, within a bounded time; a dead letter
fails the example (every entry here is one a gateway would write).

Random examples (no ``derandomize``): each CI run explores histories of its own, and a failure
prints the blob that replays it (``print_blob``). About 150 histories of 3 to 96 steps run in
about a minute. What this path showed that is not a leak but stopped it (tools run off the
writer, a command that waits forever), and three leaks it found (a room made world-readable
showed its members-only history; an erased word quoted a hop further; an erased note's command
entry stayed in Redis), have their own tests at the end of the module (each failed before its
fix).
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context, event

from contract.config import Config, OwnerAlias
from contract.messages import InboundMessage, Reply
from gateways.cli.gateway import normalize as cli_message
from gateways.deliver import ReplyQueue, Withheld, deliver_next
from gateways.email.parse import Accepted, parse_email
from gateways.matrix.events import (
    Openness,
    RoomFacts,
    normalize_event,
    room_facts,
    room_of,
)
from gateways.matrix.recheck import recheck
from memory.store import MemoryStore
from relaybot.owner_commands import command_message
from tests.support.fakes import InstantModel
from tests.support.privacy_script import (
    BOT_MAIL,
    BOT_MX,
    EVERYONE,
    OWNER,
    PEOPLE,
    WORD,
    mail,
    mail_addresses,
    matrix_policy,
    mx,
    scripted,
    shown,
    word,
)
from tests.support.servers import RedisServer
from worker.main import TurnTools, assemble
from worker.model import Completion, ToolCall
from worker.tools import Tool, ToolRegistry
from worker.turn import Turns

pytestmark = pytest.mark.integration

ROOMS = ("r1", "r2")
JOIN_RULES = ("invite", "public", "knock", "restricted")
VISIBILITY = ("shared", "joined", "invited", "world_readable")
ADMIN = "cli:admin"  # the terminal session the owner's commands come from
DRAIN_S = 30.0  # how long the worker may take to handle what it was given (each a few ms)


def count(what: str) -> None:
    """Counted in hypothesis's statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(what)


# -- the oracle ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """Who reads what is said somewhere: ``people``; with ``room``, also whoever that room lets
    in later (its history is shown to them); with ``anyone``, anyone at all."""

    people: frozenset[str] = frozenset()
    room: str | None = None
    anyone: bool = False

    @property
    def owner_alone(self) -> bool:
        return not self.anyone and self.people <= {OWNER}


@dataclass
class Origin:
    """One place a word was said: who may read it there (a fixed set, or, for a room whose
    newcomers read its history, its members ever since, or anyone)."""

    author: str
    readers: frozenset[str] = frozenset()
    room: str | None = None
    public: bool = False


def origin_of(reach: Reach, author: str) -> Origin:
    if reach.anyone:
        return Origin(author, public=True)
    return Origin(author, reach.people, reach.room)


@dataclass
class Word:
    text: str
    author: str
    channel: str  # matrix, email, cli, or note (an owner's note)
    conversation: str  # where it was first said ("" for a note)
    origins: list[Origin]
    chat: str | None = None  # a note kept for this conversation
    wiped: bool = False  # an erasure took its rows (its note)
    erased: bool = False  # ... and no copy is left: readable by nobody


@dataclass
class Room:
    name: str
    join_rule: str
    visibility: str
    encrypted: bool
    members: set[str] = field(default_factory=set)  # joined and invited
    ever: set[str] = field(default_factory=set)

    @property
    def room_id(self) -> str:
        return f"!{self.name}:m.org"

    @property
    def open(self) -> bool:
        return self.join_rule != "invite"

    @property
    def shared(self) -> bool:
        """Newcomers read what was said before they came."""
        return self.visibility in ("shared", "world_readable") and not self.encrypted

    def reach(self) -> Reach:
        """Who reads what is said in the room now."""
        if self.shared and self.open:
            return Reach(anyone=True)
        if self.shared and self.visibility == "world_readable":
            return Reach(anyone=True, room=self.name)
        if self.shared:
            return Reach(frozenset(self.ever | self.members), room=self.name)
        return Reach(frozenset(self.members))  # encrypted, or joined/invited history

    def owners_own(self) -> bool:
        """An invite-only room of the owner alone that is not world-readable."""
        return not self.open and self.visibility != "world_readable" and self.reach().owner_alone

    def facts(self) -> RoomFacts:
        """The room as the Matrix gateway sees it now."""
        return room_facts(
            self.room_id,
            frozenset({*(mx(p) for p in self.members), BOT_MX}),
            own_user_id=BOT_MX,
            ever=frozenset(mx(p) for p in self.ever | self.members),
            display_names={},
            openness=Openness(
                join_rule=self.join_rule,
                history_visibility=self.visibility,
                encrypted=self.encrypted,
            ),
        )


@dataclass
class Said:
    """A turn's audience: the reach of the conversation its message was said in, then."""

    reach: Reach
    own: bool  # the owner's own conversation: sees everything
    where: str  # for the failure message
    step: int


@dataclass
class World:
    rooms: dict[str, Room]
    links: frozenset[str]
    words: dict[str, Word] = field(default_factory=dict)
    mails: dict[str, frozenset[str]] = field(default_factory=dict)  # session -> recipients
    threads: list[tuple[str, str]] = field(default_factory=list)  # (root Message-ID, last)
    conversations: list[str] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    step: int = 0
    n: itertools.count[int] = field(default_factory=itertools.count)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_word(self, author: str, channel: str, conversation: str, origin: Origin) -> str:
        with self.lock:
            w = word(next(self.n))
            self.words[w] = Word(w, author, channel, conversation, [origin])
        return w

    def query_words(self) -> list[str]:
        """What the model searches for: the newest words, the erased ones, the oldest."""
        with self.lock:
            known = list(self.words)
            erased = [w for w, x in self.words.items() if x.wiped]
        picked = known[-6:] + erased[-4:] + known[:2]
        return list(dict.fromkeys(picked))

    def room_by_id(self, room_id: str) -> Room:
        [room] = [r for r in self.rooms.values() if r.room_id == room_id]
        return room

    def opened(self, room: Room) -> None:
        """Anyone may come in now, and read whatever was said while newcomers read history."""
        for w in self.words.values():
            for o in w.origins:
                if o.room == room.name:
                    o.public = True

    # -- who may read a word -----------------------------------------------------------------

    def may_read(self, person: str, w: Word) -> bool:
        if w.erased:
            return False
        return any(
            o.public
            or person == o.author
            or person in o.readers
            or (o.room is not None and person in self.rooms[o.room].ever)
            for o in w.origins
        )

    def anyone_reads(self, w: Word) -> bool:
        return not w.erased and any(o.public for o in w.origins)

    def covered(self, w: Word, reach: Reach) -> bool:
        """Everyone ``reach`` names may read ``w`` (the owner reads everything not erased)."""
        if w.erased:
            return False
        if reach.anyone:
            return self.anyone_reads(w)
        if reach.room is not None and not (
            self.anyone_reads(w) or any(o.room == reach.room for o in w.origins)
        ):
            return False  # someone let into the room later would read it
        return all(self.may_read(p, w) for p in reach.people - {OWNER})

    def explain(self, w: Word) -> str:
        def to(o: Origin) -> str:
            if o.public:
                return "anyone"
            return f"room {o.room} ever" if o.room else str(sorted(o.readers))

        origins = "; ".join(f"by {o.author} to {to(o)}" for o in w.origins)
        state = "ERASED " if w.erased else "erased (a copy kept) " if w.wiped else ""
        return f"{state}{w.text} (said in {w.conversation or 'a note'}: {origins})"


# -- the model -----------------------------------------------------------------------------------


class ScriptedModel:
    """Calls search_history and recall (for the newest words, the erased ones and the oldest)
    and remember, then quotes every word it saw. Runs on the pool's threads: keeps each call's
    input, with the stream id of the turn (which ``Turns.run`` binds), under a lock."""

    name = "scripted"

    def __init__(self, world: World) -> None:
        self.world = world
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str]] = []  # (stream id of the turn, what it was shown)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        sid = str(structlog.contextvars.get_contextvars().get("stream_id", ""))
        text = shown(messages)  # it quotes and remembers only what it was shown
        with self.lock:
            self.seen.append((sid, text))
        return scripted(messages, tools, text, self.world.query_words())

    def close(self) -> None:
        pass


# -- the steps -----------------------------------------------------------------------------------

room = st.sampled_from(ROOMS)
person = st.sampled_from(EVERYONE)
say = st.tuples(st.just("say"), room, st.integers(min_value=0, max_value=3))  # which member
membership = st.tuples(st.sampled_from(["join", "invite", "leave"]), room, person)
setting = st.one_of(
    st.tuples(st.just("rule"), room, st.sampled_from(JOIN_RULES)),
    st.tuples(st.just("visibility"), room, st.sampled_from(VISIBILITY)),
    st.tuples(st.just("encrypt"), room),
)
mails = st.tuples(
    st.just("mail"),
    person,
    st.frozensets(person, max_size=3),
    st.integers(min_value=0, max_value=3),  # which thread it answers (0: a new one)
)
step = st.one_of(  # a strategy given twice is drawn about twice as often
    say,
    membership,
    setting,
    mails,
    st.tuples(st.sampled_from(["deliver", "drain"])),
    say,
    st.tuples(
        st.just("erase"),
        st.sampled_from(["conversation", "entity", "id"]),
        st.integers(min_value=0, max_value=11),  # which one
    ),
    st.tuples(st.just("cli")),
    say,
    membership,
    st.tuples(
        st.just("note"),
        st.sampled_from(["shared", "chat"]),
        st.sampled_from(["public", "private", "internal"]),
    ),
    mails,
    setting,
    st.tuples(st.sampled_from(["deliver", "drain"])),
)
room_state = st.tuples(
    st.sampled_from(JOIN_RULES),
    st.sampled_from(VISIBILITY),
    st.booleans(),  # encrypted
    st.one_of(  # its members at first: the owner alone (her DM), with one other, any
        st.just(frozenset({OWNER})),
        st.just(frozenset({OWNER, "bob"})),
        st.frozensets(person, min_size=1, max_size=3),
    ),
)


# -- the production path -------------------------------------------------------------------------


class Run:
    """One history on a real Redis (a prefix of its own) through the real Consumer."""

    def __init__(self, world: World, home: Path, r: redis.Redis) -> None:
        self.world, self.r = world, r
        self.prefix = f"t{uuid.uuid4().hex[:10]}:"
        self.cfg = Config.model_validate(
            {
                "home": home,
                "owner": {
                    "name": "Ada",
                    "aliases": [
                        OwnerAlias(address=mx(OWNER), channel="matrix"),
                        OwnerAlias(address=mail(OWNER), channel="email"),
                    ],
                },
                "redis": {"prefix": self.prefix},
                "model": {"concurrency": 4},
            }
        )
        self.keys = self.cfg.keys
        self.memory_path = home / "memory.sqlite3"
        self.store = MemoryStore(self.memory_path)
        self.model = ScriptedModel(world)
        turns = Turns(self.cfg, self.store, self.model, TurnTools())
        self.consumer = assemble(self.cfg, r, turns)
        assert self.consumer.acquire(wait=False)
        self.consumer.reader.ensure_group()
        self.consumer.reader.recover()
        self.policy = matrix_policy()
        self.addrs = mail_addresses()
        self.said: dict[str, Said] = {}  # stream id -> the audience of its turn
        self.checked = 0  # model calls checked so far
        self.posted: list[str] = []  # the texts of the replies posted
        for p in sorted(world.links):  # the owner verified that these handles are one person
            self.command("entities.link", {"a": f"matrix:{mx(p)}", "b": f"email:{mail(p)}"})

    def close(self) -> None:
        self.consumer.writer.pool.close()
        self.consumer.lease.release()
        self.store.close()
        for key in self.r.scan_iter(match=f"{self.prefix}*", count=1000):
            self.r.delete(key)

    # -- the streams and the worker ------------------------------------------------------------

    def publish(self, msg: InboundMessage) -> str:
        raw = self.r.xadd(self.keys.inbound_of(msg.channel), msg.to_fields())  # type: ignore[arg-type]
        self.world.sessions.add(msg.session)
        return f"{msg.channel}/{raw.decode() if isinstance(raw, bytes) else raw}"

    def drain(self) -> None:
        """The worker's own rounds, as its serving loop runs them (read what came, take it in,
        advance: the writer's side of the turns on the pool, new turns, the flush), until
        nothing is left in hand: every turn finished, its reply recorded, queued and acked.
        Bounded: a worker that stops making progress fails the example. Then the turns are
        checked."""
        consumer = self.consumer
        deadline = time.monotonic() + DRAIN_S
        while True:
            consumer.writer.take(consumer.reader.read(block_ms=0))
            consumer.writer.advance()
            if not consumer.writer.in_hand():
                break
            assert time.monotonic() < deadline, (
                f"the worker did not become idle within {DRAIN_S:g} s: "
                f"{consumer.writer.in_hand()} entries in hand, "
                f"{len(consumer.writer.jobs)} turns running"
            )
            consumer.writer.pool.wait(0.05)  # woken as soon as a turn finishes
        consumer.committer.acked()
        dead = self.r.xrange(self.keys.dead)
        assert not dead, f"dead letters: {dead}"
        self.check_turns()

    def check_turns(self) -> None:
        world = self.world
        with self.model.lock:
            calls = self.model.seen[self.checked :]
            self.checked += len(calls)
        for sid, text in calls:
            said = self.said.get(sid) or self.report_turn(sid)
            for w in sorted(set(WORD.findall(text))):
                known = world.words.get(w)
                assert known is not None, f"{w}, a word nobody said, reached a turn"
                if known.erased:
                    raise AssertionError(
                        f"{world.explain(known)} reached a turn of {said.where} after its erasure"
                    )
                if not said.own and not world.covered(known, said.reach):
                    raise AssertionError(
                        f"{world.explain(known)} reached a turn of {said.where} (message of "
                        f"step {said.step}) whose audience is {describe(said.reach)}"
                    )

    def report_turn(self, sid: str) -> Said:
        """A turn answering a withheld reply's report again: for the room as it is now."""
        channel, _, raw = sid.partition("/")
        found = self.r.xrange(self.keys.inbound_of(channel), raw, raw)
        assert found, f"a turn of an entry that is not in the streams: {sid}"
        fields: dict[bytes, bytes] = found[0][1]  # type: ignore[assignment]
        session = fields[b"session"].decode()
        room = self.world.room_by_id(room_of(session))
        count("a withheld reply answered again")
        where = f"{session} (answered again after a withheld reply)"
        return Said(room.reach(), room.owners_own(), where, self.world.step)

    def command(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """An owner command on the terminal's stream; its result, as the terminal gets it.
        Sent when the worker has nothing in hand: a command read together with an owner's
        message of another session that waits is never applied (test_a_command_read_behind_
        an_owner_message_is_applied, below), and the worker stops."""
        self.drain()
        sid = self.publish(command_message(ADMIN, op, args, "ada"))
        self.drain()
        got: list[Reply] = []
        queue = ReplyQueue(self.r, self.keys, ADMIN, max_age=3600, gateway="gateway:cli")
        while deliver_next(queue, got.append, timeout=0):
            pass
        [reply] = [x for x in got if x.answers == sid]
        result: dict[str, Any] = json.loads(reply.text)
        for w in WORD.findall(reply.text):
            assert not self.world.words[w].erased, f"{w}: erased, in a command's answer"
        return result

    # -- posting, as the gateways do it --------------------------------------------------------

    def deliver(self) -> None:
        """Every session's replies posted (a withheld one reported), then the worker reads the
        reports (and answers again, or tells the owner)."""
        for session in sorted(self.world.sessions):
            channel = session.split(":", 1)[0]
            queue = ReplyQueue(
                self.r, self.keys, session, max_age=3600, gateway=f"gateway:{channel}"
            )
            send = self.sender(channel)
            for _ in range(100):
                if not self.r.exists(queue.queue, queue.inflight):
                    break
                deliver_next(
                    queue,
                    send,
                    timeout=0,
                    idempotent_sink=channel != "email",
                    report_delivered=channel == "email",
                )
            else:
                raise AssertionError(f"{session}: its replies were not delivered")
        self.drain()

    def sender(self, channel: str) -> Callable[[Reply], None]:
        world = self.world

        def matrix(reply: Reply) -> None:
            room = world.room_by_id(room_of(reply.session))
            # the Matrix gateway's check (gateways/matrix/recheck.py)
            verdict = recheck(reply, room.facts(), self.policy)
            if verdict is not None:
                count("a reply withheld")
                raise Withheld(verdict.reason, verdict.report)
            self.post(reply, room.reach(), room.owners_own(), f"room {room.name}")

        def email(reply: Reply) -> None:
            readers = world.mails[reply.session]
            self.post(reply, Reach(readers), readers == {OWNER}, f"mail to {sorted(readers)}")

        def cli(reply: Reply) -> None:
            self.post(reply, Reach(frozenset({OWNER})), True, reply.session)

        return {"matrix": matrix, "email": email, "cli": cli}[channel]

    def post(self, reply: Reply, reach: Reach, own: bool, where: str) -> None:
        """A reply is shown to everyone who can read ``where`` now. The owner's own
        conversation's reply, posted where the owner alone reads it, says again what it quotes
        (to whoever the owner lets in later, where the history is shown); any other reply may
        say only what its readers may all read."""
        world = self.world
        self.posted.append(reply.text)
        words = [world.words.get(w) for w in sorted(set(WORD.findall(reply.text)))]
        for w in words:
            assert w is not None, f"a reply posted to {where} says a word nobody said"
            if w.erased:
                raise AssertionError(f"{world.explain(w)} was posted to {where} after its erasure")
        if own and reply.extra.get("privacy") == "owner":
            for w in words:
                assert w is not None
                w.origins.append(origin_of(reach, OWNER))
            return
        for w in words:
            assert w is not None
            if not world.covered(w, reach):
                raise AssertionError(
                    f"{world.explain(w)} was posted to {where}, read by {describe(reach)} "
                    f"(a reply written for {reply.extra.get('privacy')} in "
                    f"{reply.conversation})"
                )

    # -- the platforms, as their gateways see them ---------------------------------------------

    def say(self, name: str, which: int) -> None:
        world = self.world
        room = world.rooms[name]
        if not room.members:
            return
        members = sorted(room.members)
        who = members[which % len(members)]
        reach = room.reach()
        text = world.new_word(who, "matrix", "", origin_of(reach, who))
        event = {
            "event_id": f"$e{len(world.words)}",
            "sender": mx(who),
            "type": "m.room.message",
            "origin_server_ts": int(time.time() * 1000),
            "content": {"msgtype": "m.text", "body": text},
        }
        msg = normalize_event(event, room.facts(), self.policy)
        assert isinstance(msg, InboundMessage), msg
        world.words[text].conversation = msg.conversation
        own = room.owners_own()
        self.message(msg, Said(reach, own, f"{msg.conversation} ({msg.privacy.value})", world.step))

    def mail(self, sender: str, to: frozenset[str], thread: int) -> None:
        world = self.world
        readers = frozenset({sender, *to})
        message_id = f"<m{len(world.words)}@example.org>"
        headers = [
            f"From: {sender.title()} <{mail(sender)}>",
            "To: " + ", ".join([BOT_MAIL, *(mail(p) for p in sorted(to))]),
            f"Message-ID: {message_id}",
            "Subject: hi",
        ]
        if thread and world.threads:
            root, last = world.threads[(thread - 1) % len(world.threads)]
            headers += [f"In-Reply-To: {last}", f"References: {root} {last}"]
            world.threads[(thread - 1) % len(world.threads)] = (root, message_id)
        else:
            world.threads.append((message_id, message_id))

        text = world.new_word(sender, "email", "", Origin(sender, readers))
        raw = ("\r\n".join(headers) + f"\r\n\r\n{text}\r\n").encode()
        parsed = parse_email(raw, self.addrs, time.time())
        assert isinstance(parsed, Accepted), parsed
        msg = parsed.message
        world.words[text].conversation = msg.conversation
        world.mails[msg.session] = readers
        reach = Reach(readers)
        self.message(msg, Said(reach, readers == {OWNER}, f"mail {msg.conversation}", world.step))

    def cli(self) -> None:
        world = self.world
        conversation = "cli:own"
        text = world.new_word(OWNER, "cli", conversation, Origin(OWNER, frozenset({OWNER})))
        msg = cli_message("own", text, sender="ada")
        self.message(msg, Said(Reach(frozenset({OWNER})), True, conversation, world.step))

    def message(self, msg: InboundMessage, said: Said) -> None:
        sid = self.publish(msg)
        self.said[sid] = said
        if msg.conversation not in self.world.conversations:
            self.world.conversations.append(msg.conversation)

    def note(self, scope: str, visibility: str) -> None:
        world = self.world
        chat = None
        if scope == "chat":
            if not world.conversations:
                return
            chat = world.conversations[-1]
        public = visibility == "public"
        text = world.new_word(OWNER, "note", "", Origin(OWNER, frozenset({OWNER}), public=public))
        world.words[text].chat = chat
        args: dict[str, Any] = {"text": f"note {text}", "scope": scope, "visibility": visibility}
        if chat is not None:
            args["chat"] = chat
        assert self.command("notes.add", args)["ok"]

    # -- erasure -------------------------------------------------------------------------------

    def erase(self, kind: str, pick: int) -> None:
        world = self.world
        self.drain()  # what was said before is in memory
        said = [w for w in world.words.values() if w.channel != "note" and not w.wiped]
        if kind == "conversation":
            if not world.conversations:
                return
            target = world.conversations[pick % len(world.conversations)]
            gone = [
                w
                for w in world.words.values()
                if not w.wiped and (w.conversation == target or w.chat == target)
            ]
        elif kind == "entity":
            who = PEOPLE[pick % len(PEOPLE)]
            channel = ("matrix", "email")[pick // len(PEOPLE) % 2]
            target = f"matrix:{mx(who)}" if channel == "matrix" else f"email:{mail(who)}"
            channels = {"matrix", "email"} if who in world.links else {channel}
            gone = [w for w in said if w.author == who and w.channel in channels]
        else:
            if not said:
                return
            w = said[pick % len(said)]
            with self.memory() as conn:
                rows = conn.execute(
                    "SELECT id, text FROM log WHERE direction = 'in' AND text LIKE ?",
                    (f"%{w.text}%",),
                ).fetchall()
            found = [i for i, t in rows if w.text in WORD.findall(t)]
            assert found, f"{w.text} is not in memory"
            target, gone = str(found[0]), [w]
        args = {"kind": kind, "target": target, "reason": "asked to", "requested_by": "ada"}
        result = self.command("memory.erase", args)
        if not result["ok"]:
            assert not gone, f"erase {kind} {target} refused ({result}): {[w.text for w in gone]}"
            return
        count(f"erased by {kind}")
        for w in gone:
            w.wiped = True
            w.erased = True
        self.check_redis(f"erase {kind} {target}")

    def memory(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.memory_path}?mode=ro", uri=True)

    def check_redis(self, what: str) -> None:
        """No copy of an erased word is left in Redis (streams, queues, dead letters...)."""
        erased = {w for w, x in self.world.words.items() if x.erased}
        for key, value in self.redis_values():
            found = erased & set(WORD.findall(value))
            assert not found, f"after {what}: {sorted(found)} still in Redis, {key!r}: {value}"

    def redis_values(self) -> Iterator[tuple[bytes, str]]:
        """Every value under the instance's prefix."""
        r = self.r
        for key in r.scan_iter(match=f"{self.prefix}*", count=1000):
            kind = r.type(key)
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            values: list[Any] = []
            if kind == "string":
                values = [r.get(key)]
            elif kind == "list":
                values = list(r.lrange(key, 0, -1))
            elif kind == "hash":
                values = [r.hgetall(key)]
            elif kind == "zset":
                values = list(r.zrange(key, 0, -1))
            elif kind == "set":
                values = list(r.smembers(key))
            elif kind == "stream":
                values = [fields for _id, fields in r.xrange(key)]  # type: ignore[union-attr]
            for value in values:
                yield key, str(value)


def describe(reach: Reach) -> str:
    if reach.anyone:
        return "anyone"
    later = f" and whoever joins {reach.room} later" if reach.room else ""
    return f"{sorted(reach.people)}{later}"


def play(run: Run, steps: list[tuple[Any, ...]], *, finish: bool = True) -> None:
    world = run.world
    for n, (kind, *args) in enumerate(steps, start=1):
        world.step = n
        if kind in ("join", "invite"):
            room = world.rooms[args[0]]
            room.members.add(args[1])
            room.ever.add(args[1])
        elif kind == "leave":
            world.rooms[args[0]].members.discard(args[1])
        elif kind == "rule":
            room = world.rooms[args[0]]
            room.join_rule = args[1]
            if room.open:
                world.opened(room)
        elif kind == "visibility":
            world.rooms[args[0]].visibility = args[1]
        elif kind == "encrypt":
            world.rooms[args[0]].encrypted = True
        elif kind == "say":
            run.say(*args)
        elif kind == "mail":
            run.mail(*args)
        elif kind == "cli":
            run.cli()
        elif kind == "note":
            run.note(*args)
        elif kind == "erase":
            run.erase(*args)
        elif kind == "deliver":
            run.drain()
            run.deliver()
        else:
            run.drain()
    if not finish:
        return
    world.step += 1
    run.drain()
    for _ in range(4):  # what is left: posted; withheld ones answered again or told, posted too
        run.deliver()
    for session in world.sessions:
        assert not run.r.exists(run.keys.reply(session)), f"{session}: replies left unposted"
    turns = len(run.model.seen) // 2  # two model calls a turn: tools, then the answer
    count(
        f"turns: {'0' if not turns else '1-9' if turns < 10 else '10-19' if turns < 20 else '20+'}"
    )
    posted = len(run.posted)
    count(f"replies posted: {'0' if not posted else '1-9' if posted < 10 else '10+'}")


@pytest.mark.timeout(600)  # a failure is shrunk, one history at a time, for minutes
@settings(
    max_examples=150,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no explain: slow
    report_multiple_bugs=False,  # shrink the first one found, and only that one
    print_blob=True,  # a CI failure prints @reproduce_failure(...) to replay it here
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    rooms=st.fixed_dictionaries({r: room_state for r in ROOMS}),
    links=st.frozensets(st.sampled_from(PEOPLE)),
    chunks=st.lists(st.lists(step, min_size=1, max_size=8), min_size=3, max_size=12),
)
def test_no_text_reaches_a_turn_or_a_room_whose_audience_could_not_read_it(
    redis_server: RedisServer,
    rooms: dict[str, tuple[str, str, bool, frozenset[str]]],
    links: frozenset[str],
    chunks: list[list[tuple[Any, ...]]],
) -> None:
    steps = [s for chunk in chunks for s in chunk]  # lists of lists: longer, still shrinkable
    world = World(
        rooms={
            name: Room(name, rule, visibility, encrypted, set(members), set(members))
            for name, (rule, visibility, encrypted, members) in rooms.items()
        },
        links=links,
    )
    r = redis_server.client()
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(world, Path(tmp), r)
        try:
            play(run, steps)
        finally:
            run.close()
            r.close()


# -- what the production path showed (not privacy leaks; each stops the property above) --------


class Worker:
    """The real Consumer on the real Redis, under a prefix of its own."""

    def __init__(self, home: Path, r: redis.Redis, model: Any, tools: ToolRegistry) -> None:
        self.r = r
        self.cfg = Config.model_validate(
            {
                "home": home,
                "owner": {"name": "Ada", "aliases": ["ada"]},
                "redis": {"prefix": f"t{uuid.uuid4().hex[:10]}:"},
            }
        )
        self.store = MemoryStore(home / "memory.sqlite3")
        self.consumer = assemble(self.cfg, r, Turns(self.cfg, self.store, model, tools))
        assert self.consumer.acquire(wait=False)
        self.consumer.reader.ensure_group()

    def publish(self, msg: InboundMessage) -> str:
        raw = self.r.xadd(self.cfg.keys.inbound_of(msg.channel), msg.to_fields())  # type: ignore[arg-type]
        return f"{msg.channel}/{raw.decode() if isinstance(raw, bytes) else raw}"

    def advance(self, seconds: float) -> None:
        """The consumer's own rounds (read, take, advance, wait for the pool), for at most
        ``seconds``, until nothing is in hand: bounded, whatever the worker does."""
        consumer = self.consumer
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            consumer.writer.take(consumer.reader.read(block_ms=0))
            consumer.writer.advance()
            if not consumer.writer.in_hand():
                consumer.committer.acked()
                return
            consumer.writer.pool.wait(0.05)

    def close(self) -> None:
        self.consumer.writer.pool.close()
        self.consumer.lease.release()
        self.store.close()
        for key in self.r.scan_iter(match=f"{self.cfg.keys.prefix}*", count=1000):
            self.r.delete(key)


@pytest.fixture
def worker_of(
    redis_server: RedisServer, tmp_path: Path
) -> Iterator[Callable[[Any, ToolRegistry], Worker]]:
    made: list[Worker] = []
    r = redis_server.client()

    def make(model: Any, tools: ToolRegistry) -> Worker:
        made.append(Worker(tmp_path, r, model, tools))
        return made[-1]

    yield make
    for w in made:
        w.close()
    r.close()


class CallsOneTool:
    """Calls the tool ``where`` once, then answers."""

    name = "one-tool"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if messages[-1].get("role") == "tool":
            return Completion(content="done", finish_reason="stop")
        return Completion(tool_calls=[ToolCall(id="w", name="where", arguments={})],
                          finish_reason="tool_calls")  # fmt: skip


def test_a_turns_tool_calls_run_on_the_writer(
    worker_of: Callable[[Any, ToolRegistry], Worker],
) -> None:
    ran_on: list[int] = []

    def where(_args: dict[str, Any]) -> str:
        ran_on.append(threading.get_ident())
        return "here"

    tools = ToolRegistry([Tool("where", "where the call runs", {"type": "object"}, where)])
    w = worker_of(CallsOneTool(), tools)
    w.publish(cli_message("t", "where do tools run?", sender="ada"))
    w.advance(10)
    assert ran_on, "the tool was not called"
    # worker/pool.py: "Everything that touches memory stays on the writer: a tool call is
    # handed to it"; the writer is this thread (the one that drives the consumer)
    assert ran_on == [threading.get_ident()]


def test_a_command_read_behind_an_owner_message_is_applied(
    worker_of: Callable[[Any, ToolRegistry], Worker],
) -> None:
    w = worker_of(InstantModel(), ToolRegistry())
    w.publish(cli_message("t", "hello", sender="ada"))  # the owner types in a terminal, and
    sid = w.publish(command_message(ADMIN, "memory.stats", {}, "ada"))  # runs a command
    w.advance(3)
    assert not w.consumer.writer.in_hand(), "the worker holds both entries and does nothing"
    queued = [Reply.from_json(x) for x in w.r.lrange(w.cfg.keys.reply(ADMIN), 0, -1)]
    assert [q.answers for q in queued] == [sid]


# -- a leak the property found -------------------------------------------------------------------


def test_a_room_made_world_readable_keeps_its_members_only_history_out(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    room = Room("r1", "invite", "shared", False, {OWNER, "bob"}, {OWNER, "bob"})
    world = World(rooms={"r1": room}, links=frozenset())
    r = redis_server.client()
    run = Run(world, tmp_path, r)
    try:
        run.say("r1", 1)  # bob, to the members (and whoever they invite later)
        [members_only] = list(world.words)
        run.drain()
        room.visibility = "world_readable"  # from now on anyone reads the room, member or not
        run.say("r1", 1)
        run.deliver()
        turn = run.model.seen[-1][1]
        assert members_only not in WORD.findall(turn), "the turn was shown it"
        assert not any(members_only in WORD.findall(t) for t in run.posted[1:]), "posted"
    finally:
        run.close()
        r.close()


def test_an_erased_notes_command_entry_leaves_the_stream(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    room = Room("r1", "invite", "joined", False, {OWNER}, {OWNER})
    world = World(rooms={"r1": room}, links=frozenset())
    r = redis_server.client()
    run = Run(world, tmp_path, r)
    try:
        run.say("r1", 0)  # the owner's own room: a conversation to keep a note for
        run.note("chat", "private")
        note = list(world.words)[-1]
        assert world.words[note].chat == world.conversations[-1]
        run.erase("conversation", 0)
        assert world.words[note].erased
        stream = r.xrange(run.keys.inbound_of("cli"))
        assert not [f for _id, f in stream if note in WORD.findall(str(f))]  # type: ignore[union-attr]
    finally:
        run.close()
        r.close()


def test_an_erased_word_quoted_by_a_reanswer_is_erased_too(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    room = Room("r1", "invite", "joined", False, {OWNER}, {OWNER})  # the owner's own DM
    world = World(rooms={"r1": room}, links=frozenset())
    r = redis_server.client()
    run = Run(world, tmp_path, r)
    try:
        # the owner types a word in the terminal; in her DM, her turn sees it and quotes it
        play(run, [("cli",), ("say", "r1", 0), ("drain",)], finish=False)
        [typed] = [w for w in world.words.values() if w.channel == "cli"]
        # her DM is made public: her reply is withheld and answered again for a group, from the
        # conversation's history, her reply included; then she erases the terminal's words
        play(run, [("rule", "r1", "public"), ("deliver",), ("deliver",)], finish=False)
        # (the re-answer, a group's, no longer sees the owner's reply: memory/privacy.py)
        assert not any(typed.text in WORD.findall(t) for t in run.posted[1:])
        run.erase("conversation", world.conversations.index("cli:own"))
        assert typed.erased
        run.say("r1", 0)
        run.drain()  # the oracle: "... reached a turn of matrix:!r1:m.org/... after its erasure"
    finally:
        run.close()
        r.close()
