"""A small memory with people, conversations and profile facts, for the tests of layer 2's reading
side (the context section, the ``profile`` tool): Bob's and Carol's direct conversations, a group
room, the owner's terminal; facts applied through memory/profiles.py as the writer applies them."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.config import Config
from contract.messages import InboundMessage, Privacy, Reply
from memory import profiles
from memory.facade import Memory
from memory.privacy import Scope
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore
from worker.memory_tools import memory_tools
from worker.tools import ToolRegistry
from worker.turn import memory_settings
from worker.turn_context import TurnContext

T0 = 1_795_000_000.0
BOB_DM = "matrix:dm-bob"
CAROL_DM = "matrix:dm-carol"
TEAM = "matrix:team"
HOME = "cli:home"
BOB = "@bob:m.org"
CAROL = "@carol:m.org"
_n = itertools.count(1)


class World:
    def __init__(self, home: Path, **settings: Any) -> None:
        self.cfg = Config(home=home, owner={"name": "Ada"})
        self.store = MemoryStore(self.cfg.memory_path)
        self.memory = Memory(self.store, replace(memory_settings(self.cfg), **settings))
        self.keys = itertools.count(1)

    @property
    def conn(self) -> Any:
        return self.store.conn

    def msg(
        self, text: str, conversation: str, privacy: Privacy, sender: str, name: str = ""
    ) -> InboundMessage:
        n = next(_n)
        return InboundMessage(
            channel=conversation.split(":", 1)[0], session=conversation,
            conversation=conversation, sender=sender, sender_name=name, privacy=privacy,
            text=text, ts=T0 + n, event_id=f"e{n}",
        )  # fmt: skip

    def say(
        self, text: str, conversation: str = BOB_DM, privacy: Privacy = Privacy.DIRECT,
        sender: str = BOB, name: str = "",
    ) -> LogRow:  # fmt: skip
        msg = self.msg(text, conversation, privacy, sender, name)
        with self.memory.write():
            row, _ = self.memory.record_inbound(msg, f"{msg.channel}/{msg.event_id}")
        self.memory.settle()
        assert row is not None
        return row

    def reply(self, row: LogRow, text: str) -> LogRow:
        with self.store.transaction():
            return self.store.append_reply(
                Reply(
                    reply_id=f"r{row.id}", answers=row.stream_id, channel=row.channel,
                    session=row.session, conversation=row.conversation, text=text,
                    created=row.ts + 1,
                ),
                sender="relaybot",
                privacy=Privacy(row.privacy),
            )  # fmt: skip

    def fact(
        self, entity: str | None, evidence: list[LogRow], text: str, *, kind: str = "preference",
        confidence: float = 0.8, supersedes: int | None = None, contradicts: int | None = None,
    ) -> profiles.Fact:  # fmt: skip
        """A fact resting on ``evidence`` (its range: from the first to the last of them)."""
        assert entity is not None
        conv = evidence[0].conversation
        first, last = min(r.id for r in evidence), max(r.id for r in evidence)
        run_key = f"profile:{conv}@{first}-{last}/s-"
        p = profiles.Proposal(
            entity=entity, kind=kind, text=text, confidence=confidence,
            evidence=tuple(r.id for r in evidence), conversation=conv, first_id=first,
            last_id=last, job_key=profiles.job_key(run_key, next(self.keys)),
            supersedes=supersedes, contradicts=contradicts,
        )  # fmt: skip
        with self.store.transaction():
            made = profiles.apply(self.conn, p)
        assert isinstance(made, profiles.Fact), made
        return made

    def scope(self, conversation: str, privacy: Privacy, entity: str | None = None) -> Scope:
        return Scope(conversation=conversation, privacy=privacy, entity=entity)

    def context(
        self, text: str, conversation: str = BOB_DM, privacy: Privacy = Privacy.DIRECT,
        sender: str = BOB, drew: DrewOn | None = None,
    ) -> str:  # fmt: skip
        """The system message of a turn answering ``text`` (recorded first)."""
        row = self.say(text, conversation, privacy, sender)
        msg = self.msg(text, conversation, privacy, sender)
        scope = self.memory.scope_of(msg, row)
        return self.memory.context(msg, row, scope, drew)[0]["content"]

    def tool(self, scope: Scope, drew: DrewOn | None = None, **args: object) -> str:
        """The ``profile`` tool's answer in a turn of ``scope``."""
        msg = self.msg("x", scope.conversation, scope.privacy, "someone")
        ctx = TurnContext(
            stream_id="9-0", msg=msg, scope=scope, memory=self.memory, drew=drew or DrewOn()
        )
        return ToolRegistry(memory_tools(ctx)).call("profile", dict(args))
