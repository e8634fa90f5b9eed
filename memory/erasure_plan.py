"""What an erasure removes, found before anything is removed: the target's rows, and every
reply and note derived from them, hop by hop (read-only: ``relaybot memory erase`` previews it,
the worker applies it, memory/erasure.py).

**The target** (hop 0) is what the owner named:

- ``conversation C``: every row of C, both directions;
- ``entity E`` (an entity id or a handle ``channel:address``): everything that *person* said —
  inbound rows of E and of every entity joined to it by verified links (memory.identity), plus
  rows from before identity existed whose sender is one of their handles;
- ``id N`` (or ``N,M,…``: a platform's redaction names every row of its event): those rows
  and their edits (``extra.edit_of``, which repeat the text).

**Derived items** (hop 1 and more) are the replies and notes whose model input held what goes:

- hop 1: the replies that answered the target's messages, the replies whose model input held a
  target row (memory/derived.py: in its history span, shown by a tool, in a summary it was
  offered), the notes learned from the target (``source_entity``, ``source_conversation``,
  ``chat``) or written in one of its turns;
- hop *h* + 1: the replies whose model input held a reply or a note of hop *h*;
- at every hop, the notes written in a derived reply's turn (the same model input: the same hop),
  and the newer versions of a note that goes (they supersede it: the same hop).

A kept mail whose subject repeats an erased mail's (memory/subjects.py) counts as a target row
for what drew on it (its subject goes, its own words stay).

**Scheduled items** (memory/schedule_erasure.py) go with what they were set from: a
conversation's items and a person's are the target's own (hop 0); an item set in the turn of a
target message, or of a derived reply, goes at that turn's hop, as a note written there does. An
item's occurrences are log rows (its text under a header, the scheduler as the sender): they go
at the item's hop, and what drew on them (the reply that delivered it, ...) at the hops after.
Items cannot be kept.

**Tool results** (log rows of kind ``tool``: an MCP tool's output, recorded with the reply of
the turn that called it, memory/store.py ``append_tool_result``) go with their turn, as its notes
do: at the hop of the reply (or the target message) that turn answered, and the replies whose
model input held them at the next hop. A tool result named itself (``id N``) takes the reply it
informed and that turn's notes at hop 1.

**The bound** is :data:`MAX_HOPS`. In a conversation every reply's history holds the replies
before it, so an unbounded chain would take every later reply of a busy conversation, for as
long as it went on; three hops take a quote of a quote of a quote (the model repeating the text
three turns on), and the replies one hop further, left, are named (:attr:`ErasurePlan.beyond`),
so the owner can erase them too (``--id``).

**Keeping.** The owner may keep listed items (``--keep reply:N``, ``--keep note:N``); each is
recorded in the tombstone with its hop and what it drew on. Keeping an item keeps only that item
(a kept reply's turn may still have written notes that go), and what drew on a kept item is not
erased because of it: the owner has judged its text clean, so the chain stops there (what drew on
it goes only when it drew on something else that goes). The target's own rows cannot be kept, and
a newer version of a note cannot be kept while its older version goes (it supersedes it).

**Layer 2.** The profile facts and capability gaps resting on a row that goes (or on a mail whose
subject goes) are blanked with it (memory/profile_erasure.py); the plan names them
(:attr:`ErasurePlan.fact_ids`, :attr:`ErasurePlan.gap_ids`, ``facts`` and ``gaps`` in the
tombstone). They cannot be kept: they are derived from the text that goes.

Every item carries its first words for the preview; the tombstone keeps only ids and hops, never
text.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory import profile_erasure, schedule_erasure
from memory.command_types import CommandError
from memory.derived import derived_replies
from memory.identity import handles_of, person_of, resolve_ref
from memory.lines import TOOL_KIND
from memory.rows import NOT_ERASED
from memory.sql import chunks, marks
from memory.store import TOOL_ROW
from memory.subjects import subject_rows

TARGET_KINDS = ("entity", "conversation", "id")
MAX_HOPS = 3
WORDS = 8  # of an item's text, in the preview
_KEEP = re.compile(r"^(reply|note):([0-9]{1,18})$")

Rows = dict[int, tuple[str, str]]  # log id -> (direction, stream id)


@dataclass(frozen=True)
class Item:
    """A reply, a note or a scheduled item that an erasure takes (or keeps, the owner's choice:
    replies and notes only), with its hop and what it drew on (``log #N``, ``note #N``,
    ``summary #N``, ``conversation C``, ``entity E``)."""

    kind: str  # "reply", "note" or "scheduled"
    id: int
    hop: int
    drew_on: str
    words: str = ""
    answers: bool = False  # a reply that answered a target message

    @property
    def ref(self) -> str:
        return f"{self.kind}:{self.id}"

    def record(self) -> dict[str, Any]:
        """As the tombstone keeps it: no text."""
        return {"kind": self.kind, "id": self.id, "hop": self.hop, "drew_on": self.drew_on}


@dataclass
class ErasurePlan:
    """What an erasure of ``kind``/``target`` removes (read-only: the CLI previews it too)."""

    kind: str
    target: str
    entities: list[str] = field(default_factory=list)
    log_ids: list[int] = field(default_factory=list)
    log_keys: list[tuple[str, str]] = field(default_factory=list)
    note_ids: list[int] = field(default_factory=list)
    note_keys: list[str] = field(default_factory=list)
    derived_ids: list[int] = field(default_factory=list)  # replies that drew on the text
    quote_ids: list[int] = field(default_factory=list)  # kept rows whose quote is removed
    quote_keys: list[tuple[str, str]] = field(default_factory=list)
    subject_ids: list[int] = field(default_factory=list)  # kept mails whose subject is removed
    subject_keys: list[tuple[str, str]] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)  # the derived replies and notes that go
    kept: list[Item] = field(default_factory=list)  # ... and those the owner keeps
    beyond: list[int] = field(default_factory=list)  # replies one hop past the bound: left
    scheduled: list[Item] = field(default_factory=list)  # the scheduled items that go, hop 0 too
    scheduled_ids: list[int] = field(default_factory=list)
    scheduled_keys: list[tuple[int, str]] = field(default_factory=list)  # (id, created_by)
    occurrences: dict[int, int] = field(default_factory=dict)  # their log rows -> hop
    tool_rows: dict[int, int] = field(default_factory=dict)  # turns' tool results that go -> hop
    fact_ids: list[int] = field(default_factory=list)  # layer 2: the facts blanked with the rows
    gap_ids: list[int] = field(default_factory=list)  # ... and the capability gaps

    @property
    def empty(self) -> bool:
        return not self.log_ids and not self.note_ids and not self.scheduled_ids

    @property
    def own_rows(self) -> int:
        """The target's own rows (hop 0)."""
        later = sum(1 for hop in self.occurrences.values() if hop > 0) + len(self.tool_rows)
        return len(self.log_ids) - sum(1 for i in self.items if i.kind == "reply") - later

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "log_ids": self.log_ids,
            "log_keys": [list(k) for k in self.log_keys],
            "note_ids": self.note_ids,
            "note_op_keys": self.note_keys,
            "hop_bound": MAX_HOPS,
        }
        if self.derived_ids:
            out["derived_replies"] = self.derived_ids
        if self.items:
            out["derived"] = [i.record() for i in self.items]
        if self.kept:
            out["kept"] = [i.record() for i in self.kept]
        if self.beyond:
            out["beyond_bound"] = self.beyond
        if self.quote_ids:
            out["quote_ids"] = self.quote_ids
            out["quote_keys"] = [list(k) for k in self.quote_keys]
        if self.subject_ids:
            out["subject_ids"] = self.subject_ids
            out["subject_keys"] = [list(k) for k in self.subject_keys]
        if self.entities:
            out["entities"] = self.entities
        if self.scheduled_ids:
            out["scheduled_ids"] = self.scheduled_ids
            out["scheduled_keys"] = [list(k) for k in self.scheduled_keys]
            out["scheduled"] = [i.record() for i in self.scheduled]
        if self.fact_ids:
            out["facts"] = self.fact_ids
        if self.gap_ids:
            out["gaps"] = self.gap_ids
        return out


