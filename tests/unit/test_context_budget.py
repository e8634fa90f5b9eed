"""The context budget: prompt, MEMORY.md (owner only), relevant notes, recent history; the order in
which things are dropped; a bounded cost; and what the worker's turns put in front of the model."""

from __future__ import annotations

import calendar
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config, ConversationRole, MemoryConfig, WorkerConfig
from contract.messages import InboundMessage, Privacy
from memory import notes
from memory.context import HISTORY_HEADER, MESSAGE_OVERHEAD, build_context
from memory.lines import estimate_tokens, format_line
from memory.notes import NoteDraft, Source
from memory.privacy import Scope
from memory.rows import LogRow
from memory.sections import (
    CURATED_HEADER,
    CURATED_SHARE,
    NOTES_HEADER,
    NOTES_SHARE,
    CuratedSection,
    NotesSection,
)
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.tokens import count_tokens
from tests.support.worker import handle_entry
from worker.tools import default_tools
from worker.turn import Turns

PROMPT = "You are relaybot."
TS = float(calendar.timegm((2026, 11, 22, 10, 4, 0, 0, 0, 0)))
MEMORY = "# Memory\n- the owner drinks tea\n- the owner lives in Lisbon"
NOTE_LINES = [
    f"#{i} [fact / topic{i}] 2026-11-22 (shared, public): note number {i}" for i in range(6)
]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def said(store: MemoryStore, n: int, text: str, **kw: object) -> LogRow:
    base: dict[str, object] = dict(
        channel="cli", session="cli:home", conversation="cli:home", sender="ada",
        privacy=Privacy.OWNER, text=text, ts=TS + n, event_id=f"e{n}",
    )  # fmt: skip
    base.update(kw)
    msg = InboundMessage.model_validate(base)
    return store.append_inbound(msg, f"{n}-0", is_owner=msg.privacy is Privacy.OWNER)


def parts(system: str) -> tuple[str, list[str], list[str]]:
    """(MEMORY.md section text, note lines, history lines) of a system message."""
    body = system.removeprefix(PROMPT)
    body, _, history = body.partition(HISTORY_HEADER)
    memory, found = body, ""
    if NOTES_HEADER in body:
        memory, _, found = body.partition(NOTES_HEADER)
    return (
        memory.removeprefix(CURATED_HEADER),
        found.split("\n") if found else [],
        history.split("\n") if history else [],
    )


def test_history_gives_way_oldest_first_while_memory_and_notes_stay(store: MemoryStore) -> None:
    """At a fixed budget, more history only pushes older history out: MEMORY.md and the notes
    (within their shares) stay whole, and the kept history is the newest, as much as fits."""
    budget = 900
    rows: list[LogRow] = []
    for n in range(0, 200, 20):
        rows += [said(store, i, f"message {i} " + "blah " * (i % 5)) for i in range(n, n + 20)]
        current = said(store, 1000 + n, "and now?")
        history = store.recent(500)
        messages = build_context(
            system_prompt=PROMPT, history=history, current=current, budget_tokens=budget,
            assistant_name="relaybot", sections=[CuratedSection(MEMORY), NotesSection(NOTE_LINES)],
        )  # fmt: skip
        assert count_tokens(messages) <= budget
        memory, found, kept = parts(messages[0]["content"])
        assert memory == MEMORY
        assert found == NOTE_LINES
        older = [format_line(r, "relaybot") for r in history if r.id != current.id]
        older.reverse()  # oldest first, like the context
        assert kept == older[len(older) - len(kept) :]  # the newest ones
        if len(kept) < len(older):  # and the next older one would not have fitted
            fixed = count_tokens(
                build_context(
                    system_prompt=PROMPT, history=[], current=current, budget_tokens=0,
                    assistant_name="relaybot",
                )
            )  # fmt: skip
            used = (
                fixed
                + estimate_tokens(CURATED_HEADER + MEMORY)
                + estimate_tokens(NOTES_HEADER + "\n".join(NOTE_LINES))
                + sum(estimate_tokens(line) + 1 for line in kept)
            )
            assert used <= budget
            assert used + estimate_tokens(older[-len(kept) - 1]) + 1 > budget
    assert 0 < len(kept) < len(rows)


