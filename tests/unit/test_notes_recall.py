"""The notes lookup of every turn (memory.notes.ContextRecall): picked by the message's specific
words, rarest first, so the notes ranked per turn stay within a budget however many notes there
are; counts cached until a note is written or removed; privacy as in every notes read."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.messages import Privacy
from memory import notes
from memory.erasure import erase
from memory.notes import ContextRecall, NoteDraft, Source, Viewer
from memory.privacy import Scope
from memory.store import MemoryStore

_n = itertools.count(1)
OWNER_VIEW = Viewer(scope=Scope("cli:home", Privacy.OWNER))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def put(store: MemoryStore, text: str, **fields: str) -> int:
    draft = NoteDraft.model_validate(
        {"text": text, "scope": "shared", "visibility": "public", **fields}
    )
    source = Source(op_key=f"t-{next(_n)}", author="owner", conversation="cli:home")
    with store.transaction():
        note, _ = notes.write_note(store, draft, source)
    return note.id


def ranked_queries(store: MemoryStore, run: object) -> list[str]:
    """The notes queries that rank (ORDER BY bm25) while ``run()`` runs."""
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        run()  # type: ignore[operator]
    finally:
        store.conn.set_trace_callback(None)
    return [s for s in seen if "bm25(note_fts" in s]


def test_common_words_are_left_out_and_the_specific_one_finds_its_note(
    store: MemoryStore,
) -> None:
    for i in range(notes.TERM_CAP + 30):
        put(store, f"meeting minutes number {i}: the budget meeting moved again")
    target = put(store, "the zanzibar meeting is on friday")
    recall = ContextRecall(store)
    assert recall.specific_words("When is the zanzibar meeting moved to?") == ["zanzibar"]
    lines = recall.lines("When is the zanzibar meeting moved to?", lambda: OWNER_VIEW)
    assert len(lines) == 1 and lines[0].startswith(f"#{target} ")
    # a message of common words only ranks nothing at all
    queries = ranked_queries(store, lambda: recall.lines("the meeting moved", lambda: OWNER_VIEW))
    assert queries == []


def test_rarest_words_first_within_the_budget(store: MemoryStore) -> None:
    sizes = {"alpha": 10, "bravo": 40, "charlie": 48}
    assert sum(sizes.values()) > notes.MATCH_BUDGET >= sizes["alpha"] + sizes["bravo"]
    for word, n in sizes.items():
        for i in range(n):
            put(store, f"{word} item {i}")
    words = ContextRecall(store).specific_words("charlie bravo alpha")
    assert words == ["alpha", "bravo"]  # charlie would take it over the budget


def test_the_notes_ranked_per_turn_stay_within_the_budget(store: MemoryStore) -> None:
    for i in range(400):  # many notes, every one sharing the message's words
        put(store, f"deploy release rollback checklist step {i}")
    recall = ContextRecall(store)
    queries = ranked_queries(
        store, lambda: recall.lines("deploy the release? rollback checklist", lambda: OWNER_VIEW)
    )
    assert queries == []  # every word is in more than TERM_CAP notes: none is specific
    matched = [
        store.conn.execute(
            "SELECT count(*) FROM note_fts WHERE note_fts MATCH ?", (f'"{w}"',)
        ).fetchone()[0]
        for w in recall.specific_words("deploy release rollback step 7 checklist 123")
    ]
    assert sum(matched) <= notes.MATCH_BUDGET


def test_counts_are_fresh_after_a_note_is_written_or_erased(store: MemoryStore) -> None:
    put(store, "something else entirely")
    recall = ContextRecall(store)
    assert recall.lines("any news on the kiwi harvest?", lambda: OWNER_VIEW) == []
    kiwi = put(store, "the kiwi harvest starts in may")
    got = recall.lines("any news on the kiwi harvest?", lambda: OWNER_VIEW)
    assert len(got) == 1 and got[0].startswith(f"#{kiwi} ")
    erase(
        store,
        kind="conversation",
        target="cli:home",
        reason="test",
        requested_by="owner",
        stream_id="5-0",
    )
    assert recall.lines("any news on the kiwi harvest?", lambda: OWNER_VIEW) == []


def test_what_a_conversation_may_not_see_is_not_shown(store: MemoryStore) -> None:
    put(store, "the wifi password is in the quokka drawer", scope="chat", visibility="internal",
        chat="cli:home")  # fmt: skip
    group = Viewer(scope=Scope("matrix:team", Privacy.GROUP))
    recall = ContextRecall(store)
    assert recall.lines("where is the quokka drawer?", lambda: group) == []
    assert len(recall.lines("where is the quokka drawer?", lambda: OWNER_VIEW)) == 1


def test_no_notes_costs_one_read_and_never_asks_for_the_viewer(store: MemoryStore) -> None:
    def no_viewer() -> Viewer:
        raise AssertionError("the viewer was not needed")

    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        assert ContextRecall(store).lines("anything at all", no_viewer) == []
    finally:
        store.conn.set_trace_callback(None)
    assert seen == ["SELECT max(id) FROM note"]