def parse_keep(keep: Iterable[str]) -> set[tuple[str, int]]:
    """``reply:N`` / ``note:N`` as (kind, id); :class:`CommandError` for anything else."""
    out: set[tuple[str, int]] = set()
    for raw in keep:
        found = _KEEP.match(str(raw).strip().casefold())
        if found is None:
            raise CommandError(
                f"keep what? {raw!r}: write reply:ID or note:ID, as the preview does"
            )
        out.add((found[1], int(found[2])))
    return out


def plan_erasure(
    conn: sqlite3.Connection, kind: str, target: str, keep: Iterable[str] = ()
) -> ErasurePlan:
    """What an erasure would remove, keeping ``keep``; :class:`CommandError` for a bad target or
    a ``keep`` that is not one of its derived items."""
    target = target.strip()
    if kind not in TARGET_KINDS:
        raise CommandError(f"erase what? kind must be one of {', '.join(TARGET_KINDS)}")
    if not target:
        raise CommandError("erase what? the target is empty")
    wanted = parse_keep(keep)
    plan = ErasurePlan(kind=kind, target=target)
    own, learned = _target(conn, plan)
    candidates: dict[tuple[str, int], Item] = {}
    if wanted:  # what may be kept: what the erasure would take without keeping anything
        everything = _Hops(conn, ErasurePlan(kind=kind, target=target), own, set())
        everything.run(learned)
        candidates = everything.found
    hops = _Hops(conn, plan, own, wanted)
    hops.run(learned)
    hops.check_keep(candidates)
    return hops.finish()