def test_budget_invariants_at_every_budget(store: MemoryStore) -> None:
    rows = [said(store, i, f"message {i} " + "blah " * (i % 5)) for i in range(40)]
    current = said(store, 99, "and now?")
    history = store.recent(100)
    lines = [format_line(r, "relaybot") for r in rows]
    fixed = count_tokens(
        build_context(
            system_prompt=PROMPT, history=[], current=current, budget_tokens=0,
            assistant_name="relaybot",
        )
    )  # fmt: skip
    memory_cost = estimate_tokens(CURATED_HEADER + MEMORY)
    notes_cost = estimate_tokens(NOTES_HEADER) + sum(estimate_tokens(n) + 1 for n in NOTE_LINES)
    states: set[tuple[bool, int, int]] = set()
    for budget in range(fixed - 5, fixed + 2000, 3):
        messages = build_context(
            system_prompt=PROMPT, history=history, current=current, budget_tokens=budget,
            assistant_name="relaybot", sections=[CuratedSection(MEMORY), NotesSection(NOTE_LINES)],
        )  # fmt: skip
        assert count_tokens(messages) <= max(budget, fixed)
        assert messages[0]["content"].startswith(PROMPT)  # never dropped
        assert messages[1]["content"] == format_line(current, "relaybot")  # never dropped
        memory, found, kept = parts(messages[0]["content"])
        assert kept == lines[len(lines) - len(kept) :]  # oldest history dropped first
        assert found == NOTE_LINES[: len(found)]  # least relevant notes dropped first
        room = budget - fixed
        whole = memory == MEMORY
        assert whole or memory_cost > int(room * CURATED_SHARE)  # cut only beyond its share
        assert found == NOTE_LINES or notes_cost > int(room * NOTES_SHARE)
        if not whole and memory:
            assert memory.endswith("characters in all]")  # a cut MEMORY.md says so
        states.add((whole, len(found), len(kept)))
    assert (True, len(NOTE_LINES), len(lines)) in states  # a large budget keeps everything
    assert any(m and f == len(NOTE_LINES) and 0 < k < len(lines) for m, f, k in states)
    assert (False, 0, 0) in states  # and a tiny one only the prompt and the message


def test_a_huge_memory_md_is_cut_with_a_note_and_leaves_room_for_history(
    store: MemoryStore,
) -> None:
    for i in range(30):
        said(store, i, f"message {i}")
    current = said(store, 99, "hi")
    huge = "# Memory\n" + "".join(f"- fact number {i}\n" for i in range(5000))
    budget = 2000
    messages = build_context(
        system_prompt=PROMPT, history=store.recent(100), current=current, budget_tokens=budget,
        assistant_name="relaybot", sections=[CuratedSection(huge), NotesSection(NOTE_LINES)],
    )  # fmt: skip
    assert count_tokens(messages) <= budget
    memory, found, kept = parts(messages[0]["content"])
    assert memory.startswith("# Memory\n- fact number 0\n")
    assert memory.endswith(f"[... MEMORY.md is cut here to fit the context: {len(huge) - 1} "
                           "characters in all]")  # fmt: skip
    assert "\n- fact number 4999" not in memory
    assert estimate_tokens(CURATED_HEADER + memory) <= budget * CURATED_SHARE
    assert found == NOTE_LINES
    assert len(kept) == 30  # history still gets its room


def test_prompt_and_current_message_go_in_even_over_budget(store: MemoryStore) -> None:
    current = said(store, 1, "x" * 4000)
    messages = build_context(
        system_prompt=PROMPT, history=[], current=current, budget_tokens=10,
        assistant_name="relaybot", sections=[CuratedSection(MEMORY), NotesSection(NOTE_LINES)],
    )  # fmt: skip
    assert messages[0]["content"] == PROMPT + HISTORY_HEADER
    assert messages[1]["content"].endswith("x" * 4000)
    assert (
        count_tokens(messages)
        == estimate_tokens(PROMPT + HISTORY_HEADER)
        + estimate_tokens(messages[1]["content"])
        + 2 * MESSAGE_OVERHEAD
    )


# -- what the worker puts in front of the model -------------------------------------------------


class Rig:
    def __init__(self, tmp_path: Path, store: MemoryStore) -> None:
        self.workspace = tmp_path / "workspace"
        self.cfg = Config(
            home=tmp_path,
            memory=MemoryConfig(workspace=self.workspace),
            worker=WorkerConfig(context_tokens=4000),
            roles={
                "matrix:team": ConversationRole(role="pm"),
                "cli:pm": ConversationRole(role="pm"),
            },
        )
        self.store = store
        self.model = InstantModel()
        self.turns = Turns(self.cfg, store, self.model, default_tools())
        self.n = 0

    def system(self, text: str, conversation: str = "cli:home", **kw: object) -> str:
        """Run one turn; the system message the model got."""
        self.n += 1
        base: dict[str, object] = dict(
            channel=conversation.split(":", 1)[0], session=conversation,
            conversation=conversation, sender="ada", privacy=Privacy.OWNER, text=text,
            ts=TS + self.n, event_id=f"e{self.n}",
        )  # fmt: skip
        base.update(kw)
        msg = InboundMessage.model_validate(base)
        with self.store.transaction():
            outcome = handle_entry(self.turns, f"{self.n}-0", msg.to_fields())
        assert outcome.reply is not None
        return str(self.model.seen[-1][0]["content"])

    def note(self, text: str, **fields: object) -> None:
        draft = NoteDraft.model_validate({"text": text, **fields})
        source_conversation = fields.get("chat", "cli:home")
        src = Source(
            op_key=f"n-{text}",
            conversation=str(source_conversation),
            privacy="owner",
            entity="owner",
        )
        with self.store.transaction():
            notes.write_note(self.store, draft, src)


