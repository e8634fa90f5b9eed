"""The privacy invariant (README, "The privacy invariant"), as a property over generated histories.

    Apart from the owner's own conversations, no text reaches the model's input, a tool result
    or a reply in a turn whose audience includes anyone who was not in the audience of that text
    when it was said (public knowledge and a person's own words excepted).

A history is generated: Matrix rooms of every ``history_visibility`` that people join and leave,
e-mail threads whose recipients change from mail to mail, the owner's terminal, linked and
unlinked handles, the owner's notes of every scope and visibility, and profile facts (layer 2)
about the people, each resting on messages of one conversation, some a new version of a fact from
another conversation (inheriting its evidence) or contradicting one. Each message is made the way
its gateway makes it (``gateways.matrix.events.normalize_event`` over ``room_facts``;
``gateways.email.parse.parse_email`` over a raw mail) and handled by the worker's real ``Turns``
with the real tools, against a scripted model that in every turn calls ``search_history`` and
``recall`` for words of every conversation, ``profile`` for everyone, ``remember``s what it saw,
and quotes all it saw in its reply. Every message carries one unique word; the oracle knows
who could read each word on its platform (a room's members then, or everyone who ever joined
when the room shows history to newcomers; a mail's From/To/Cc; the terminal's owner; for a
fact's word, whoever could read every message it rests on) and checks every word of every model
input (the profiles section included) and tool result against the audience of the turn.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.config import Config, OwnerAlias
from contract.messages import InboundMessage
from gateways.cli.gateway import normalize as cli_message
from gateways.email.parse import Accepted, parse_email
from gateways.matrix.events import normalize_event, room_facts
from memory import commands, profiles
from memory.command_types import CommandContext
from memory.store import MemoryStore
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
from tests.support.worker import handle_entry
from worker.main import TurnTools
from worker.model import Completion
from worker.turn import Turns

ROOMS = ("r1", "r2")
VISIBILITY = ("shared", "joined", "invited", "world_readable")


@dataclass
class Origin:
    """Who could read a word on its platform: a fixed set, or a room's members ever since."""

    author: str
    readers: frozenset[str] = frozenset()
    room: str | None = None  # a room showing history to newcomers: its members, ever
    public: bool = False
    sources: tuple[str, ...] = ()  # a profile fact's: the words of the messages it rests on


@dataclass
class World:
    visibility: dict[str, str]
    members: dict[str, set[str]] = field(default_factory=lambda: {r: set() for r in ROOMS})
    ever: dict[str, set[str]] = field(default_factory=lambda: {r: set() for r in ROOMS})
    threads: list[tuple[str, str]] = field(default_factory=list)  # (root Message-ID, last)
    origins: dict[str, list[Origin]] = field(default_factory=dict)  # where each was said
    conversations: list[str] = field(default_factory=list)
    n: itertools.count[int] = field(default_factory=itertools.count)

    def new_word(self, origin: Origin) -> str:
        w = word(next(self.n))
        self.origins[w] = [origin]
        return w

    def may_read(self, person: str, w: str) -> bool:
        return any(self._may_read(person, o) for o in self.origins[w])

    def _may_read(self, person: str, o: Origin) -> bool:
        if o.sources:  # a fact: whoever could read every message it rests on
            return all(self.may_read(person, w) for w in o.sources)
        if o.public or person == o.author:
            return True
        if o.room is not None:
            return self.visibility[o.room] == "world_readable" or person in self.ever[o.room]
        return person in o.readers


class ScriptedModel:
    """Calls search_history and recall (for words of every conversation) and remember, then
    quotes every word it saw. Keeps each turn's whole input for the oracle."""

    name = "scripted"

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: list[str] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        text = shown(messages)  # it quotes and remembers only what it was shown
        self.seen.append(text)
        return scripted(messages, tools, text, list(self.world.origins)[-8:])

    def close(self) -> None:
        pass


step = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(ROOMS), st.sampled_from(EVERYONE)),
    st.tuples(st.just("leave"), st.sampled_from(ROOMS), st.sampled_from(EVERYONE)),
    st.tuples(st.just("say"), st.sampled_from(ROOMS), st.sampled_from(EVERYONE)),
    st.tuples(
        st.just("mail"),
        st.sampled_from(EVERYONE),
        st.frozensets(st.sampled_from(EVERYONE), max_size=3),
        st.integers(min_value=0, max_value=3),  # which thread it answers (0: a new one)
    ),
    st.tuples(st.just("cli")),
    st.tuples(
        st.just("note"),
        st.sampled_from(["shared", "chat"]),
        st.sampled_from(["public", "private", "internal"]),
    ),
    st.tuples(
        st.just("fact"),
        st.integers(min_value=0, max_value=7),  # which message it rests on, from the newest
        st.integers(min_value=1, max_value=3),  # on how many of that conversation's messages
        st.sampled_from(["new", "supersedes", "contradicts"]),
        st.booleans(),  # about the owner (else about who said the message)
    ),
)


