"""One stream entry in, at most one reply out: the agent turn, made safe to replay.

The memory write is idempotent on the stream id, and a reply already recorded for an entry is
reused instead of calling the model again, so replaying any entry after a crash adds nothing twice.
Everything the turn asks of memory goes through the facade (memory/facade.py), which also keeps
the degraded-mode rule: memory failing never fails the turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

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
from memory.facade import Memory, MemorySettings, MemoryUnwritable
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore
from worker.agent import run_turn
from worker.model import ModelPort
from worker.tools import ToolRegistry
from worker.turn_context import TurnContext

log = structlog.get_logger(__name__)


@dataclass
class Outcome:
    """What a handled entry produced: a reply to queue, or a reason to dead-letter it."""

    reply: Reply | None = None
    dead_reason: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    erasure: int | None = None  # an erasure was applied: its copies outside memory go next
    forget_entry: bool = False  # an import: its entry (the imported text) goes once acked
    rewrite_files: bool = False  # ... and Redis rewrites its files (it held erased text)
    only_if_missing: bool = False  # a reply queued before: queue it only if Redis lost it


def memory_settings(cfg: Config) -> MemorySettings:
    """The configuration's part that memory needs, as plain values."""
    return MemorySettings(
        owner_name=cfg.owner.name,
        owner_aliases=cfg.owner_aliases,
        workspace=cfg.workspace_dir,
        assistant_name=cfg.worker.assistant_name,
        system_prompt=cfg.worker.system_prompt,
        context_tokens=cfg.worker.context_tokens,
        roles=cfg.conversation_role,
    )


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
        opener: Callable[[], MemoryStore | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.clock = clock  # Redis's time (contract.clock): replies' ages are measured on it
        self.memory = Memory(store, memory_settings(cfg), opener=opener)
        self.model = model
        self.tools = tools
        self.thinking = thinking
        # replies the model gave that memory could not record yet, by the entry they answer
        self._unrecorded: dict[str, tuple[Reply, DrewOn]] = {}
        self._lingering: list[tuple[Reply, DrewOn]] = []  # recorded, not committed yet

    @property
    def memory_failures(self) -> int:
        """How often memory failed (degraded mode) since the worker started."""
        return self.memory.failures

    def handle(
        self,
        stream_id: str,
        raw: Mapping[bytes, bytes] | Mapping[str, str],
        *,
        channel: str | None = None,
    ) -> Outcome:
        """One entry; ``channel`` is the channel of the stream it came on (None: the stream
        without a channel, whose entries are taken as they say: worker/streams.py).

        Its writes join memory's open transaction (group commit): durable once :meth:`settle`
        (or the next model call) committed them. :class:`MemoryUnwritable` when memory refused:
        every entry since the last commit is to be handled again."""
        try:
            return self._handle(stream_id, raw, channel)
        except MemoryUnwritable:
            self._lost()
            raise

    def settle(self) -> None:
        """Commit what the turns since the last commit wrote (before a model call, and before
        the worker acks anything)."""
        try:
            self.memory.settle()
        except MemoryUnwritable:
            self._lost()
            raise
        self._lingering.clear()

    def _lost(self) -> None:
        """A commit failed: the replies it held are kept, to be recorded when their entries are
        handled again (the model is not asked twice)."""
        for reply, drew in self._lingering:
            self._unrecorded[reply.answers] = (reply, drew)
        self._lingering.clear()

    def _handle(
        self,
        stream_id: str,
        raw: Mapping[bytes, bytes] | Mapping[str, str],
        channel: str | None,
    ) -> Outcome:
        try:
            msg = InboundMessage.from_fields(raw)
        except WireError as exc:
            return Outcome(dead_reason=f"invalid entry: {exc}", fields=decode_lenient(raw))
        refused = self._refused(msg, channel)
        if refused:
            log.warning("entry.refused", stream_id=stream_id, reason=refused)
            return Outcome(dead_reason=refused, fields=decode_lenient(raw))
        structlog.contextvars.bind_contextvars(
            channel=msg.channel, session=msg.session, stream_id=stream_id
        )
        if msg.kind is Kind.DERIVED:
            foreign = self._foreign_reply(msg, channel)
            if foreign:
                log.warning("entry.refused", stream_id=stream_id, reason=foreign)
                return Outcome(dead_reason=foreign, fields=decode_lenient(raw))
            with self.memory.write():
                self._apply_derived(msg)
            return Outcome()
        if msg.kind is Kind.COMMAND:
            if not self.memory.available():  # answered: memory is unavailable
                return self._command(stream_id, msg)
            with self.memory.write():
                return self._command(stream_id, msg)
        return self._message(stream_id, msg)

    def _message(self, stream_id: str, msg: InboundMessage) -> Outcome:
        """A message: recorded (once per platform event), then answered unless it asks not to
        be. The inbound row joins memory's open transaction, committed before the model call."""
        memory = self.memory
        with memory.write():
            first = memory.first_of_event(msg, stream_id)
            if first == stream_id:
                row, is_owner = memory.record_inbound(msg, stream_id)
        if first != stream_id:
            return self._published_again(stream_id, first, msg)
        if msg.extra.get("no_reply") or msg.extra.get("edit_of") or msg.extra.get("reaction"):
            self._recorded_only(msg)
            return Outcome()
        recorded = memory.recorded_reply(stream_id)
        if recorded is not None:  # a replay: the reply recorded before, not a second model call
            log.info("turn.replayed", reply_id=recorded.reply_id)
            # queued unless Redis holds it already (the reconciliation after a Redis data loss
            # may have queued it before this entry, which the loss made unread, came again)
            return Outcome(reply=_reply_from_row(recorded, msg), only_if_missing=True)
        return Outcome(reply=self._answer(stream_id, msg, row, is_owner))

    def _published_again(self, stream_id: str, first: str, msg: InboundMessage) -> Outcome:
        """The platform event of this entry was recorded before under the entry ``first`` (a
        gateway's cursor rolled back with Redis's data): nothing is recorded twice and the model
        is not asked again. Its reply, when memory does not know it reached its platform, is
        queued again (the consumer first looks whether Redis still holds it)."""
        recorded = self.memory.recorded_reply(first)
        if recorded is None:  # the first entry was recorded but not answered: answer it now
            log.info("turn.published_again", stream_id=stream_id, first=first, reply=False)
            with self.memory.write():
                row, is_owner = self.memory.record_inbound(msg, first)  # the row it has
            return Outcome(reply=self._answer(first, msg, row, is_owner))
        status = self.memory.final_status(recorded.reply_id or recorded.event_id)
        log.info("turn.published_again", stream_id=stream_id, first=first, status=status)
        if status is not None:
            return Outcome()
        return Outcome(reply=_reply_from_row(recorded, msg), only_if_missing=True)

    def _refused(self, msg: InboundMessage, channel: str | None) -> str:
        """Why an entry cannot be what it says (a gateway speaks only for its own channel, and
        only the owner's own are the owner's), or "" when it can."""
        if channel is not None:
            for what, value in (("channel", msg.channel), ("session", msg.session),
                                ("conversation", msg.conversation)):  # fmt: skip
                if value != channel and not value.startswith(f"{channel}:"):
                    return f"an entry on the {channel} stream names {what} {value!r}"
        owner_claimed = msg.privacy is Privacy.OWNER and msg.kind is not Kind.DERIVED
        if owner_claimed and not self.memory.is_owner(msg):
            return f"privacy owner claimed for {msg.sender!r}, who is not the owner"
        return ""

    def _foreign_reply(self, msg: InboundMessage, channel: str | None) -> str:
        """A gateway reports on its own channel's replies only: the report names the entry the
        reply answers (``answers``), and that entry's reply must be this one, of this channel.
        A reply memory does not know (degraded, or not recorded) is taken as reported."""
        if channel is None or msg.extra.get("type") != "reply_status":
            return ""
        reply_id = str(msg.extra.get("reply_id", ""))
        answers = str(msg.extra.get("answers", ""))
        known = self.memory.reply_of(answers) if answers else None
        if known == (reply_id, channel) or (answers.startswith(f"{channel}/") and known is None):
            return ""
        return f"an entry on the {channel} stream reports on reply {reply_id!r}, not its own"

    def _recorded_only(self, msg: InboundMessage) -> None:
        """Recorded in memory, not answered: a gateway said so (``extra.no_reply``: e.g. mail
        from a sender not on the allowlist), or it is an edit of an earlier message
        (``extra.edit_of``) or a reaction (``extra.reaction``), recorded as such rather than
        taken as a new request."""
        log.info(
            "turn.recorded_only",
            reason=msg.extra.get("no_reply")
            or ("reaction" if msg.extra.get("reaction") else f"edit of {msg.extra.get('edit_of')}"),
        )

    def _command(self, stream_id: str, msg: InboundMessage) -> Outcome:
        """An owner command from the terminal: applied to memory, answered with JSON. An
        erasure's outcome names it: the worker then erases the copies outside memory."""
        if msg.channel != "cli" or msg.privacy is not Privacy.OWNER:
            result: dict[str, object] = {
                "ok": False,
                "error": "memory commands are accepted only from the owner's terminal",
            }
        elif self.memory.store is None:
            result = {"ok": False, "error": "memory is unavailable (see the worker log)"}
        else:
            op, args = msg.extra.get("op"), msg.extra.get("args", {})
            result = self.memory.apply_command(stream_id, op, args) or {
                "ok": False,
                "error": "memory failed while applying the command; nothing was changed "
                "(see the worker log); it is safe to run it again",
            }
        kind = ReplyKind.NOTICE if result.get("ok") else ReplyKind.ERROR
        text = json.dumps(result, ensure_ascii=False, default=str)
        reply = _reply(msg, stream_id, text, kind, created=self.clock())
        erasure = result.get("erasure")
        if result.get("ok") and msg.extra.get("op") == "memory.erase" and isinstance(erasure, int):
            return Outcome(reply=reply, erasure=erasure)
        if msg.extra.get("op") == "memory.import":
            erased = bool(result.get("erased"))
            return Outcome(reply=reply, forget_entry=True, rewrite_files=erased)
        return Outcome(reply=reply)

    def _answer(
        self, stream_id: str, msg: InboundMessage, row: LogRow | None, is_owner: bool
    ) -> Reply:
        """Ask the model about the recorded message ``row`` (memory committed first: no write
        transaction is held across the model call), then record the reply in memory's open
        transaction. A reply that memory could not record is kept here and recorded when the
        entry is tried again, so the model is not asked twice for it."""
        memory = self.memory
        held = self._unrecorded.pop(stream_id, None)
        if held is not None:
            self._record(held[0], msg, held[1])
            return held[0]

        scope = memory.scope_of(msg, row)
        drew = DrewOn()
        current = row or _transient_row(msg, stream_id, is_owner)
        messages = memory.context(msg, current, scope, drew)
        ctx = TurnContext(
            stream_id=stream_id,
            msg=msg,
            scope=scope,
            memory=memory,
            role=memory.role_of(msg).role,
            drew=drew,
        )
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        self.settle()  # no write transaction is held across the model call
        started = time.perf_counter()
        with self.thinking(msg.session):
            result = run_turn(
                self.model, messages, tools, max_rounds=self.cfg.model.max_tool_rounds
            )
        kind = ReplyKind.ERROR if result.error else ReplyKind.REPLY
        reply = _reply(msg, stream_id, result.text, kind, created=self.clock())
        log.info(
            "turn.done",
            ms=round((time.perf_counter() - started) * 1000, 2),
            error=result.error,
            rounds=result.rounds,
            tool_calls=result.tool_calls,
            reply_chars=len(result.text),
        )
        self._record(reply, msg, drew)
        return reply

    def _record(self, reply: Reply, msg: InboundMessage, drew: DrewOn) -> None:
        try:
            with self.memory.write():
                self.memory.record_reply(reply, msg.privacy, drew)
        except MemoryUnwritable:
            self._unrecorded[reply.answers] = (reply, drew)
            raise
        self._lingering.append((reply, drew))

    def _apply_derived(self, msg: InboundMessage) -> None:
        kind = msg.extra.get("type")
        if kind == "reply_status":
            reply_id = str(msg.extra.get("reply_id", ""))
            status = str(msg.extra.get("status", ""))
            self.memory.mark_reply(reply_id, status, str(msg.extra.get("detail", "")))
            log.info("reply.status", reply_id=reply_id, status=status)
        else:
            log.warning("derived.unknown", type=kind)


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
