"""One stream entry in, at most one reply out: the agent turn, made safe to replay.

The memory write is idempotent on the stream id, and a reply already recorded for an entry is
reused instead of calling the model again, so replaying any entry after a crash adds nothing twice.
Everything the turn asks of memory goes through the facade (memory/facade.py), which also keeps
the degraded-mode rule: memory failing never fails the turn.

``Turns`` owns the steps the writer takes (worker/writer.py): ``parse`` (what an entry may say:
worker/admission.py), ``apply`` (commands, reports, summaries, redactions, no model call:
worker/commands.py, worker/redactions.py), ``begin`` (record the messages, assemble the model's
input from memory), ``run`` (the model call and its tools, on a pool thread), ``finish`` (record
the reply) and ``settle`` (commit). What a turn produces: worker/turn_result.py; replies not
durably recorded yet: worker/ledger.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import tzinfo

import structlog

from contract import timezone
from contract.clock import ScheduleClock
from contract.config import Config
from contract.messages import InboundMessage, Kind, Reply, ReplyKind
from memory.errors import MemoryUnwritable
from memory.turns import Memory, MemorySettings, privacy_of
from memory.types import DrewOn, LogRow
from memory.writer import MemoryStore
from worker import redactions, withheld
from worker.admission import admit
from worker.agent import TurnResult, run_turn
from worker.commands import JOB_RESULTS, WorkerCommand, apply_report, command
from worker.ledger import ReplyLedger
from worker.mcp_tools import McpOffers, turn_offer, with_mcp
from worker.model import ModelPort, NoModel
from worker.scheduled import Occurrences, Recorded
from worker.tools import ToolRegistry
from worker.turn_context import TurnContext
from worker.turn_result import (
    SET_ASIDE,
    Held,
    Job,
    Outcome,
    answered,
    event_of,
    make_reply,
    queued_again,
    reply_from_row,
    transient_row,
    withheld_report,
)

__all__ = ["SET_ASIDE", "Job", "Outcome", "Turns", "memory_settings"]

log = structlog.get_logger(__name__)


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
        timezone=owner_zone(cfg),
        profiles_share=cfg.profiles.context_share,
        profile_facts=cfg.profiles.shown_facts,
    )


def owner_zone(cfg: Config) -> tzinfo | None:
    """``[owner] timezone``, else the system's; None for UTC (the times read ``… UTC``)."""
    return timezone.owner_zone(cfg.owner.timezone)