class Run:
    def __init__(self, world: World, home: Path, links: frozenset[str]) -> None:
        self.world = world
        cfg = Config.model_validate(
            {
                "home": home,
                "owner": {
                    "name": "Ada",
                    "aliases": [
                        OwnerAlias(address=mx(OWNER), channel="matrix"),
                        OwnerAlias(address=mail(OWNER), channel="email"),
                    ],
                },
            }
        )
        self.store = MemoryStore(home / "memory.sqlite3")
        self.model = ScriptedModel(world)
        self.turns = Turns(cfg, self.store, self.model, TurnTools())
        self.policy = matrix_policy()
        self.addrs = mail_addresses()
        self.sid = itertools.count(1)
        self.rows: list[tuple[int, str, str, str]] = []  # messages: log id, conversation, entity,
        self.sources: dict[int, tuple[str, ...]] = {}  # word; each fact's words it rests on
        self.again: Callable[[], None] | None = None  # the step being taken, to take again
        self.replay: dict[str, Callable[[], None]] = {}  # a message more in that conversation
        for person in sorted(links):  # the owner verified that these handles are one person
            self.command(
                "entities.link", {"a": f"matrix:{mx(person)}", "b": f"email:{mail(person)}"}
            )

    def command(self, op: str, args: dict[str, Any]) -> None:
        ctx = CommandContext(f"cli/{next(self.sid)}-0", self.store, owner_name="Ada")
        with self.store.transaction():
            result = commands.apply(ctx, op, args)
        assert result["ok"], result

    def turn(self, msg: InboundMessage, audience: frozenset[str], said_to: Origin) -> None:
        """Handle ``msg``; every word the model was shown must be readable by ``audience``.
        ``said_to``: who can read what is said in this conversation (the reply)."""
        self.world.conversations.append(msg.conversation)
        before = len(self.model.seen)
        if self.again is not None:
            self.replay[msg.conversation] = self.again
        sid = f"{msg.channel}/{next(self.sid)}-0"
        outcome = handle_entry(self.turns, sid, msg.to_fields(), channel=msg.channel)
        self.turns.settle()
        row = self.store.conn.execute(
            "SELECT id, conversation, entity, text FROM log WHERE direction = 'in' AND "
            "stream_id = ?",
            (sid,),
        ).fetchone()
        said = WORD.findall(str(row[3])) if row is not None else []
        if row is not None and row[2] is not None and len(said) == 1:  # its one word
            self.rows.append((int(row[0]), str(row[1]), str(row[2]), said[0]))
        others = audience - {OWNER}
        if not others:
            # the owner's own conversation sees everything, and what its reply quotes is said
            # again, to this conversation's audience (in a room that shows its history to
            # newcomers: whoever the owner lets in later, as Matrix shows it to them)
            reply = outcome.reply.text if outcome.reply is not None else ""
            for w in set(WORD.findall(reply)):
                self.world.origins[w].append(said_to)
            return
        for text in self.model.seen[before:]:
            for w in set(WORD.findall(text)):
                for person in others:
                    assert self.world.may_read(person, w), (
                        f"{w} (said by {self.world.origins[w][0].author}) reached a turn of "
                        f"{sorted(audience)} in {msg.conversation}"
                    )

    # -- the platforms, as their gateways see them ---------------------------------------------

    def say(self, room: str, person: str) -> None:
        self.again = lambda: self.say(room, person)
        world = self.world
        members = world.members[room]
        if person not in members:
            return
        shared = world.visibility[room] in ("shared", "world_readable")
        origin = Origin(person, frozenset(members), room if shared else None)
        text = world.new_word(origin)
        facts = room_facts(
            f"!{room}:m.org",
            frozenset({*(mx(p) for p in members), BOT_MX}),
            own_user_id=BOT_MX,
            history_visibility=world.visibility[room],
            ever=frozenset(mx(p) for p in world.ever[room]),
            display_names={},
        )
        event = {
            "event_id": f"$e{len(world.origins)}",
            "sender": mx(person),
            "type": "m.room.message",
            "origin_server_ts": int(time.time() * 1000),
            "content": {"msgtype": "m.text", "body": text},
        }
        msg = normalize_event(event, facts, self.policy)
        assert isinstance(msg, InboundMessage), msg
        audience = frozenset(world.ever[room]) if shared else frozenset(members)
        if world.visibility[room] == "world_readable":
            audience |= frozenset(EVERYONE)  # anyone can read it
        self.turn(msg, audience, origin)

    def mail(self, sender: str, to: frozenset[str], thread: int) -> None:
        world = self.world
        # the same thread again (a new one: the one it starts, the newest)
        self.again = lambda: self.mail(sender, to, thread or len(world.threads))
        readers = frozenset({sender, *to})
        text = world.new_word(Origin(sender, readers))
        message_id = f"<m{len(world.origins)}@example.org>"
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
        raw = ("\r\n".join(headers) + f"\r\n\r\n{text}\r\n").encode()
        parsed = parse_email(raw, self.addrs, time.time())
        assert isinstance(parsed, Accepted), parsed
        self.turn(parsed.message, readers, Origin(OWNER, readers))

    def cli(self) -> None:
        self.again = self.cli
        origin = Origin(OWNER, frozenset({OWNER}))
        text = self.world.new_word(origin)
        self.turn(cli_message("own", text, sender="ada"), frozenset({OWNER}), origin)

    def note(self, scope: str, visibility: str) -> None:
        public = visibility == "public"
        text = self.world.new_word(Origin(OWNER, frozenset({OWNER}), public=public))
        args: dict[str, Any] = {"text": f"note {text}", "scope": scope, "visibility": visibility}
        if scope == "chat":
            if not self.world.conversations:
                return
            args["chat"] = self.world.conversations[-1]
        self.command("notes.add", args)

    def fact(self, pick: int, count: int, how: str, owner: bool) -> None:
        """A profile fact about the speaker of a recent message (or the owner), resting on
        ``count`` messages of its conversation from that one on; ``supersedes``/``contradicts``
        the oldest current fact of that entity, wherever it was learnt (a new version inherits
        the old one's evidence). Then a turn of that conversation (its last step again)."""
        if not self.rows:
            return
        picked = self.rows[-1 - pick % len(self.rows)]
        conversation, entity = picked[1], "owner" if owner else picked[2]
        mine = [r for r in self.rows if r[1] == conversation]
        evidence = mine[mine.index(picked) :][:count]
        conn = self.store.conn
        old = profiles.current(conn, entity)[:1] if how != "new" else []
        sources = tuple(r[3] for r in evidence)
        if old and how == "supersedes":
            sources += self.sources[old[0].id]
        text = self.world.new_word(Origin("a profile fact", sources=sources))
        first, last = evidence[0][0], evidence[-1][0]
        run = f"profile:{conversation}@{first}-{last}"
        p = profiles.Proposal(
            entity=entity, kind="preference", text=f"likes {text}", confidence=0.5,
            evidence=tuple(r[0] for r in evidence), conversation=conversation, first_id=first,
            last_id=last, job_key=profiles.job_key(f"{run}/s-", next(self.sid)),
            supersedes=old[0].id if old and how == "supersedes" else None,
            contradicts=old[0].id if old and how == "contradicts" else None,
        )  # fmt: skip
        with self.store.transaction():
            made = profiles.apply(conn, p)
        assert isinstance(made, profiles.Fact), made
        self.sources[made.id] = sources
        again = self.replay.get(conversation)
        if again is not None:
            again()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    visibility=st.fixed_dictionaries({r: st.sampled_from(VISIBILITY) for r in ROOMS}),
    links=st.frozensets(st.sampled_from(PEOPLE)),
    steps=st.lists(step, min_size=1, max_size=30),
)
def test_no_text_reaches_a_turn_whose_audience_could_not_read_it(
    visibility: dict[str, str], links: frozenset[str], steps: list[tuple[Any, ...]]
) -> None:
    world = World(visibility=dict(visibility))
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(world, Path(tmp), links)
        try:
            for kind, *args in steps:
                if kind == "join":
                    world.members[args[0]].add(args[1])
                    world.ever[args[0]].add(args[1])
                elif kind == "leave":
                    world.members[args[0]].discard(args[1])
                elif kind == "say":
                    run.say(*args)
                elif kind == "mail":
                    run.mail(*args)
                elif kind == "cli":
                    run.cli()
                elif kind == "fact":
                    run.fact(*args)
                else:
                    run.note(*args)
        finally:
            run.store.close()