class _Hops:
    """The breadth-first walk from the target's rows, hop by hop (module docstring)."""

    def __init__(
        self, conn: sqlite3.Connection, plan: ErasurePlan, own: Rows, keep: set[tuple[str, int]]
    ) -> None:
        self.conn, self.plan, self.own, self.keep = conn, plan, own, keep
        self.rows: Rows = dict(own)  # every log row that goes
        self.notes: dict[int, str | None] = {}  # every note that goes -> its op key
        self.found: dict[tuple[str, int], Item] = {}  # every derived item, kept ones too
        self.scheduled: dict[int, Item] = {i.id: i for i in plan.scheduled}  # items that go
        self.occurrences: dict[int, int] = dict(plan.occurrences)  # their rows -> hop
        self.tools: dict[int, int] = {}  # the tool results of the turns that go -> hop

    def run(self, learned: Learned) -> None:
        conn = self.conn
        subjects = subject_rows(conn, sorted(self.own))
        self.plan.subject_ids = sorted(subjects)
        self.plan.subject_keys = [subjects[i] for i in self.plan.subject_ids]
        sources = {**self.own, **subjects}
        # hop 1: the answers to the target's messages (and to the mails that repeat a subject)
        for in_id, (direction, sid) in sorted(sources.items()):
            if direction == "in":  # an answer to a kept mail counts as derived (its subject)
                self._answers(in_id, sid, own=in_id in self.own)
            if direction == "in" and TOOL_ROW in sid:  # a tool's result: the reply it informed
                self._answers(in_id, _turn_of(sid), own=False)
        self._replies(sources, [], hop=1)
        for sql, params, why in learned:
            for note_id, op_key in conn.execute(f"SELECT id, op_key FROM note WHERE {sql}", params):  # noqa: S608
                self._note(int(note_id), op_key, 1, why)
        for in_id, (direction, sid) in sorted(sources.items()):
            if direction == "in":  # the notes written in the target's turns (a tool's: its turn)
                self._turn_notes(_turn_of(sid), 1, f"log #{in_id}")
        for in_id, (direction, sid) in sorted(self.own.items()):
            if direction == "out":  # a reply of the target (a conversation): its turn's notes
                self._turn_notes(sid, 1, f"log #{in_id}")
        frontier = (self._hop_rows(1), self._hop_notes(1))
        for hop in range(2, MAX_HOPS + 1):
            self._occurrence_answers(hop)
            rows, notes = self._replies(*frontier, hop=hop)
            frontier = (rows, notes)
            if not rows and not notes:
                break
        else:
            beyond = derived_replies(conn, frontier[0], frontier[1], exclude=self._taken())
            self.plan.beyond = sorted(beyond)

    def _replies(
        self, rows: Rows | Sequence[int], notes: Sequence[int], *, hop: int
    ) -> tuple[list[int], list[int]]:
        """The replies of ``hop`` (their model input held ``rows`` or ``notes``), the notes of
        their turns, and the versions of every note of this hop."""
        found = derived_replies(self.conn, rows, notes, exclude=self._taken())
        for reply_id, d in sorted(found.items()):
            self._reply(reply_id, d.stream_id, hop, d.drew_on)
        for _reply_id, d in sorted(found.items()):
            self._turn_notes(d.stream_id, hop, d.drew_on)
        return self._hop_rows(hop), self._hop_notes(hop)

    def _hop_rows(self, hop: int) -> list[int]:
        """The rows that go at ``hop``: derived replies, and the occurrences of the items."""
        replies = [i.id for k, i in self.found.items() if k[0] == "reply" and i.hop == hop
                   and k not in self.keep]  # fmt: skip
        tools = [r for r, h in self.tools.items() if h == hop]
        return replies + [r for r, h in self.occurrences.items() if h == hop] + tools

    def _hop_notes(self, hop: int) -> list[int]:
        return [i.id for k, i in self.found.items() if k[0] == "note" and i.hop == hop
                and k not in self.keep]  # fmt: skip

    def _taken(self) -> set[int]:
        """The rows already taken or found (kept replies too): not looked for again."""
        return set(self.rows) | {i.id for k, i in self.found.items() if k[0] == "reply"}

    def _occurrence_answers(self, hop: int) -> None:
        """The replies that answered the occurrences of the items found at ``hop - 1`` (those of
        the target's own items are target rows: answered at hop 1 as theirs are)."""
        for row_id, at in sorted(self.occurrences.items()):
            if at == hop - 1 and at > 0:
                self._answers(row_id, self.rows[row_id][1], own=False, hop=hop)

    def _answers(self, in_id: int, sid: str, *, own: bool, hop: int = 1) -> None:
        """The reply that answered the inbound entry ``sid`` (``own``: a target message)."""
        raw = self.conn.execute(
            f"SELECT id FROM log WHERE direction = 'out' AND stream_id = ? AND {NOT_ERASED}",  # noqa: S608
            (sid,),
        ).fetchone()
        if raw is not None and int(raw[0]) not in self.rows:
            self._reply(int(raw[0]), sid, hop, f"log #{in_id}", answers=own)

    def _reply(
        self, reply_id: int, sid: str, hop: int, drew_on: str, answers: bool = False
    ) -> None:
        key = ("reply", reply_id)
        if key in self.found or reply_id in self.rows:
            return
        self.found[key] = Item("reply", reply_id, hop, drew_on, answers=answers)
        if key not in self.keep:
            self.rows[reply_id] = ("out", sid)

    def _turn_notes(self, sid: str, hop: int, drew_on: str) -> None:
        """The notes written, the items scheduled and the tools' results recorded (rows the
        reply drew on: later replies that held them go at the next hop) in the turn of the
        entry ``sid``."""
        first = sid + TOOL_ROW  # its tool rows' keys: sid/tool/1, sid/tool/2, ...
        for row_id, key in self.conn.execute(
            "SELECT id, stream_id FROM log WHERE direction = 'in' AND stream_id > ? "  # noqa: S608
            f"AND stream_id < ? AND kind = ? AND {NOT_ERASED}",
            (first, first[:-1] + chr(ord(first[-1]) + 1), TOOL_KIND),
        ).fetchall():
            if int(row_id) not in self.rows:
                self.rows[int(row_id)] = ("in", str(key))
                self.tools[int(row_id)] = hop
        for note_id, op_key in self.conn.execute(
            "SELECT id, op_key FROM note WHERE stream_id = ? ORDER BY id", (sid,)
        ):
            self._note(int(note_id), op_key, hop, drew_on)
        for item_id in schedule_erasure.set_in(self.conn, sid):
            if item_id in self.scheduled:
                continue
            self.scheduled[item_id] = Item("scheduled", item_id, hop, drew_on)
            for row_id, key in schedule_erasure.occurrence_rows(self.conn, [item_id]).items():
                if row_id not in self.rows:
                    self.rows[row_id] = key
                    self.occurrences[row_id] = hop

    def _note(self, note_id: int, op_key: str | None, hop: int, drew_on: str) -> None:
        key = ("note", note_id)
        if key in self.found:
            return
        self.found[key] = Item("note", note_id, hop, drew_on)
        if key in self.keep:
            return  # what supersedes a kept note is not taken because of it
        self.notes[note_id] = op_key
        # newer versions of a note that goes are versions of it: they go too, at its hop
        for newer, newer_key in self.conn.execute(
            "SELECT id, op_key FROM note WHERE supersedes = ? ORDER BY id", (note_id,)
        ).fetchall():
            self._note(int(newer), newer_key, hop, f"note #{note_id}")

    def check_keep(self, candidates: dict[tuple[str, int], Item]) -> None:
        """Every kept item must be one the erasure would take (a newer version of a kept note
        is not taken because of it, but may be named too: it is kept, as asked)."""
        for kind, id_ in sorted(self.keep):
            if (kind, id_) in self.found:
                continue
            if (kind, id_) in candidates:
                self.found[(kind, id_)] = candidates[(kind, id_)]
                continue
            if kind == "reply" and id_ in self.own:
                raise CommandError(
                    f"reply:{id_} is one of the erasure's own rows (the {self.plan.kind} named): "
                    "only the replies and notes derived from them can be kept"
                )
            raise CommandError(
                f"{kind}:{id_} is not among the replies and notes this erasure removes "
                "(the preview lists them)"
            )
        for kind, id_ in sorted(self.keep):
            if kind != "note":
                continue
            raw = self.conn.execute("SELECT supersedes FROM note WHERE id = ?", (id_,)).fetchone()
            older = None if raw is None or raw[0] is None else int(raw[0])
            if older is not None and older in self.notes:
                raise CommandError(
                    f"note #{id_} supersedes note #{older}, which this erasure removes: keep "
                    f"both (--keep note:{older}) or neither"
                )

    def finish(self) -> ErasurePlan:
        plan, conn = self.plan, self.conn
        items = sorted(self.found.values(), key=lambda i: (i.hop, i.kind, i.id))
        items = [_with_words(conn, i) for i in items]
        plan.items = [i for i in items if (i.kind, i.id) not in self.keep]
        plan.kept = [i for i in items if (i.kind, i.id) in self.keep]
        plan.derived_ids = sorted(i.id for i in plan.items if i.kind == "reply" and not i.answers)
        plan.log_ids = sorted(self.rows)
        plan.log_keys = [self.rows[i] for i in plan.log_ids]
        plan.note_ids = sorted(self.notes)
        plan.note_keys = sorted(k for k in self.notes.values() if k)
        scheduled = sorted(self.scheduled.values(), key=lambda i: (i.hop, i.id))
        plan.scheduled = [_with_words(conn, i) for i in scheduled]
        plan.scheduled_ids = sorted(self.scheduled)
        plan.scheduled_keys = schedule_erasure.keys(conn, plan.scheduled_ids)
        plan.occurrences = dict(sorted(self.occurrences.items()))
        plan.tool_rows = dict(sorted(self.tools.items()))
        plan.fact_ids, plan.gap_ids = profile_erasure.affected(
            conn, [*plan.log_ids, *plan.subject_ids], plan.entities
        )
        return plan