class Turns:
    """Turns stream entries into replies, writing memory on the way. Owned by the worker."""

    def __init__(
        self,
        cfg: Config,
        store: MemoryStore | None,
        model: ModelPort,
        tools: ToolRegistry | Callable[[TurnContext], ToolRegistry],
        *,
        opener: Callable[[], MemoryStore | None] | None = None,
        clock: Callable[[], float] = time.time,
        commands: Mapping[str, WorkerCommand] | None = None,
        schedule_clock: Callable[[], float] | None = None,
        schedule_fired: Callable[[int], bool] | None = None,
        mcp: McpOffers | None = None,
    ) -> None:
        """``commands``: the owner commands the worker applies (worker/derive.py, ...), by op;
        ``schedule_clock``, ``schedule_fired``: worker/scheduled.py ``Occurrences``; ``mcp``:
        each turn's tools from MCP servers (worker/mcp_tools.py)."""
        self.cfg = cfg
        self.clock = clock  # Redis's time (contract.clock): replies' ages are measured on it
        self.memory = Memory(store, memory_settings(cfg), opener=opener)
        self.model = model
        self.tools, self.mcp = tools, mcp
        self.commands: dict[str, WorkerCommand] = dict(commands or {})
        self.ledger = ReplyLedger(self.memory)  # replies not durably recorded yet
        self.occurrences = Occurrences(self.memory, lambda: self.cfg, schedule_clock
                                       or ScheduleClock(clock), fired=schedule_fired)  # fmt: skip

    def reconfigure(self, cfg: Config) -> None:
        """Run with a reloaded configuration from now on (worker/reload.py calls it on the
        writer between rounds, never inside a turn's begin/finish; turns whose model call runs
        keep the input they were given)."""
        self.cfg = cfg
        self.memory.reconfigure(memory_settings(cfg))

    @property
    def memory_failures(self) -> int:
        """How often memory failed (degraded mode) since the worker started."""
        return self.memory.failures

    def parse(
        self, stream_id: str, raw: Mapping[bytes, bytes] | Mapping[str, str], channel: str | None
    ) -> InboundMessage | Outcome:
        """The entry's message, or the outcome that dead-letters it (invalid, or not what its
        stream may say: worker/admission.py)."""
        return admit(self.cfg, self.memory, stream_id, raw, channel)

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
            if msg.kind is Kind.DERIVED and (job := JOB_RESULTS.get(str(msg.extra.get("type")))):
                with self.memory.write():
                    refused = job(self.memory, msg)
                # the entry holds a job's text: applied or refused, it goes (no copy outlives an
                # erasure); one after an erasure (read before it) has Redis rewrite its files
                return Outcome(forget_entry=True, rewrite_files="erased" in refused)
            if msg.kind is Kind.DERIVED:
                with self.memory.write():
                    apply_report(self.memory, msg)
                    if withheld_report(msg):
                        return self._withheld(stream_id, msg)
                return Outcome()
            if not self.memory.available():  # answered: memory is unavailable
                return self._command(stream_id, msg)
            with self.memory.write():
                return self._command(stream_id, msg)
        except MemoryUnwritable:
            self.ledger.lost()
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
            self.ledger.lost()
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
            chosen = tools if tools is not None else with_mcp(job.tools, job.specs, job.mcp)
            return run_turn(self.model, job.messages, chosen,
                            max_rounds=self.cfg.model.max_tool_rounds)  # fmt: skip
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def failed(self, job: Job, exc: BaseException) -> TurnResult:
        """The result of a turn whose run raised (a bug): an error reply."""
        text = f"Sorry — something went wrong while answering ({type(exc).__name__})."
        return TurnResult(text=text, error=True, rounds=0, tool_calls=0)

    def finish(self, job: Job, result: TurnResult, *, ms: float | None = None) -> Outcome:
        """Record the reply of a finished turn (in memory's open transaction) and return its
        outcome: the reply, to be queued when the transaction is committed."""
        msg = job.msg
        result = self.occurrences.worded(job, result, no_model=isinstance(self.model, NoModel))
        kind = ReplyKind.ERROR if result.error else ReplyKind.REPLY
        reply = make_reply(msg, job.keys[-1], result.text, kind, created=self.clock())
        log.info(
            "turn.done", channel=msg.channel, session=msg.session, stream_id=job.keys[-1],
            answers=len(job.keys), ms=ms, error=result.error, rounds=result.rounds,
            tool_calls=result.tool_calls, reply_chars=len(result.text),
        )  # fmt: skip
        try:
            reply = self.ledger.record(job.held(reply), msg)
        except MemoryUnwritable:
            self.ledger.lost()
            raise
        return Outcome(reply=reply)

    def hold(self, job: Job, result: TurnResult) -> None:
        """Keep a finished turn's reply for when its entries come again (they were given back
        unrecorded: Redis went away meanwhile), so the model is not asked twice."""
        kind = ReplyKind.ERROR if result.error else ReplyKind.REPLY
        reply = make_reply(job.msg, job.keys[-1], result.text, kind, created=self.clock())
        self.ledger.keep(job.held(reply))

    def settle(self) -> None:
        """Commit what the turns since the last commit wrote (before a model call, and before
        the worker acks anything)."""
        try:
            self.memory.settle()
        except MemoryUnwritable:
            self.ledger.lost()
            raise
        self.ledger.settled()

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
            recorded = self._record(stream_id, msg)
            if isinstance(recorded, Outcome):  # an occurrence done now (worker/scheduled.py)
                outcomes.append(recorded)
                continue
            said, first, row, is_owner, fresh = recorded
            if first != stream_id:
                done, ask = self._published_again(stream_id, first, said)
            elif said.record_only:
                self._recorded_only(said)
                done, ask = Outcome(), None
            elif not fresh and (before := memory.recorded_reply(stream_id)) is not None:
                # a replay: the reply recorded before, not a second model call; queued unless
                # Redis holds it already (the reconciliation after a Redis data loss may have
                # queued it before this entry, which the loss made unread, came again) or an
                # erasure blanked it (nothing of it is shown again)
                log.info("turn.replayed", reply_id=before.reply_id, erased=before.erased)
                done, ask = Outcome(), None
                if not before.erased:
                    reply = self._reply_again(before, said, stream_id)
                    done = Outcome(reply=reply, only_if_missing=True)
            else:
                done, ask = None, (stream_id, said, row, is_owner)
            outcomes.append(done)
            if ask is not None:
                asks.append(ask)
        if not asks:
            return outcomes, None
        asks = self.ledger.record_held(asks, outcomes)
        if not asks:
            return outcomes, None
        return outcomes, self._job(asks)

    def _record(self, stream_id: str, msg: InboundMessage) -> Outcome | Recorded:
        """Record the message once (an occurrence: with its item's advance, or done now)."""
        if msg.kind is Kind.SCHEDULED:
            return self.occurrences.record(stream_id, msg)
        row, is_owner, fresh = None, False, False
        with self.memory.write():
            first = self.memory.first_of_event(msg, stream_id)
            if first == stream_id:
                row, is_owner = self.memory.record_inbound(msg, stream_id)
                fresh = self.memory.first_sight(row)
        return msg, first, row, is_owner, fresh

    def _job(self, asks: list[tuple[str, InboundMessage, LogRow | None, bool]]) -> Job:
        """The turn answering ``asks`` (recorded, in order): its model input, from memory now."""
        memory = self.memory
        key, msg, row, is_owner = asks[-1]
        scope = self.occurrences.scope_of(msg, row)  # an occurrence's: whoever set it
        drew = DrewOn()
        current = row or transient_row(msg, key, is_owner)
        if row is not None and withheld.again_of(msg) is not None:
            # a re-answer is keyed by the report, not by its question: what it drew on names
            # the question, so an erasure of the question takes the re-answer too
            drew.add_rows([row.id])
        messages = memory.context(msg, current, scope, drew)
        fallback = self.occurrences.prepare(msg, messages)  # told what it is; down: as written
        ctx = TurnContext(
            stream_id=key,
            msg=msg,
            scope=scope,
            memory=memory,
            role=memory.role_of(msg).role,
            drew=drew,
        )
        tools = self.tools(ctx) if callable(self.tools) else self.tools
        specs, mcp = turn_offer(self.mcp, privacy_of(scope), tools.specs())
        keys, erasures = [a[0] for a in asks], memory.erasure_mark()
        return Job(keys, msg, messages, tools, drew, specs, erasures, fallback, mcp)

    def _withheld(self, stream_id: str, msg: InboundMessage) -> Outcome:
        """A gateway withheld a reply (it would have reached people it was not written for):
        its question is answered again for the audience now, or the owner is told privately why
        not (worker/withheld.py). A replay queues what was recorded for the report before."""
        recorded = self.memory.recorded_reply(stream_id)
        if recorded is not None:
            if recorded.erased:
                return Outcome()
            return Outcome(reply=queued_again(recorded), only_if_missing=True)
        follow = withheld.follow_up(msg, stream_id, self.memory, self.clock())
        if follow.again is not None:
            return Outcome(again=follow.again)
        if follow.notice is None or follow.notice_for is None:
            return Outcome()
        held = Held(follow.notice, DrewOn(), [stream_id], self.memory.erasure_mark())
        return Outcome(reply=self.ledger.record(held, follow.notice_for))

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
                else Outcome(reply=queued_again(recorded), only_if_missing=True)
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
        derived entry gets nothing. A scheduled occurrence is taken as usual (its item advanced:
        it does not come back) and delivered as written."""
        structlog.contextvars.bind_contextvars(
            channel=msg.channel, session=msg.session, stream_id=stream_id
        )
        try:
            scheduled = msg.kind is Kind.SCHEDULED
            if not (scheduled or msg.kind is Kind.MESSAGE) or redactions.is_redaction(msg):
                return Outcome()
            recorded = self._record(stream_id, msg)
            if isinstance(recorded, Outcome):
                return recorded
            msg, first = recorded[0], recorded[1]  # published again: the first one's answer
            if first != stream_id or msg.record_only:  # stands; an edit... is only recorded
                return Outcome()
            before = self.memory.recorded_reply(stream_id)
            if before is not None:
                if before.erased:
                    return Outcome()
                again = self._reply_again(before, msg, stream_id)
                return Outcome(reply=again, only_if_missing=True)
            log.warning("turn.set_aside", reason=reason, scheduled=scheduled)
            text = (self.occurrences.fallback(msg) if scheduled else None) or SET_ASIDE
            kind = ReplyKind.REPLY if text is not SET_ASIDE else ReplyKind.ERROR
            reply = make_reply(msg, stream_id, text, kind, created=self.clock())
            held = Held(reply, DrewOn(), [stream_id], self.memory.erasure_mark())
            return Outcome(reply=self.ledger.record(held, msg))
        except MemoryUnwritable:
            self.ledger.lost()
            raise
        finally:
            structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def _reply_again(self, row: LogRow, msg: InboundMessage, stream_id: str) -> Reply:
        """The reply recorded for the entry ``stream_id`` (``msg``), queued again as it was: a
        collected reply is keyed by a later entry than this one, and replies to that entry's
        event, not to this one's."""
        event: str | None = None
        if row.stream_id != stream_id:  # memory failing: this entry's event, as before
            event = self.memory.use(lambda s: event_of(s, row.stream_id))
        return reply_from_row(row, msg, in_reply_to=event or answered(msg))

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
        """An owner command from the terminal (worker/commands.py)."""
        return command(self.cfg, self.memory, self.commands, stream_id, msg, created=self.clock())
