"""One stream entry in, at most one reply out: the agent turn, made safe to replay.

The memory write is idempotent on the stream id, and a reply already recorded for an entry is
reused instead of calling the model again, so replaying any entry after a crash adds nothing twice.
Everything the turn asks of memory goes through the facade (memory/facade.py), which also keeps
the degraded-mode rule: memory failing never fails the turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

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
from memory import summaries
from memory.facade import Memory, MemorySettings, MemoryUnwritable
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.store import MemoryStore
from worker import redactions, withheld
from worker.agent import TurnResult, run_turn
from worker.claims import audience_refusal
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
    forget_entry: bool = False  # an import or a summary: its entry (their text) goes once acked
    rewrite_files: bool = False  # ... and Redis rewrites its files (it held erased text)
    only_if_missing: bool = False  # a reply queued before: queue it only if Redis lost it
    again: InboundMessage | None = None  # a withheld reply's question, to answer again now


@dataclass(eq=False)
class Job:
    """A turn whose model call is to run (off the writer: worker/pool.py). It answers the
    messages recorded under ``keys`` (stream ids, in order); its reply is keyed by the last one
    and covers the others (a collected turn). ``messages`` is the model's input, built from
    memory as it was when the turn started."""

    keys: list[str]
    msg: InboundMessage  # the last message: the reply is routed by it
    messages: list[dict[str, str]]
    tools: ToolRegistry
    drew: DrewOn
    specs: list[dict[str, Any]]  # the tools' specs, taken on the writer
    erasures: int  # memory's erasure mark when it started


# what a gateway may put on its stream as a derived entry: its replies' final status (a summary
# on a channel's stream is refused with its own reason, in parse)
REPORTS = frozenset({"reply_status", "summary"})

# the error reply to a message set aside (Turns.set_aside): whoever wrote may be anyone
SET_ASIDE = (
    "Sorry — I could not answer this message: handling it failed several times, so it was set "
    "aside. Please send it again if it still matters."
)


@dataclass
class Held:
    """A reply the model gave that memory has not durably recorded yet, and what it answers."""

    reply: Reply
    drew: DrewOn
    keys: list[str]
    erasures: int  # memory's erasure mark when its turn started (an erasure since: dropped)


def memory_settings(cfg: Config) -> MemorySettings:
    """The configuration's part that memory needs, as plain values."""
    return MemorySettings(
        owner_name=cfg.owner.name,
        owner_aliases=cfg.owner_aliases,
        workspace=cfg.workspace_dir,
        assistant_name=cfg.worker.assistant_name,
        system_prompt=cfg.system_prompt,  # with the owner's name
        context_tokens=cfg.worker.context_tokens,
        roles=cfg.conversation_role,
        trusted_channels=(
            None if cfg.owner.trusted_channels is None else frozenset(cfg.owner.trusted_channels)
        ),
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
        # owner commands the worker itself applies (not memory): op -> handler(args) -> result
        self.worker_commands: dict[str, Callable[[dict[str, Any]], dict[str, object]]] = {}
        # replies the model gave that memory could not record yet, by each entry they answer
        self._unrecorded: dict[str, Held] = {}
        self._lingering: list[Held] = []  # recorded, not committed yet

    def reconfigure(self, cfg: Config) -> None:
        """Run with a reloaded configuration from now on (worker/consumer.py calls it on the
        writer between rounds, never inside a turn's begin/finish; turns whose model call runs
        keep the input they were given)."""
        self.cfg = cfg
        self.memory.reconfigure(memory_settings(cfg))

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
        """One entry, start to end on this thread (the worker runs the model call of a message
        on a pool thread instead: :meth:`parse`, :meth:`apply`, :meth:`begin`, :meth:`run`,
        :meth:`finish`); ``channel`` is the channel of the stream it came on (None: the stream
        without a channel, whose entries are taken as they say: worker/streams.py).

        Its writes join memory's open transaction (group commit): durable once :meth:`settle`
        (or the next model call) committed them. :class:`MemoryUnwritable` when memory refused:
        every entry since the last commit is to be handled again."""
        parsed = self.parse(stream_id, raw, channel)
        if isinstance(parsed, Outcome):
            return parsed
        if parsed.kind is not Kind.MESSAGE or redactions.is_redaction(parsed):
            applied = self.apply(stream_id, parsed)
            if applied.again is None:
                return applied
            parsed = applied.again  # a withheld reply: its question, answered again now
        outcomes, job = self.begin([(stream_id, parsed)])
        if job is None:
            return outcomes[0] or Outcome()
        self.settle()  # no write transaction is held across the model call
        with self.thinking(parsed.session):
            result = self.run(job)
        return self.finish(job, result)

    def parse(
        self, stream_id: str, raw: Mapping[bytes, bytes] | Mapping[str, str], channel: str | None
    ) -> InboundMessage | Outcome:
        """The entry's message, or the outcome that dead-letters it (invalid, or not what its
        stream may say)."""
        try:
            msg = InboundMessage.from_fields(raw)
        except WireError as exc:
            return Outcome(dead_reason=f"invalid entry: {exc}", fields=decode_lenient(raw))
        refused = self._refused(msg, channel)
        if refused:
            log.warning("entry.refused", stream_id=stream_id, reason=refused)
            return Outcome(dead_reason=refused, fields=decode_lenient(raw))
        if (
            msg.kind is Kind.MESSAGE
            and msg.privacy is Privacy.OWNER
            and not self.cfg.owner.trusts(msg.channel)
        ):
            # [owner] trusted_channels: the owner's words from a channel whose gateway is not
            # trusted with everything are a group's: they see their own conversation only
            log.info("entry.owner_confined", stream_id=stream_id, channel=msg.channel)
            msg = msg.model_copy(update={"privacy": Privacy.GROUP})
        if msg.kind is Kind.DERIVED and msg.extra.get("type") == "summary" and channel:
            reason = "a summary comes only from the jobs (the stream without a channel)"
            log.warning("entry.refused", stream_id=stream_id, reason=reason)
            return Outcome(dead_reason=reason, fields=decode_lenient(raw))
        if msg.kind is Kind.DERIVED:
            foreign = self._foreign_reply(msg, channel)
            if foreign:
                log.warning("entry.refused", stream_id=stream_id, reason=foreign)
                return Outcome(dead_reason=foreign, fields=decode_lenient(raw))
        return msg

    def apply(self, stream_id: str, msg: InboundMessage) -> Outcome:
        """A derived entry, an owner command or a redaction (worker/redactions.py): applied to
        memory at once, no model call."""
        structlog.contextvars.bind_contextvars(
            channel=msg.channel, session=msg.session, stream_id=stream_id
        )
        try:
            if redactions.is_redaction(msg):  # a platform's redaction: an erasure, no reply
                with self.memory.write():
                    done = redactions.apply(self.memory, stream_id, msg)
                return Outcome(erasure=done.erasure, dead_reason=done.dead_reason,
                               fields=msg.to_fields() if done.dead_reason else {})  # fmt: skip
            if msg.kind is Kind.DERIVED and msg.extra.get("type") == "summary":
                with self.memory.write():
                    refused = self._apply_summary(msg)
                # the entry holds the summary's text: once applied (or refused) it goes, so no
                # copy outlives an erasure of what it summarises; one that came after an
                # erasure (a job that read the text before) has Redis rewrite its files
                return Outcome(forget_entry=True, rewrite_files="erased" in refused)
            if msg.kind is Kind.DERIVED:
                with self.memory.write():
                    self._apply_derived(msg)
                    if _withheld_report(msg):
                        return self._withheld(stream_id, msg)
                return Outcome()
            if not self.memory.available():  # answered: memory is unavailable
                return self._command(stream_id, msg)
            with self.memory.write():
                return self._command(stream_id, msg)
        except MemoryUnwritable:
            self._lost()
            raise
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def begin(
        self, group: Sequence[tuple[str, InboundMessage]]
    ) -> tuple[list[Outcome | None], Job | None]:
        """Record the messages of a group (one session, in order) and start their turn.

        Per message: its outcome when it is done now (recorded only, a replay whose reply was
        recorded before, published again), or None when the returned job's reply answers it.
        The job's model input is built now, from memory as it is when the turn starts (the
        group's messages included, in order, the last one as the current message)."""
        try:
            return self._begin(group)
        except MemoryUnwritable:
            self._lost()
            raise
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def run(self, job: Job, tools: ToolRegistry | None = None) -> TurnResult:
        """The model call and its tool rounds (``tools``: the job's, as a pool thread sees
        them): no memory write, safe off the writer."""
        structlog.contextvars.bind_contextvars(
            channel=job.msg.channel, session=job.msg.session, stream_id=job.keys[-1]
        )
        try:
            return run_turn(
                self.model,
                job.messages,
                tools if tools is not None else job.tools,
                max_rounds=self.cfg.model.max_tool_rounds,
            )
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def failed(self, job: Job, exc: BaseException) -> TurnResult:
        """The result of a turn whose run raised (a bug): an error reply."""
        return TurnResult(
            text=f"Sorry — something went wrong while answering ({type(exc).__name__}).",
            error=True,
            rounds=0,
            tool_calls=0,
        )

    def finish(self, job: Job, result: TurnResult, *, ms: float | None = None) -> Outcome:
        """Record the reply of a finished turn (in memory's open transaction) and return its
        outcome: the reply, to be queued when the transaction is committed."""
        msg = job.msg
        kind = ReplyKind.ERROR if result.error else ReplyKind.REPLY
        reply = _reply(msg, job.keys[-1], result.text, kind, created=self.clock())
        log.info(
            "turn.done", channel=msg.channel, session=msg.session, stream_id=job.keys[-1],
            answers=len(job.keys), ms=ms, error=result.error, rounds=result.rounds,
            tool_calls=result.tool_calls, reply_chars=len(result.text),
        )  # fmt: skip
        try:
            reply = self._record(Held(reply, job.drew, list(job.keys), job.erasures), msg)
        except MemoryUnwritable:
            self._lost()
            raise
        return Outcome(reply=reply)

    def hold(self, job: Job, result: TurnResult) -> None:
        """Keep a finished turn's reply for when its entries come again (they were given back
        unrecorded: Redis went away meanwhile), so the model is not asked twice."""
        kind = ReplyKind.ERROR if result.error else ReplyKind.REPLY
        reply = _reply(job.msg, job.keys[-1], result.text, kind, created=self.clock())
        held = Held(reply, job.drew, list(job.keys), job.erasures)
        for key in job.keys:
            self._unrecorded[key] = held

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
        for held in self._lingering:
            for key in held.keys:
                self._unrecorded[key] = held
        self._lingering.clear()

    def _begin(
        self, group: Sequence[tuple[str, InboundMessage]]
    ) -> tuple[list[Outcome | None], Job | None]:
        memory = self.memory
        outcomes: list[Outcome | None] = []
        asks: list[tuple[str, InboundMessage, LogRow | None, bool]] = []
        for stream_id, msg in group:
            structlog.contextvars.bind_contextvars(
                channel=msg.channel, session=msg.session, stream_id=stream_id
            )
            again = withheld.again_of(msg)
            if again is not None:  # a withheld reply's question, answered again: not recorded
                done, ask = self._answer_again(stream_id, msg, again["question"])
                outcomes.append(done)
                if ask is not None:
                    asks.append(ask)
                continue
            fresh = False
            with memory.write():
                first = memory.first_of_event(msg, stream_id)
                if first == stream_id:
                    row, is_owner = memory.record_inbound(msg, stream_id)
                    fresh = memory.first_sight(row)
            if first != stream_id:
                done, ask = self._published_again(stream_id, first, msg)
            elif msg.record_only:
                self._recorded_only(msg)
                done, ask = Outcome(), None
            elif not fresh and (recorded := memory.recorded_reply(stream_id)) is not None:
                # a replay: the reply recorded before, not a second model call; queued unless
                # Redis holds it already (the reconciliation after a Redis data loss may have
                # queued it before this entry, which the loss made unread, came again) or an
                # erasure blanked it (nothing of it is shown again)
                log.info("turn.replayed", reply_id=recorded.reply_id, erased=recorded.erased)
                done, ask = Outcome(), None
                if not recorded.erased:
                    reply = self._reply_again(recorded, msg, stream_id)
                    done = Outcome(reply=reply, only_if_missing=True)
            else:
                done, ask = None, (stream_id, msg, row, is_owner)
            outcomes.append(done)
            if ask is not None:
                asks.append(ask)
        if not asks:
            return outcomes, None
        asks = self._record_held(asks, outcomes)
        if not asks:
            return outcomes, None
        return outcomes, self._job(asks)

    def _record_held(
        self,
        asks: list[tuple[str, InboundMessage, LogRow | None, bool]],
        outcomes: list[Outcome | None],
    ) -> list[tuple[str, InboundMessage, LogRow | None, bool]]:
        """Replies the model gave before memory refused them are recorded now (the model is not
        asked twice); the messages they answer are done. What is left to ask the model."""
        left = []
        slots = [i for i, o in enumerate(outcomes) if o is None]
        taken: dict[str, Held] = {}  # recorded now: the group's other messages it answers
        for slot, ask in zip(slots, asks, strict=True):
            held = taken.get(ask[0]) or self._held_for(ask[0])
            if held is None:
                left.append(ask)
                continue
            if not any(key in taken for key in held.keys):
                for key in held.keys:
                    self._unrecorded.pop(key, None)
                    taken[key] = held
                held.reply = self._record(held, ask[1])
            mine = ask[0] == held.reply.answers
            outcomes[slot] = Outcome(reply=held.reply) if mine else Outcome()
        return left

    def _held_for(self, key: str) -> Held | None:
        """The reply kept for this entry, unless an erasure was applied since its turn started
        (it may repeat what was erased: the model is asked again, from what memory holds now)."""
        held = self._unrecorded.get(key)
        if held is not None and held.erasures != self.memory.erasure_mark():
            log.info("turn.held_reply_dropped", reply_id=held.reply.reply_id,
                     reason="an erasure was applied since its turn started")  # fmt: skip
            for other in held.keys:
                self._unrecorded.pop(other, None)
            return None
        return held

    def _job(self, asks: list[tuple[str, InboundMessage, LogRow | None, bool]]) -> Job:
        """The turn answering ``asks`` (recorded, in order): its model input, from memory now."""
        memory = self.memory
        key, msg, row, is_owner = asks[-1]
        scope = memory.scope_of(msg, row)
        drew = DrewOn()
        current = row or _transient_row(msg, key, is_owner)
        if row is not None and withheld.again_of(msg) is not None:
            # a re-answer is keyed by the report, not by its question: what it drew on names
            # the question, so an erasure of the question takes the re-answer too
            drew.add_rows([row.id])
        messages = memory.context(msg, current, scope, drew)
        ctx = TurnContext(
            stream_id=key,
            msg=msg,
            scope=scope,
            memory=memory,
            role=memory.role_of(msg).role,
            drew=drew,
        )
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        keys = [a[0] for a in asks]
        specs, erasures = tools.specs(), memory.erasure_mark()
        return Job(keys, msg, messages, tools, drew, specs, erasures)

    def _withheld(self, stream_id: str, msg: InboundMessage) -> Outcome:
        """A gateway withheld a reply (it would have reached people it was not written for):
        its question is answered again for the audience now, or the owner is told privately why
        not (worker/withheld.py). A replay queues what was recorded for the report before."""
        recorded = self.memory.recorded_reply(stream_id)
        if recorded is not None:
            if recorded.erased:
                return Outcome()
            return Outcome(reply=_queued_again(recorded), only_if_missing=True)
        follow = withheld.follow_up(msg, stream_id, self.memory, self.clock())
        if follow.again is not None:
            return Outcome(again=follow.again)
        if follow.notice is None or follow.notice_for is None:
            return Outcome()
        held = Held(follow.notice, DrewOn(), [stream_id], self.memory.erasure_mark())
        return Outcome(reply=self._record(held, follow.notice_for))

    def _answer_again(
        self, stream_id: str, msg: InboundMessage, question: str
    ) -> tuple[Outcome | None, tuple[str, InboundMessage, LogRow | None, bool] | None]:
        """A re-answer's turn (worker/withheld.py): the question's row is the current message,
        the reply answers the report entry ``stream_id``. A replay finds that reply recorded."""
        recorded = self.memory.recorded_reply(stream_id)
        if recorded is not None:
            done = (
                Outcome()
                if recorded.erased
                else Outcome(reply=_queued_again(recorded), only_if_missing=True)
            )
            return done, None
        row = self.memory.inbound_row(question)
        if row is None or row.erased:
            log.info("turn.not_answered_again", question=question, reason="erased or unknown")
            return Outcome(), None
        return None, (stream_id, msg, row, False)

    def _published_again(
        self, stream_id: str, first: str, msg: InboundMessage
    ) -> tuple[Outcome | None, tuple[str, InboundMessage, LogRow | None, bool] | None]:
        """The platform event of this entry was recorded before under the entry ``first`` (a
        gateway's cursor rolled back with Redis's data): nothing is recorded twice and the model
        is not asked again. Its reply, when memory does not know it reached its platform, is
        queued again (the consumer first looks whether Redis still holds it). Recorded but not
        answered: answered now, as ``first``."""
        recorded = self.memory.recorded_reply(first)
        if recorded is None and msg.record_only:  # never to be answered: recorded, done
            log.info("turn.published_again", stream_id=stream_id, first=first, reply=False)
            return Outcome(), None
        if recorded is None:
            log.info("turn.published_again", stream_id=stream_id, first=first, reply=False)
            with self.memory.write():
                row, is_owner = self.memory.record_inbound(msg, first)  # the row it has
            return None, (first, msg, row, is_owner)
        status = self.memory.final_status(recorded.reply_id or recorded.event_id)
        log.info("turn.published_again", stream_id=stream_id, first=first, status=status,
                 erased=recorded.erased)  # fmt: skip
        if status is not None or recorded.erased:  # delivered, or blanked: nothing to show
            return Outcome(), None
        return Outcome(reply=self._reply_again(recorded, msg, first), only_if_missing=True), None

    def set_aside(self, stream_id: str, msg: InboundMessage, reason: str) -> Outcome:
        """An entry dead-lettered for being delivered too often (workers kept dying while it
        was in hand: it may kill them, or it was only what was in flight when something else
        did): recorded, and its sender told with an error reply instead of silence. The model
        is not asked (that may be what kills the worker). A reply recorded for it before is
        queued again instead; a record-only message is recorded, unanswered; a command or a
        derived entry gets nothing."""
        structlog.contextvars.bind_contextvars(
            channel=msg.channel, session=msg.session, stream_id=stream_id
        )
        try:
            if msg.kind is not Kind.MESSAGE or redactions.is_redaction(msg):
                return Outcome()
            with self.memory.write():
                first = self.memory.first_of_event(msg, stream_id)
                if first != stream_id:  # published again: the first entry's answer stands
                    return Outcome()
                self.memory.record_inbound(msg, stream_id)
                if msg.record_only:  # recorded, never answered (an edit, a reaction, ...)
                    return Outcome()
                recorded = self.memory.recorded_reply(stream_id)
                if recorded is not None:
                    if recorded.erased:
                        return Outcome()
                    again = self._reply_again(recorded, msg, stream_id)
                    return Outcome(reply=again, only_if_missing=True)
            log.warning("turn.set_aside", reason=reason)
            reply = _reply(msg, stream_id, SET_ASIDE, ReplyKind.ERROR, created=self.clock())
            held = Held(reply, DrewOn(), [stream_id], self.memory.erasure_mark())
            return Outcome(reply=self._record(held, msg))
        except MemoryUnwritable:
            self._lost()
            raise
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def _reply_again(self, row: LogRow, msg: InboundMessage, stream_id: str) -> Reply:
        """The reply recorded for the entry ``stream_id`` (``msg``), queued again as it was: a
        collected reply is keyed by a later entry than this one, and replies to that entry's
        event, not to this one's."""
        event: str | None = None
        if row.stream_id != stream_id:  # memory failing: this entry's event, as before
            event = self.memory.use(lambda s: _event_of(s, row.stream_id))
        return _reply_from_row(row, msg, in_reply_to=event or msg.event_id)

    def _refused(self, msg: InboundMessage, channel: str | None) -> str:
        """Why an entry cannot be what it says (a gateway speaks only for its own channel, and
        only the owner's own are the owner's), or "" when it can."""
        if channel is not None:
            for what, value in (("channel", msg.channel), ("session", msg.session),
                                ("conversation", msg.conversation)):  # fmt: skip
                if value != channel and not value.startswith(f"{channel}:"):
                    return f"an entry on the {channel} stream names {what} {value!r}"
        if channel is not None and channel != "cli" and msg.kind is Kind.COMMAND:
            return f"an owner command on the {channel} stream: commands come from the terminal"
        kind = msg.extra.get("type")
        if channel is not None and msg.kind is Kind.DERIVED and kind not in REPORTS:
            return (
                f"a derived entry of type {kind!r} on the {channel} stream: a gateway only "
                "reports on its replies"
            )
        owner_claimed = msg.privacy is Privacy.OWNER and msg.kind is not Kind.DERIVED
        if owner_claimed and not self.memory.is_owner(msg):
            return f"privacy owner claimed for {msg.sender!r}, who is not the owner"
        return audience_refusal(msg, self.memory.owners().is_owner)

    def _foreign_reply(self, msg: InboundMessage, channel: str | None) -> str:
        """A gateway reports on its own channel's replies only: the report names the entry the
        reply answers (``answers``), and that entry's reply must be this one, of this channel.
        A reply memory does not know is refused (a report naming an entry nobody answered could
        mark another channel's reply); only while memory is down is it taken as reported."""
        if channel is None or msg.extra.get("type") != "reply_status":
            return ""
        reply_id = str(msg.extra.get("reply_id", ""))
        answers = str(msg.extra.get("answers", ""))
        known = self.memory.reply_of(answers) if answers else None
        if known == (reply_id, channel):
            return ""
        if known is None and answers.startswith(f"{channel}/") and not self.memory.available():
            return ""  # memory is down: taken as reported (nothing can be marked anyway)
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
        elif not self.cfg.owner.trusts("cli"):
            result = {
                "ok": False,
                "error": "memory commands are refused: [owner] trusted_channels does not "
                "trust the terminal (cli)",
            }
        elif self.memory.store is None:
            result = {"ok": False, "error": "memory is unavailable (see the worker log)"}
        elif isinstance(op := msg.extra.get("op"), str) and op in self.worker_commands:
            args = msg.extra.get("args", {})
            result = self.worker_commands[op](args if isinstance(args, dict) else {})
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

    def _record(self, held: Held, msg: InboundMessage) -> Reply:
        """Record a reply and the entries it answers; kept (:class:`Held`) if memory refuses, so
        the model is not asked again when the entries come again. The reply to queue: memory's,
        should it hold one for this entry already (the user gets the answer memory keeps)."""
        try:
            with self.memory.write():
                row = self.memory.record_reply(held.reply, msg.privacy, held.drew, held.keys[:-1])
        except MemoryUnwritable:
            for key in held.keys:
                self._unrecorded[key] = held
            raise
        self._lingering.append(held)
        if row.reply_id and row.reply_id != held.reply.reply_id:
            log.warning("turn.reply_recorded_before", reply_id=row.reply_id,
                        dropped=held.reply.reply_id)  # fmt: skip
            return _reply_from_row(row, msg, in_reply_to=held.reply.in_reply_to)
        return held.reply

    def _apply_derived(self, msg: InboundMessage) -> None:
        kind = msg.extra.get("type")
        if kind == "reply_status":
            reply_id = str(msg.extra.get("reply_id", ""))
            status = str(msg.extra.get("status", ""))
            self.memory.mark_reply(reply_id, status, str(msg.extra.get("detail", "")))
            log.info("reply.status", reply_id=reply_id, status=status)
        else:
            log.warning("derived.unknown", type=kind)

    def _apply_summary(self, msg: InboundMessage) -> str:
        """Apply a job's summary; why memory refused it ("" when applied)."""
        try:
            proposal = summaries.proposal_of(msg.conversation, msg.text, msg.extra)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            log.warning("summary.invalid", error=f"{type(exc).__name__}: {exc}")
            return "invalid"
        made = self.memory.apply_summary(proposal)
        if isinstance(made, str):
            return made
        log.info("summary.applied", summary=made.id, first_id=made.first_id,
                 last_id=made.last_id, method=made.method,
                 supersedes=made.supersedes)  # fmt: skip
        return ""


def _reply(
    msg: InboundMessage,
    stream_id: str,
    text: str,
    kind: ReplyKind,
    *,
    reply_id: str | None = None,
    created: float | None = None,
    in_reply_to: str | None = None,
) -> Reply:
    """The reply to ``msg`` (the stream entry ``stream_id``), routed back to its session, with
    the audience it is written for (:func:`written_for`)."""
    return Reply(
        reply_id=reply_id or new_reply_id(),
        answers=stream_id,
        kind=kind,
        channel=msg.channel,
        session=msg.session,
        conversation=msg.conversation,
        in_reply_to=msg.event_id if in_reply_to is None else in_reply_to,
        text=text,
        created=created if created is not None else time.time(),
        extra=written_for(msg),
    )


def written_for(msg: InboundMessage) -> dict[str, Any]:
    """The audience a reply to ``msg`` is written for, which its gateway checks again right
    before posting it (gateways/matrix/recheck.py, the e-mail gateway's recipients): the
    message's privacy class, its sender and its audience as the gateway saw it. A re-answer's
    reply (worker/withheld.py) also names what it answers again."""
    out: dict[str, Any] = {"privacy": msg.privacy.value, "sender": msg.sender}
    audience = msg.extra.get("audience")
    if isinstance(audience, list):
        out["audience"] = audience
    again = withheld.again_of(msg)
    if again is not None:
        out[withheld.AGAIN] = again
        out["in_reply_to"] = msg.event_id
    return out


def _withheld_report(msg: InboundMessage) -> bool:
    return msg.extra.get("type") == "reply_status" and msg.extra.get("status") == "withheld"


def _queued_again(row: LogRow) -> Reply:
    """A notice or re-answer recorded before (worker/withheld.py), queued again as it was: it
    answers a report entry, and is routed by its own row (not by the report's session)."""
    try:
        extra = json.loads(row.extra or "{}")
    except ValueError:
        extra = {}
    extra = extra if isinstance(extra, dict) else {}
    kind = ReplyKind(row.kind) if row.kind in ReplyKind._value2member_map_ else ReplyKind.REPLY
    target = extra.get("in_reply_to")
    keep = ("privacy", "sender", "audience", withheld.AGAIN, withheld.NOTICE, "in_reply_to")
    return Reply(
        reply_id=row.reply_id or row.event_id,
        answers=row.stream_id,
        kind=kind,
        channel=row.channel,
        session=row.session,
        conversation=row.conversation,
        in_reply_to=target if isinstance(target, str) else "",
        text=row.text,
        created=row.platform_ts or row.recorded_ts,
        extra={k: extra[k] for k in keep if k in extra},
    )


def _reply_from_row(row: LogRow, msg: InboundMessage, *, in_reply_to: str) -> Reply:
    """The reply recorded before a crash, queued again as it was (same id, same text)."""
    kind = ReplyKind(row.kind) if row.kind in ReplyKind._value2member_map_ else ReplyKind.REPLY
    return _reply(
        msg,
        row.stream_id,
        row.text,
        kind,
        reply_id=row.reply_id or row.event_id,
        created=row.platform_ts or row.recorded_ts,
        in_reply_to=in_reply_to,
    )


def _event_of(store: MemoryStore, stream_id: str) -> str | None:
    """The platform event id of the inbound entry ``stream_id`` as memory recorded it."""
    found = store.conn.execute(
        "SELECT event_id FROM log WHERE direction = 'in' AND stream_id = ?", (stream_id,)
    ).fetchone()
    return None if found is None or found[0] is None else str(found[0])


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