_TEXT_OF = {"reply": "log", "note": "note", "scheduled": "scheduled"}


def _turn_of(sid: str) -> str:
    """The entry whose turn recorded the row ``sid``: a tool result's (``K/tool/N``) is ``K``."""
    return sid.split(TOOL_ROW, 1)[0]


def _with_words(conn: sqlite3.Connection, item: Item) -> Item:
    table = _TEXT_OF[item.kind]
    raw = conn.execute(f"SELECT text FROM {table} WHERE id = ?", (item.id,)).fetchone()  # noqa: S608
    every = str(raw[0] if raw else "").split()
    words = " ".join(every[:WORDS]) + (" …" if len(every) > WORDS else "")
    return Item(item.kind, item.id, item.hop, item.drew_on, words, item.answers)


# -- the target (hop 0) ---------------------------------------------------------------------------


Learned = list[tuple[str, list[Any], str]]  # notes learned from a target: SQL, params, drew on


def _target(conn: sqlite3.Connection, plan: ErasurePlan) -> tuple[Rows, Learned]:
    """The target's own rows, and the notes learned from it (SQL, params, what they drew on)."""
    rows: Rows = {}
    learned: Learned = []
    kind, target = plan.kind, plan.target
    if kind == "conversation":
        for id_, d, sid in conn.execute(
            f"SELECT id, direction, stream_id FROM log WHERE conversation = ? AND {NOT_ERASED}",  # noqa: S608
            (target,),
        ):
            rows[int(id_)] = (str(d), str(sid))
        learned.append(("source_conversation = ? OR chat = ?", [target, target],
                        f"conversation {target}"))  # fmt: skip
        _own_items(conn, plan, rows, schedule_erasure.of_conversation(conn, target))
    elif kind == "id":
        for row_id in _ids(target):
            raw = conn.execute(
                "SELECT direction, stream_id FROM log WHERE id = ?", (row_id,)
            ).fetchone()
            if raw is None:
                raise CommandError(f"there is no log row {row_id}")
            if conn.execute(
                f"SELECT 1 FROM log WHERE id = ? AND {NOT_ERASED}",  # noqa: S608
                (row_id,),
            ).fetchone():
                rows[row_id] = (str(raw[0]), str(raw[1]))
            _add_edits(conn, rows, row_id)
    else:
        plan.entities = _person(conn, target)
        _rows_of_person(conn, plan.entities, rows)
        for chunk in chunks(plan.entities):
            learned.append((f"source_entity IN ({marks(len(chunk))})", list(chunk),
                            f"entity {', '.join(plan.entities)}"))  # fmt: skip
        handles = {(h.channel, h.address) for e in plan.entities for h in handles_of(conn, e)}
        set_by = schedule_erasure.of_person(conn, plan.entities, handles)
        _own_items(conn, plan, rows, set_by)
    return rows, learned