def test_owner_turns_get_memory_md_and_relevant_notes_others_do_not(
    tmp_path: Path, store: MemoryStore
) -> None:
    rig = Rig(tmp_path, store)
    rig.workspace.mkdir()
    (rig.workspace / "MEMORY.md").write_text("- the owner's PIN hint is 'blue'\n")
    rig.note("we deploy with ansible", topic="deploy", scope="shared", visibility="public")
    rig.note("deploy keys are in the owner's vault", topic="deploy", scope="chat",
             chat="cli:home", visibility="internal")  # fmt: skip
    rig.note("pm: deploy freeze in December", scope="agent", role="pm", visibility="public")
    rig.note("an unrelated fact about cats", scope="shared", visibility="public")

    owner = rig.system("how do we deploy?")
    assert "the owner's PIN hint is 'blue'" in owner
    assert CURATED_HEADER in owner
    assert "we deploy with ansible" in owner
    assert "deploy keys are in the owner's vault" in owner
    assert "deploy freeze" in owner  # the owner's own conversations see every note
    assert "cats" not in owner  # not relevant to the message

    group = rig.system("how do we deploy?", "matrix:team", privacy=Privacy.GROUP, sender="@bob:x")
    assert "PIN hint" not in group
    assert CURATED_HEADER not in group
    assert "we deploy with ansible" in group  # public knowledge
    # a public role note from the owner reaches conversations running as that role (this room
    # runs as pm: [roles] below)
    assert "deploy freeze" in group
    assert "vault" not in group  # the owner's chat note stays there

    pm = rig.system("deploy plans?", "cli:pm")  # another owner conversation, running as pm
    assert "pm: deploy freeze in December" in pm
    assert "we deploy with ansible" in pm
    assert "vault" in pm  # the owner's own conversations see every note
    assert "PIN hint" in pm

    direct = rig.system("deploy?", "matrix:dm", privacy=Privacy.DIRECT, sender="@carol:x")
    assert "PIN hint" not in direct
    assert "vault" not in direct
    assert "freeze" not in direct


def test_a_memory_failure_leaves_the_turn_answered(
    tmp_path: Path, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, store)
    rig.note("we deploy with ansible", scope="shared", visibility="public")

    def broken(*_a: object, **_k: object) -> list[str]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(notes.ContextRecall, "lines", broken)
    rig.turns.memory.curated.path = tmp_path / "no" / "such" / "MEMORY.md"
    system = rig.system("deploy?")
    assert "ansible" not in system
    assert CURATED_HEADER not in system
    assert rig.turns.memory_failures == 1


def test_notes_lookup_uses_the_indexes_only(store: MemoryStore) -> None:
    """The cost of finding notes for a turn does not grow with the log or the notes: a
    primary-key read, word counts that stop at TERM_CAP + 1 (memory.notes.ContextRecall), then
    one FTS match over the specific words with primary-key lookups, the supersedes index and
    LIMIT."""
    notes.write_note(
        store,
        NoteDraft(text="we deploy with ansible", scope="shared", visibility="public"),
        Source(op_key="n1", author="owner"),
    )
    statements: list[str] = []
    viewer = notes.Viewer(scope=Scope("matrix:g", Privacy.GROUP), role="pm")
    store.conn.set_trace_callback(statements.append)
    try:
        notes.context_lines(store, viewer, "how do we deploy the new release?")
    finally:
        store.conn.set_trace_callback(None)
    selects = [s for s in statements if s.startswith("SELECT")]
    assert selects[0] == "SELECT max(id) FROM note"
    counts = selects[1:-1]
    assert counts and all(s.endswith(f"LIMIT {notes.TERM_CAP + 1})") for s in counts), counts
    ranked = selects[-1]
    assert ranked.endswith(f"LIMIT {notes.CONTEXT_NOTES}")
    plan = [row[3] for row in store.conn.execute("EXPLAIN QUERY PLAN " + ranked)]
    assert any("note_fts VIRTUAL TABLE INDEX" in step for step in plan), plan
    scans = [step for step in plan if step.startswith("SCAN") and "note_fts" not in step]
    assert scans == [], plan
