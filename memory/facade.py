"""What a turn uses of memory, through one object: :class:`Memory`.

The worker's turn records the message and its reply, asks for the context of the turn (the
history window, MEMORY.md, the relevant notes, each a section), applies owner commands and marks
replies here, instead of driving the memory modules itself. The parts stay where they are
(memory/window.py, memory/notes/, memory/curated.py, memory/identity.py, memory/commands.py);
this module only joins them and keeps two rules for all of them:

**Reads degrade** (DESIGN.md). A read that fails in the middle of a turn (a query raises
``sqlite3.Error``) is logged (``memory.degraded``) and counted (:attr:`Memory.failures`), and the
turn goes on with what it has.

**Writes do not** (issue 11: never answered-but-unrecorded). Writes go through :meth:`Memory.write`
(group commit, :meth:`Memory.settle` before every model call and before the worker acks): a write
memory refuses raises :class:`MemoryUnwritable`, and the worker keeps the entry pending and tries
again; one refused by the fencing token (memory/fence.py) raises :class:`FencedOut`.

Memory takes plain parameters (:class:`MemorySettings`), not the application's configuration.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import TypeVar

import structlog

from contract.messages import InboundMessage, Kind, Privacy, Reply
from memory import (
    commands,
    curated_versions,
    gaps,
    notes,
    profile_apply,
    profile_view,
    summaries,
    summary_view,
)
from memory.command_types import CommandContext
from memory.context import Section, build_context
from memory.copies import Copies, copies_of
from memory.curated import CuratedFile, curated_path
from memory.erasure import checkpoint_after_erasure
from memory.errors import FencedOut as FencedOut  # noqa: PLC0414 (its old home)
from memory.errors import MemoryUnwritable as MemoryUnwritable  # noqa: PLC0414 (its old home)
from memory.errors import translated
from memory.fence import is_fenced
from memory.identity import OwnerResolver, OwnerView, ScopedAlias, owner_handles
from memory.identity_writer import Identity
from memory.lines import HistoryLines
from memory.privacy import Scope, direct_person, persons_for, privacy_of
from memory.profile_view import ProfilesSection
from memory.provenance import DrewOn
from memory.redactions import Redacted, redact
from memory.replies import unsettled_replies
from memory.rows import LogRow
from memory.sections import CuratedSection, NotesSection
from memory.store import MemoryStore
from memory.summary_view import SummariesSection
from memory.window import HistoryWindows

log = structlog.get_logger(__name__)

T = TypeVar("T")

HISTORY_ROWS = 400  # an upper bound on rows read for one context; the token budget decides


@dataclass(frozen=True)
class MemorySettings:
    """What memory needs to know, as plain values (the worker fills it from config.toml)."""

    owner_name: str
    owner_aliases: Sequence[str | ScopedAlias]
    workspace: Path  # holds MEMORY.md
    assistant_name: str
    system_prompt: str
    context_tokens: int
    # the [roles] entry of a conversation: (conversation, session) -> its binding
    roles: Callable[[str, str], notes.RoleBinding]
    # the channels whose owner turns see everything (None: all); the owner's turns from the
    # others see their own conversation only, as a group would
    trusted_channels: frozenset[str] | None = None
    # the owner's time zone: the times in the context are shown in it (None: UTC)
    timezone: tzinfo | None = None
    # layer 2 in the context ([profiles] context_share, max_context_facts): its share of the
    # room and the most facts it offers (0: no profiles section)
    profiles_share: float = profile_view.PROFILES_SHARE
    profile_facts: int = profile_view.MAX_FACTS


def _unwritable(exc: sqlite3.Error, step: str) -> Exception:
    if is_fenced(exc):
        return FencedOut(str(exc))
    return MemoryUnwritable(f"{step}: {exc}")


class Memory:
    """The memory of the worker's turns (see the module docstring)."""

    def __init__(
        self,
        store: MemoryStore | None,
        settings: MemorySettings,
        *,
        opener: Callable[[], MemoryStore | None] | None = None,
    ) -> None:
        self.store = store
        self.opener = opener  # opens the store again when it could not be opened before
        self._open = False  # a group-commit transaction of :meth:`write` is open
        self.commits = 0  # group commits so far: an entry is durable once one followed it
        self.settings = settings
        self.failures = 0
        self.resolver = OwnerResolver(settings.owner_aliases)
        self.identity = Identity(self.resolver, settings.owner_name)
        self._owners: OwnerView | None = None  # who the owner is now (labels, recording)
        self._last_owners: OwnerView | None = None  # the last one made (reused if the same)
        # MEMORY.md; each write is recorded as a version (memory/curated_versions.py)
        self.curated = CuratedFile(curated_path(settings.workspace), on_write=self._curated_written)
        self._windows: HistoryWindows | None = None  # the store's recent rows per scope
        self._recall: notes.ContextRecall | None = None  # the notes lookup of each turn
        # memory holds a summary (layer 1): the turn looks for them. Read once per store: only
        # this writer adds summaries (apply_summary), and none is ever deleted
        self._summaries_seen: tuple[MemoryStore, bool] | None = None
        # the texts each erasure applied here removed, until the worker has cleaned Redis of
        # their copies (memory.copies); never written anywhere
        self._erased_texts: dict[int, list[str]] = {}
        self._blocks = itertools.count(1)  # names of the savepoints of write() blocks

    # -- degraded mode -------------------------------------------------------------------------

    def use(self, op: Callable[[MemoryStore], T]) -> T | None:
        """Run a memory operation; None when memory is unavailable or fails (degraded)."""
        if self.store is None:
            return None
        try:
            return op(self.store)
        except sqlite3.Error as exc:
            if is_fenced(exc):  # never degraded: this worker must stop
                raise FencedOut(str(exc)) from exc
            self.failed(exc)
            return None

    def failed(self, exc: sqlite3.Error, **info: object) -> None:
        """Count and log a failure of memory; the turn goes on without it."""
        self.failures += 1
        log.error("memory.degraded", error=str(exc), failures=self.failures, **info)

    @contextmanager
    def write(self) -> Iterator[None]:
        """Writes that join memory's open transaction (group commit: :meth:`settle` commits it).

        The worker settles before every model call and before it acks anything, so no write
        transaction spans a model call, and what it acks is durably in memory. Writes are not
        degraded: a failure to begin or to write raises :class:`MemoryUnwritable` and rolls the
        open transaction back (everything since the last commit is lost: the worker does those
        entries again); a write refused by the fence (memory/fence.py) raises :class:`FencedOut`.
        Reads inside stay degraded. Inside a caller's own transaction (tests, an import), the
        writes join it and the caller commits."""
        store = self.store if self.available() else None
        if store is None:
            raise MemoryUnwritable("memory is unavailable (the database could not be opened)")
        if store.in_batch and not self._open:  # a caller's transaction
            yield
            return
        if not self._open:
            try:
                store.transaction().__enter__()
            except sqlite3.Error as exc:
                raise _unwritable(exc, "begin") from exc
            self._open = True
        # each block (one entry of the worker's batch) in a savepoint of its own: a bug in one
        # entry undoes that entry's writes only, not those of the entries before it in the
        # batch (they were handed on to be acked once this transaction commits)
        name = f"write_{next(self._blocks)}"
        erasures = set(self._erased_texts)
        try:
            store.conn.execute(f"SAVEPOINT {name}")
            yield
        except Exception as exc:
            if isinstance(exc, sqlite3.Error | MemoryUnwritable | FencedOut):
                self._roll_back(store)  # memory failed: everything since the last commit
                raise
            self._owners = None  # a merge may have been undone with the entry
            for erasure in set(self._erased_texts) - erasures:  # ... and an erasure
                del self._erased_texts[erasure]
            try:
                if store.conn.in_transaction:
                    store.conn.execute(f"ROLLBACK TO {name}")
                    store.conn.execute(f"RELEASE {name}")
            except sqlite3.Error:
                self._roll_back(store)
            raise
        except BaseException:
            self._roll_back(store)
            raise
        try:
            store.conn.execute(f"RELEASE {name}")
        except sqlite3.Error as exc:
            self._roll_back(store)
            raise _unwritable(exc, "write") from exc

    def _roll_back(self, store: MemoryStore) -> None:
        """Roll the open transaction back (the worker does its entries again)."""
        self._open = False
        self._owners = None  # a merge may have been rolled back with the rest
        self._erased_texts.clear()  # ... and an erasure: it is applied again
        store.transaction().rollback()

    def settle(self) -> None:
        """Commit the open transaction, if any (:meth:`write`); :class:`MemoryUnwritable` when
        the commit failed (it was rolled back), :class:`FencedOut` when the fence refused it."""
        if not self._open or self.store is None:
            return
        self._open = False
        try:
            self.store.transaction().commit(lazy_index=True)
        except sqlite3.Error as exc:
            self._erased_texts.clear()  # nothing was erased: the erasure is applied again
            raise _unwritable(exc, "commit") from exc
        self.commits += 1

    def idle(self) -> None:
        """Nothing to do: index what the last commits left unindexed (memory.store)."""
        if self.store is not None and not self._open:
            self.use(lambda s: s.sync_index())

    def available(self) -> bool:
        """Whether there is a store, opening it again if it could not be opened before."""
        if self.store is None and self.opener is not None:
            self.store = self.opener()
            if self.store is not None:
                log.info("memory.opened")
        return self.store is not None

    def _write(self, op: Callable[[MemoryStore], T]) -> T:
        """A write inside :meth:`write`: raises instead of degrading."""
        store = self.store
        if store is None:
            raise MemoryUnwritable("memory is unavailable (the database could not be opened)")
        try:
            return op(store)
        except sqlite3.Error as exc:
            raise _unwritable(exc, "write") from exc

    def fence(self, token: int) -> None:
        """Take memory for the lease holder ``token`` (memory/fence.py); raises
        :class:`memory.errors.StaleToken` or :class:`memory.errors.MemoryUnavailable`. Nothing to
        fence without a store."""
        if self.store is not None:
            with translated():
                self.store.fence(token)

    def reload(self) -> None:
        """Read the store's caches again (another worker may have written while this one waited
        for the lease)."""
        if self.store is None:
            return
        try:
            self.store.reload()
        except sqlite3.Error as exc:
            self.failures += 1
            log.error("memory.reload_failed", error=str(exc))

    def reconfigure(self, settings: MemorySettings) -> None:
        """Take new settings (config.toml changed: contract/config_watch.py), on the writer
        between turns: the owner's aliases and name, the prompt, the budget, the roles."""
        self.settings = settings
        self.resolver = OwnerResolver(settings.owner_aliases)
        self.identity = Identity(self.resolver, settings.owner_name)
        self._owners = None

    # -- identity ------------------------------------------------------------------------------

    def owners(self) -> OwnerView:
        """Who the owner is now: the configured aliases and the handles merged into the owner
        (memory.identity.OwnerView). Cached until identity changes: a reload of the aliases, an
        owner command (a merge, an import), a rollback."""
        view = self._owners
        if view is None:
            merged = self.use(lambda store: owner_handles(store.conn))
            last = self._last_owners
            if last is not None and last.resolver is self.resolver and last.merged == merged:
                view = last  # nothing changed: the lines made under it stay good
            else:
                view = OwnerView(self.resolver, merged or frozenset())
            if merged is not None:  # memory failing: not kept, asked again next time
                self._owners = self._last_owners = view
        return view

    # -- recording -----------------------------------------------------------------------------

    def is_owner(self, msg: InboundMessage) -> bool:
        # a scheduled occurrence is the scheduler's (on the terminal, any sender is the owner)
        if msg.kind is Kind.SCHEDULED:
            return False
        return self.owners().is_owner(msg.channel, msg.sender)

    def record_inbound(self, msg: InboundMessage, stream_id: str) -> tuple[LogRow | None, bool]:
        """The inbound row (its sender's entity created on first sight), idempotent on the
        stream id; and whether the sender is the owner."""
        is_owner = self.is_owner(msg)
        row = self._write(
            lambda s: self.identity.append_inbound(s, msg, stream_id, is_owner=is_owner)
        )
        return row, is_owner

    def first_of_event(self, msg: InboundMessage, stream_id: str) -> str:
        """The stream id under which this platform event was first recorded, or ``stream_id``.

        After Redis lost data (a power cut, a failover) a gateway's cursor rolls back with the
        stream and the same event is published again under a new stream id; memory knows it by
        (channel, platform event id) from the same sender in the same session and conversation,
        so it is recorded and answered once. The same event id from anyone else is another
        message (a forged or colliding id): it is recorded and answered as one."""
        if not msg.event_id:
            return stream_id

        def read(store: MemoryStore) -> str:
            first = store.inbound_by_event(msg)
            return stream_id if first is None else first

        return self._write(read)

    def final_status(self, reply_id: str) -> str | None:
        """The reply's final status in memory (delivered, expired, failed, withheld), if it has
        one."""
        marks = self._write(lambda s: s.reply_marks(reply_id))
        for status in ("delivered", "failed", "expired", "withheld"):
            if status in marks:
                return status
        return None

    def recorded_reply(self, stream_id: str) -> LogRow | None:
        """The reply recorded for this entry before (a replay), if any."""
        return self.use(lambda s: s.recorded_reply(stream_id))

    def inbound_row(self, stream_id: str) -> LogRow | None:
        """The inbound row of the stream entry ``stream_id`` (None: not recorded, or memory
        failing)."""
        return self.use(lambda s: s.inbound_row(stream_id))

    def owner_row(self, *, not_session: str) -> LogRow | None:
        """The owner's newest message in the owner's own conversations outside ``not_session``,
        on a channel the owner trusts (where the owner can be told something privately)."""
        trusted = self.settings.trusted_channels
        return self.use(lambda s: s.owner_row(not_session=not_session, channels=trusted))

    def first_sight(self, row: LogRow | None) -> bool:
        """``row`` (from :meth:`record_inbound`) was inserted just now: memory never saw its
        entry, so no reply to it can be recorded (a reply is recorded only after its message,
        and rows are never deleted: an erased row stays, emptied) — the replay lookup is
        skipped."""
        return row is not None and self.store is not None and self.store.last_inserted is row

    def record_reply(
        self,
        reply: Reply,
        privacy: Privacy,
        drew: DrewOn | None = None,
        covers: Sequence[str] = (),
    ) -> LogRow:
        """The reply row (the one recorded before, for a replay), with what its model input
        drew on (memory.provenance); ``covers``: the other entries a collected reply answers
        (all recorded in the same write)."""
        name = self.settings.assistant_name
        extra = drew.as_extra() if drew is not None else {}

        def write(store: MemoryStore) -> LogRow:
            row = store.append_reply(reply, sender=name, privacy=privacy, extra=extra)
            if covers:
                store.add_covers(reply.answers, covers)
            return row

        return self._write(write)

    def record_tool_result(
        self, reply: Reply, privacy: Privacy, n: int, *, tool: str, server: str, text: str
    ) -> LogRow:
        """The ``n``-th tool result of the turn that ``reply`` answers (an MCP tool's labelled
        output, worker/mcp_tools.py) as a log row of the reply's conversation and ``privacy``
        (memory/store.py ``append_tool_result``): recorded before the reply, in the same write;
        a replay returns the row recorded before."""

        def write(store: MemoryStore) -> LogRow:
            return store.append_tool_result(
                reply, n, privacy=privacy, tool=tool, server=server, text=text
            )

        return self._write(write)

    def apply_summary(self, p: summaries.Proposal) -> summaries.Summary | str:
        """Apply a job's summary (inside :meth:`write`); the reason when memory refuses it now
        (the range changed, is covered, or was erased meanwhile: the worker plans again)."""

        def write(store: MemoryStore) -> summaries.Summary | str:
            try:
                made = summaries.apply(store.conn, p)
            except summaries.Refused as exc:
                log.info("summary.refused", key=p.job_key, reason=str(exc))
                return str(exc)
            self._summaries_seen = (store, True)
            return made

        return self._write(write)

    # -- layer 2: profiles and capability gaps (the worker's duties and the profile entries) -----

    def apply_profile(self, result: profile_apply.RangeResult) -> profile_apply.Applied | str:
        """Apply a range's profile result (inside :meth:`write`; memory/profile_apply.py); the
        reason when memory refuses the whole of it now (its range changed since the job read
        it: the planner derives the new range instead)."""

        def write(store: MemoryStore) -> profile_apply.Applied | str:
            try:
                return profile_apply.apply_result(store.conn, result)
            except profile_apply.Refused as exc:
                log.info("profile.result_refused", key=result.run_key, reason=str(exc))
                return str(exc)

        return self._write(write)

    def close_gaps_covered(self, tool_names: Sequence[str]) -> list[int]:
        """Close the open gaps a tool of these covers (inside :meth:`write`); their ids."""
        names = list(tool_names)
        return self._write(lambda s: gaps.close_covered(s.conn, names, time.time()))

    def gaps_signature(self) -> str | None:
        """What changes whenever a gap does (TODO.md is written again); None: memory failing."""
        return self.use(lambda s: gaps.signature(s.conn))

    def open_gaps(self) -> list[gaps.Gap] | None:
        """The open gaps, the most recently seen first (TODO.md); None: memory failing."""
        return self.use(lambda s: gaps.listing(s.conn, include_closed=False))

    def pending_profiles(self, limit: int) -> list[profile_apply.PendingRange] | None:
        """The ranges the profile job has still to derive, oldest first (at most ``limit``);
        None: memory failing (not "nothing to do")."""
        return self.use(lambda s: profile_apply.pending(s.conn, limit))

    def erasure_mark(self) -> int:
        """The newest erasure's id (0: none, or memory failing): a turn that started under an
        older mark may have read what was erased since."""
        found = self.use(lambda s: s.conn.execute("SELECT MAX(id) FROM erasure").fetchone()[0])
        return int(found or 0)

    def reply_of(self, answers: str) -> tuple[str, str] | None:
        """The (reply id, channel) of the reply to entry ``answers`` (one read of the log's
        (direction, stream id) index); None: no such reply, or memory failed."""

        def read(store: MemoryStore) -> tuple[str, str] | None:
            raw = store.conn.execute(
                "SELECT reply_id, channel FROM log WHERE direction = 'out' AND stream_id = ?",
                (answers,),
            ).fetchone()
            return None if raw is None else (str(raw[0]), str(raw[1]))

        return self.use(read)

    def unsettled_replies(self, window_s: float, limit: int) -> list[Reply]:
        """The replies recorded in the ``window_s`` seconds before the newest one (at most
        ``limit``, among the newest rows), with no final status (delivered, failed, expired),
        as they were queued; [] when memory fails (degraded: nothing to reconcile)."""
        return self.use(lambda s: unsettled_replies(s, window_s, limit)) or []

    def _curated_written(self, before: str, after: str, cause: str, stream_id: str | None) -> None:
        """Record a write of MEMORY.md as a version; logged when memory cannot (degraded)."""

        def record(store: MemoryStore) -> bool:
            curated_versions.written(store.conn, before, after, cause, stream_id=stream_id)
            return True

        if self.use(record) is None:
            log.warning("curated.version_not_kept", cause=cause)

    def mark_reply(self, reply_id: str, status: str, detail: str) -> None:
        self._write(lambda s: s.mark_reply(reply_id, status, detail))

    def apply_command(self, stream_id: str, op: object, args: object) -> dict[str, object] | None:
        """Apply an owner command (memory/commands.py); None when memory failed (nothing was
        changed: inside the batch the command has a savepoint of its own)."""

        def run(store: MemoryStore) -> dict[str, object]:
            ctx = CommandContext(
                stream_id, store, owner_name=self.settings.owner_name,
                workspace=self.settings.workspace,
            )  # fmt: skip
            result = commands.apply_atomic(store, ctx, op, args)
            if result.get("ok"):
                self._erased_texts.update(ctx.erased_texts)
            return result

        try:
            return self.use(run)
        finally:
            self._owners = None  # a merge, an import: who the owner is may have changed

    def apply_redaction(
        self, stream_id: str, *, channel: str, room: str, event_id: str, redacted_by: str,
        redaction_event: str, reply_of: str = "",
    ) -> Redacted:  # fmt: skip
        """Erase a redacted event (memory/redactions.py), inside :meth:`write`; ``reply_of``:
        the entry a redacted reply of relaybot's own answers."""

        def write(store: MemoryStore) -> Redacted:
            texts: dict[int, list[str]] = {}
            done = redact(
                store, channel=channel, room=room, event_id=event_id, redacted_by=redacted_by,
                stream_id=stream_id, redaction_event=redaction_event, reply_of=reply_of,
                texts=texts,
            )  # fmt: skip
            self._erased_texts.update(texts)
            return done

        return self._write(write)

    # -- erasure beyond the log (the worker's part: worker/scrub.py) -----------------------------

    def erased_copies(self, erasure_id: int) -> Copies | None:
        """What finds erasure ``erasure_id``'s text outside memory (memory.copies), with the
        texts it removed when it was applied by this process."""
        texts = self._erased_texts.get(erasure_id, [])
        found = self.use(lambda s: copies_of(s.conn, erasure_id))
        return None if found is None else found.with_texts(texts)

    def drop_erased_texts(self, erasure_id: int | None = None) -> None:
        """Forget the texts of an erasure whose copies are cleaned (None: of every erasure, the
        batch that applied them was not committed)."""
        if erasure_id is None:
            self._erased_texts.clear()
        else:
            self._erased_texts.pop(erasure_id, None)

    def clear_wal(self) -> bool | None:
        """Checkpoint and truncate the WAL (its old frames still hold erased text): False while a
        reader holds an old snapshot (try again later), None when memory failed."""
        return self.use(checkpoint_after_erasure)

    # -- a turn's view -------------------------------------------------------------------------

    def scope_of(self, msg: InboundMessage, row: LogRow | None) -> Scope:
        """The privacy scope of the conversation this message belongs to."""
        entity = row.entity if row is not None else None
        return Scope(conversation=msg.conversation, privacy=msg.privacy, entity=entity)

    def role_of(self, msg: InboundMessage) -> notes.RoleBinding:
        """The conversation's ``[roles]`` entry (its agent role, project and teams)."""
        return self.settings.roles(msg.conversation, msg.session)

    def viewer(self, store: MemoryStore, scope: Scope, msg: InboundMessage) -> notes.Viewer:
        """The conversation as a reader of notes: its scope, its person, its role binding."""
        return notes.conversation_viewer(store, scope, self.role_of(msg))

    def context(
        self, msg: InboundMessage, current: LogRow, scope: Scope, drew: DrewOn | None = None
    ) -> list[dict[str, str]]:
        """The model's input for this turn: the system prompt, the sections (MEMORY.md in the
        owner's own conversations; the notes relevant to the message), the recent history this
        conversation may see, and the message; ``drew`` is told which rows and notes went in
        (memory.provenance). Nothing here fails the turn."""
        owners = self.owners()
        history, ready = self._history(scope, owners)
        settings = self.settings
        return build_context(
            system_prompt=settings.system_prompt,
            history=history,
            current=current,
            budget_tokens=settings.context_tokens,
            assistant_name=settings.assistant_name,
            sections=self._sections(msg, scope, drew, current.id),
            ready=ready,
            drew=drew,
            owners=owners,
            zone=settings.timezone,
        )

    def _history(
        self, scope: Scope, owners: OwnerView | None = None
    ) -> tuple[Sequence[LogRow], HistoryLines | None]:
        store = self.store
        if store is None:
            return (), None
        if self._windows is None or self._windows.store is not store:
            self._windows = HistoryWindows(store, limit=HISTORY_ROWS)
        try:
            settings = self.settings
            return self._windows.history(scope, settings.assistant_name, owners, settings.timezone)
        except sqlite3.Error as exc:  # a failing query: no history, not a failed turn
            self.failed(exc)
            return (), None

    def _sections(
        self,
        msg: InboundMessage,
        scope: Scope,
        drew: DrewOn | None = None,
        current_id: int = 0,
    ) -> list[Section]:
        """The context's sections, in order (memory/sections.py)."""
        sections: list[Section] = []
        if privacy_of(scope) is Privacy.OWNER:
            curated = self.curated.read().text  # never raises
            if curated:
                sections.append(CuratedSection(curated))
        shown = self._summaries(msg, scope, current_id)
        if shown:
            sections.append(
                SummariesSection([summary_view.line(s, self.settings.timezone) for s in shown])
            )
            if drew is not None:  # offered (the budget may cut the oldest): an erasure reaches
                drew.add_summaries(s.id for s in shown)  # every reply they may have shaped
        profiled = self._profiles(msg, scope, current_id)
        if profiled.lines:
            sections.append(ProfilesSection(profiled.lines, self.settings.profiles_share))
            if drew is not None:  # the facts' evidence: an erasure of it reaches the reply
                drew.add_rows(profiled.evidence)
                drew.add_facts(profiled.fact_ids)  # ... and one of their ranges' rows
        found = self._notes(msg, scope, drew)
        if found:
            sections.append(NotesSection(found))
        return sections

    def _summaries(
        self, msg: InboundMessage, scope: Scope, current_id: int
    ) -> list[summaries.Summary]:
        """Layer 1 in the context (memory/summary_view.py); none if memory fails (degraded)."""
        store = self.store
        if store is None or not self._any_summary(store):
            return []
        persons = persons_for(store, scope) if direct_person(scope) is not None else frozenset()
        try:
            return summary_view.section_summaries(
                store.conn, scope, conversation=msg.conversation,
                before_id=current_id or 2**62, text=msg.text, persons=persons,
            )  # fmt: skip
        except sqlite3.Error as exc:
            self.failed(exc)
            return []

    def _any_summary(self, store: MemoryStore) -> bool:
        """Whether memory holds a summary (read once per store, then known: only this writer
        adds them, and none is ever deleted)."""
        seen = self._summaries_seen
        if seen is None or seen[0] is not store:
            try:
                found = store.conn.execute("SELECT 1 FROM summary LIMIT 1").fetchone()
            except sqlite3.Error:
                return False
            seen = self._summaries_seen = (store, found is not None)
        return seen[1]

    # -- layer 2: profile facts (memory/profile_view.py) ------------------------------------------

    def _profiles(self, msg: InboundMessage, scope: Scope, current_id: int) -> profile_view.Shown:
        """The profile facts of the turn's section; none if memory fails (degraded)."""
        store, limit = self.store, self.settings.profile_facts
        if store is None or limit <= 0 or privacy_of(scope) is None:
            return profile_view.Shown([], [])
        try:
            if store.conn.execute(profile_view.ANY_CURRENT).fetchone() is None:
                return profile_view.Shown([], [])
            return profile_view.section_facts(
                store.conn, scope, conversation=msg.conversation, before_id=current_id or 2**62,
                limit=limit, persons=persons_for(store, scope),
                owner_name=self.settings.owner_name, text=msg.text,
            )  # fmt: skip
        except sqlite3.Error as exc:
            self.failed(exc)
            return profile_view.Shown([], [])

    def profile(
        self, scope: Scope, entity_name: str | None, kind: str | None, drew: DrewOn | None = None
    ) -> str:
        """The ``profile`` tool's answer (memory/profile_view.py :func:`tool_text`): the facts of
        ``entity_name`` (None: the people of the scope's conversation) that ``scope`` may see;
        ``drew`` is told their evidence. An error line when memory fails (degraded)."""

        def read(store: MemoryStore) -> str:
            text, shown = profile_view.tool_text(
                store.conn, scope, entity=entity_name, kind=kind, conversation=scope.conversation,
                persons=persons_for(store, scope), owner_name=self.settings.owner_name,
            )  # fmt: skip
            if drew is not None:
                drew.add_rows(shown.evidence)
                drew.add_facts(shown.fact_ids)
            return text

        found = self.use(read)
        return (
            "error: profiles cannot be read right now (memory failed)" if found is None else found
        )

    def _notes(self, msg: InboundMessage, scope: Scope, drew: DrewOn | None = None) -> list[str]:
        """The notes relevant to the message that this conversation may see (none if memory
        fails: degraded)."""
        store = self.store
        if store is None:
            return []
        if self._recall is None or self._recall.store is not store:
            self._recall = notes.ContextRecall(store)
        try:
            return self._recall.lines(msg.text, lambda: self.viewer(store, scope, msg), drew=drew)
        except sqlite3.Error as exc:
            self.failed(exc)
            return []