def _own_items(conn: sqlite3.Connection, plan: ErasurePlan, rows: Rows, ids: list[int]) -> None:
    """The target's own scheduled items (hop 0), and their occurrences' rows among its rows."""
    drew_on = f"{plan.kind} {plan.target}"
    plan.scheduled = [Item("scheduled", i, 0, drew_on) for i in ids]
    for row_id, key in schedule_erasure.occurrence_rows(conn, ids).items():
        rows.setdefault(row_id, key)
        plan.occurrences[row_id] = 0


def _ids(target: str) -> list[int]:
    try:
        ids = [int(part) for part in target.split(",")]
    except ValueError:
        raise CommandError(f"not a log id: {target!r}") from None
    return sorted(set(ids))


def _add_edits(conn: sqlite3.Connection, rows: Rows, row_id: int) -> None:
    """The edits of a message (a platform's replacement: rows whose ``extra.edit_of`` names its
    event, in its conversation): they repeat its text, so they go with it."""
    sql = (
        "SELECT l.id, l.direction, l.stream_id FROM log AS l JOIN log AS o "  # noqa: S608
        "ON o.id = ? AND l.conversation = o.conversation AND o.event_id != '' "
        "WHERE json_valid(l.extra) AND json_extract(l.extra, '$.edit_of') = o.event_id "
        f"AND l.{NOT_ERASED}"
    )
    for id_, d, sid in conn.execute(sql, (row_id,)).fetchall():
        rows[int(id_)] = (str(d), str(sid))


