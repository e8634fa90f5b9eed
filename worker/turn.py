"""One stream entry in, at most one reply out: the agent turn, made safe to replay.

The memory write is idempotent on the stream id, and a reply already recorded for an entry is
reused instead of calling the model again, so replaying any entry after a crash adds nothing twice.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from contract.config import Config
from contract.messages import (
    InboundMessage,
    Kind,
    Privacy,
    Reply,
    ReplyKind,
    WireError,
    decode_lenient,
    new_reply_id,
)
from memory import commands, notes
from memory.commands import CommandContext
from memory.context import HistoryLines, build_context
from memory.curated import CuratedFile, curated_path
from memory.identity import Identity, OwnerResolver
from memory.privacy import Scope, privacy_of
from memory.sql import savepoint
from memory.store import LogRow, MemoryStore
from memory.window import HistoryWindows
from worker.agent import run_turn
from worker.model import ModelPort
from worker.tools import ToolRegistry
from worker.turn_context import TurnContext

log = structlog.get_logger(__name__)

T = TypeVar("T")

HISTORY_ROWS = 400  # an upper bound on rows read for one context; the token budget decides


@dataclass
class Outcome:
    """What a handled entry produced: a reply to queue, or a reason to dead-letter it."""

    reply: Reply | None = None
    dead_reason: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


class Turns:
    """Turns stream entries into replies, writing memory on the way. Owned by the worker."""

    def __init__(
        self,
        cfg: Config,
        store: MemoryStore | None,
        model: ModelPort,
        tools: ToolRegistry | Callable[[TurnContext], ToolRegistry],
        *,
        thinking: Callable[[str], AbstractContextManager[object]] = lambda _s: nullcontext(),
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.model = model
        self.tools = tools
        self.resolver = OwnerResolver(cfg.owner.aliases)
        self.identity = Identity(self.resolver, cfg.owner.name)
        self.curated = CuratedFile(curated_path(cfg.workspace_dir))  # MEMORY.md
        self.thinking = thinking
        self.memory_failures = 0
        self._windows: HistoryWindows | None = None  # the store's recent rows per scope
        self._recall: notes.ContextRecall | None = None  # the notes lookup of each turn

    def handle(self, stream_id: str, raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Outcome:
        try:
            msg = InboundMessage.from_fields(raw)
        except WireError as exc:
            return Outcome(dead_reason=f"invalid entry: {exc}", fields=decode_lenient(raw))
        structlog.contextvars.bind_contextvars(
            channel=msg.channel, session=msg.session, stream_id=stream_id
        )
        if msg.kind is Kind.DERIVED:
            self._apply_derived(msg)
            return Outcome()
        if msg.kind is Kind.COMMAND:
            return Outcome(reply=self._command(stream_id, msg))
        if msg.extra.get("no_reply") or msg.extra.get("edit_of") or msg.extra.get("reaction"):
            self._record_only(stream_id, msg)
            return Outcome()
        return Outcome(reply=self._answer(stream_id, msg))

    def _record_only(self, stream_id: str, msg: InboundMessage) -> None:
        """Recorded in memory, not answered: a gateway said so (``extra.no_reply``: e.g. mail
        from a sender not on the allowlist), or it is an edit of an earlier message
        (``extra.edit_of``) or a reaction (``extra.reaction``), recorded as such rather than
        taken as a new request."""
        self._record_inbound(stream_id, msg)
        log.info(
            "turn.recorded_only",
            reason=msg.extra.get("no_reply")
            or ("reaction" if msg.extra.get("reaction") else f"edit of {msg.extra.get('edit_of')}"),
        )

    def _record_inbound(self, stream_id: str, msg: InboundMessage) -> tuple[LogRow | None, bool]:
        """The inbound row (its sender's entity created on first sight) in the worker's
        transaction, idempotent on the stream id; and whether the sender is the owner."""
        is_owner = self.resolver.is_owner(msg.channel, msg.sender)
        row = self._memory(
            lambda s: self.identity.append_inbound(s, msg, stream_id, is_owner=is_owner)
        )
        return row, is_owner

    def _command(self, stream_id: str, msg: InboundMessage) -> Reply:
        """An owner command from the terminal: applied to memory, answered with JSON."""
        if msg.channel != "cli" or msg.privacy is not Privacy.OWNER:
            result: dict[str, object] = {
                "ok": False,
                "error": "memory commands are accepted only from the owner's terminal",
            }
        elif self.store is None:
            result = {"ok": False, "error": "memory is unavailable (see the worker log)"}
        else:
            ctx = CommandContext(
                stream_id=stream_id, store=self.store, owner_name=self.cfg.owner.name
            )
            op, args = msg.extra.get("op"), msg.extra.get("args", {})
            applied = self._memory(lambda s: _apply_command(s, ctx, op, args))
            result = applied or {
                "ok": False,
                "error": "memory failed while applying the command; nothing was changed "
                "(see the worker log); it is safe to run it again",
            }
        kind = ReplyKind.NOTICE if result.get("ok") else ReplyKind.ERROR
        return _reply(msg, stream_id, json.dumps(result, ensure_ascii=False, default=str), kind)

    def _answer(self, stream_id: str, msg: InboundMessage) -> Reply:
        row, is_owner = self._record_inbound(stream_id, msg)
        recorded = self._memory(lambda s: s.recorded_reply(stream_id))
        if recorded is not None:
            log.info("turn.replayed", reply_id=recorded.reply_id)
            return _reply_from_row(recorded, msg)

        scope = self.scope_of(msg, row)
        messages = self._context(msg, row or _transient_row(msg, stream_id, is_owner), scope)
        ctx = TurnContext(
            stream_id=stream_id,
            msg=msg,
            scope=scope,
            store=self.store,
            cfg=self.cfg,
            role=self.cfg.conversation_role(msg.conversation, msg.session).role,
        )
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        started = time.perf_counter()
        with self.thinking(msg.session):
            result = run_turn(
                self.model, messages, tools, max_rounds=self.cfg.model.max_tool_rounds
            )
        reply = _reply(
            msg, stream_id, result.text, ReplyKind.ERROR if result.error else ReplyKind.REPLY
        )
        log.info(
            "turn.done",
            ms=round((time.perf_counter() - started) * 1000, 2),
            error=result.error,
            rounds=result.rounds,
            tool_calls=result.tool_calls,
            reply_chars=len(result.text),
        )
        assistant = self.cfg.worker.assistant_name
        self._memory(lambda s: s.append_reply(reply, sender=assistant, privacy=msg.privacy))
        return reply

    def scope_of(self, msg: InboundMessage, row: LogRow | None) -> Scope:
        """The privacy scope of the conversation this message belongs to."""
        entity = row.entity if row is not None else None
        return Scope(conversation=msg.conversation, privacy=msg.privacy, entity=entity)

    def _context(self, msg: InboundMessage, current: LogRow, scope: Scope) -> list[dict[str, str]]:
        history: Sequence[LogRow] = ()
        ready: HistoryLines | None = None
        store = self.store
        if store is not None:
            if self._windows is None or self._windows.store is not store:
                self._windows = HistoryWindows(store, limit=HISTORY_ROWS)
            try:
                history, ready = self._windows.history(scope, self.cfg.worker.assistant_name)
            except sqlite3.Error as exc:  # a failing query: no history, not a failed turn
                self._degraded(exc)
        curated, found = self._curated_and_notes(msg, scope)
        return build_context(
            system_prompt=self.cfg.worker.system_prompt,
            history=history,
            current=current,
            budget_tokens=self.cfg.worker.context_tokens,
            assistant_name=self.cfg.worker.assistant_name,
            curated=curated,
            notes=found,
            ready=ready,
        )

    def _curated_and_notes(self, msg: InboundMessage, scope: Scope) -> tuple[str, list[str]]:
        """MEMORY.md (the owner's own conversations only; never raises) and the notes relevant
        to the message that this conversation may see (none if memory fails: degraded)."""
        curated = self.curated.read().text if privacy_of(scope) is Privacy.OWNER else ""
        found: list[str] = []
        store = self.store
        if store is None:
            return curated, found
        if self._recall is None or self._recall.store is not store:
            self._recall = notes.ContextRecall(store)

        def viewer() -> notes.Viewer:
            binding = self.cfg.conversation_role(msg.conversation, msg.session)
            return notes.conversation_viewer(store, scope, binding)

        try:
            found = self._recall.lines(msg.text, viewer)
        except sqlite3.Error as exc:
            self._degraded(exc)
        return curated, found

    def _apply_derived(self, msg: InboundMessage) -> None:
        kind = msg.extra.get("type")
        if kind == "reply_status":
            reply_id = str(msg.extra.get("reply_id", ""))
            status = str(msg.extra.get("status", ""))
            self._memory(lambda s: s.mark_reply(reply_id, status, str(msg.extra.get("detail", ""))))
            log.info("reply.status", reply_id=reply_id, status=status)
        else:
            log.warning("derived.unknown", type=kind)

    def _memory(self, op: Callable[[MemoryStore], T]) -> T | None:
        """Run a memory operation; on failure log it and go on without memory (degraded)."""
        if self.store is None:
            return None
        try:
            return op(self.store)
        except sqlite3.Error as exc:
            self._degraded(exc)
            return None

    def _degraded(self, exc: sqlite3.Error) -> None:
        self.memory_failures += 1
        log.error("memory.degraded", error=str(exc), failures=self.memory_failures)


def _apply_command(
    store: MemoryStore, ctx: CommandContext, op: object, args: object
) -> dict[str, object]:
    """Apply an owner command; inside the worker's batch it gets a savepoint of its own, so a
    command that fails half-way (a SQLite error: degraded mode) leaves nothing behind."""
    if not store.conn.in_transaction:
        return commands.apply(ctx, op, args)
    with savepoint(store.conn, "owner_command"):
        return commands.apply(ctx, op, args)


def _reply(
    msg: InboundMessage,
    stream_id: str,
    text: str,
    kind: ReplyKind,
    *,
    reply_id: str | None = None,
    created: float | None = None,
) -> Reply:
    """The reply to ``msg`` (the stream entry ``stream_id``), routed back to its session."""
    return Reply(
        reply_id=reply_id or new_reply_id(),
        answers=stream_id,
        kind=kind,
        channel=msg.channel,
        session=msg.session,
        conversation=msg.conversation,
        in_reply_to=msg.event_id,
        text=text,
        created=created if created is not None else time.time(),
    )


def _reply_from_row(row: LogRow, msg: InboundMessage) -> Reply:
    """The reply recorded before a crash, queued again as it was (same id, same text)."""
    kind = ReplyKind(row.kind) if row.kind in ReplyKind._value2member_map_ else ReplyKind.REPLY
    return _reply(
        msg,
        row.stream_id,
        row.text,
        kind,
        reply_id=row.reply_id or row.event_id,
        created=row.platform_ts or row.recorded_ts,
    )


def _transient_row(msg: InboundMessage, stream_id: str, is_owner: bool) -> LogRow:
    """The current message as a row when memory could not store it (degraded mode)."""
    return LogRow(
        id=0,
        direction="in",
        stream_id=stream_id,
        kind=msg.kind.value,
        channel=msg.channel,
        session=msg.session,
        conversation=msg.conversation,
        sender=msg.sender,
        sender_name=msg.sender_name,
        entity="owner" if is_owner else None,
        is_owner=is_owner,
        privacy=msg.privacy.value,
        text=msg.text,
        event_id=msg.event_id,
        reply_id=None,
        platform_ts=msg.ts,
        recorded_ts=time.time(),
        extra="{}",
    )