def _person(conn: sqlite3.Connection, target: str) -> list[str]:
    try:
        entity = resolve_ref(conn, target)
    except LookupError as exc:
        raise CommandError(str(exc)) from None
    return sorted(person_of(conn, entity))


def _rows_of_person(conn: sqlite3.Connection, entities: list[str], rows: Rows) -> None:
    for chunk in chunks(entities):
        for id_, d, sid in conn.execute(
            # on the entity's index (+: never on the direction's, half the log)
            f"SELECT id, direction, stream_id FROM log WHERE +direction = 'in' "  # noqa: S608
            f"AND entity IN ({marks(len(chunk))}) AND {NOT_ERASED}",
            list(chunk),
        ):
            rows[int(id_)] = (str(d), str(sid))
    # rows recorded before senders had entities: matched by the person's handles
    handles = {(h.channel, h.address) for e in entities for h in handles_of(conn, e)}
    if not handles:
        return
    for id_, d, sid, channel, sender in conn.execute(
        f"SELECT id, direction, stream_id, channel, sender FROM log "  # noqa: S608
        f"WHERE entity IS NULL AND direction = 'in' AND {NOT_ERASED}"
    ):
        if (str(channel).strip().casefold(), str(sender).strip().casefold()) in handles:
            rows[int(id_)] = (str(d), str(sid))


def plan_notes(
    conn: sqlite3.Connection, plan: ErasurePlan, where: list[tuple[str, list[Any]]]
) -> None:
    """The notes matching ``where`` and their newer versions, as ``plan.note_ids`` (an import's
    replay of a tombstone: memory/importer.py)."""
    found: dict[int, str | None] = {}
    for sql, params in where:
        for id_, op_key in conn.execute(f"SELECT id, op_key FROM note WHERE {sql}", params):  # noqa: S608
            found[int(id_)] = op_key
    frontier = list(found)
    while frontier:  # notes that supersede a removed note are versions of it: removed too
        nxt: list[int] = []
        for chunk in chunks(frontier):
            for id_, op_key in conn.execute(
                f"SELECT id, op_key FROM note WHERE supersedes IN ({marks(len(chunk))})",  # noqa: S608
                list(chunk),
            ):
                if int(id_) not in found:
                    found[int(id_)] = op_key
                    nxt.append(int(id_))
        frontier = nxt
    plan.note_ids = sorted(found)
    plan.note_keys = sorted(k for k in found.values() if k)
